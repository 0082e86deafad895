"""The domain: KV-cache groups, a coordinator configuration, registration results.

Frozen attrs value objects.  Validators mirror the preconditions vLLM's own
coordinator asserts (so kvspec never reasons about a geometry vLLM rejects),
and a violation raises ``InvalidGeometry`` naming the field, the rule and the
value.  The partial-hash-hits regime and the reprefillable-token count are
*derived* here from the configuration, by the rule vLLM documents, never
passed in by hand.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from .errors import InputError

__all__ = [
    "GroupKind",
    "KVCacheGroup",
    "CoordinatorConfig",
    "GroupRegistration",
    "InvalidGeometry",
    "derive_partial_hash_hits",
    "HashScheme",
]


class InvalidGeometry(InputError, ValueError):
    """A configuration vLLM itself would reject; says which rule and value."""

    def __init__(self, field: str, rule: str, value: Any):
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"invalid {field}={value!r}: {rule}")


class HashScheme(str, enum.Enum):
    """How the request's block hashes are computed, and so whether the EAGLE
    drop runs (vLLM's scheduler decides; ``CoordinatorConfig`` derives it).

    ``legacy``: each hash covers its block; an EAGLE group drops its last
    matched block on lookup and registers one block past the aligned boundary
    (the EAGLE branch of the registration bound).  Every release before 0.33;
    0.33+ with a KV connector (0.34: one without lookahead-hash support) or
    ``disable_lookahead_block_hashes``.
    ``lookahead``: each hash also covers the next ``num_prefill_lookahead``
    tokens (``num_hash_lookahead_tokens``), so no drop is needed and the
    scheduler builds ``KVCacheManager(use_eagle=False)``: the EAGLE branch is
    not live.  0.33+'s default for EAGLE-family drafters with prefix caching.
    """

    LEGACY = "legacy"
    LOOKAHEAD = "lookahead"


def _hash_scheme(value: Any) -> HashScheme:
    try:
        return HashScheme(value)
    except ValueError:
        raise InvalidGeometry("hash_scheme", "must be legacy or lookahead", value) from None


class GroupKind(str, enum.Enum):
    FULL_ATTENTION = "full_attention"
    SLIDING_WINDOW = "sliding_window"
    MAMBA_ALIGN = "mamba_align"  # Mamba with mamba_cache_mode="align"

    @property
    def fine_grained_lookup(self) -> bool:
        """Whether vLLM's manager for this kind can hit inside its block
        (``supports_fine_grained_hash_lookup``): full attention and Mamba can,
        sliding window cannot."""
        return self is not GroupKind.SLIDING_WINDOW


# Sizes above this are outside the model's domain (real pages are at most a
# few thousand tokens): a configuration read from a file cannot ask a worker
# for an absurd pool.
MAX_SIZE = 1 << 16


def _positive(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidGeometry(attribute.name, "must be a positive integer", value)
    if value > MAX_SIZE:
        raise InvalidGeometry(attribute.name, f"must be at most {MAX_SIZE}", value)


def _non_negative(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidGeometry(attribute.name, "must be a non-negative integer", value)
    if value > MAX_SIZE:
        raise InvalidGeometry(attribute.name, f"must be at most {MAX_SIZE}", value)


def _is_bool(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidGeometry(attribute.name, "must be True or False", value)


def _kind(value: Any) -> GroupKind:
    try:
        return GroupKind(value)
    except ValueError:
        choices = ", ".join(k.value for k in GroupKind)
        raise InvalidGeometry("kind", f"must be one of {choices}", value) from None


@attrs.frozen
class KVCacheGroup:
    """One KV-cache group as the coordinator sees it."""

    kind: GroupKind = attrs.field(converter=_kind)
    block_size: int = attrs.field(validator=_positive)
    eagle: bool = attrs.field(default=False, validator=_is_bool)
    # Only meaningful for sliding-window groups (vLLM's SlidingWindowSpec).
    sliding_window: int = attrs.field(default=0, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        if self.kind is GroupKind.SLIDING_WINDOW and self.sliding_window < 1:
            raise InvalidGeometry(
                "sliding_window", "a sliding-window group needs a window >= 1", self.sliding_window
            )
        if self.kind is not GroupKind.SLIDING_WINDOW and self.sliding_window:
            raise InvalidGeometry(
                "sliding_window", f"only sliding-window groups have a window (kind={self.kind.value})",
                self.sliding_window,
            )

    def label(self) -> str:
        flag = ", EAGLE" if self.eagle else ""
        window = f", window {self.sliding_window}" if self.sliding_window else ""
        return f"{self.kind.value}(block {self.block_size}{window}{flag})"


def _groups(value: Any) -> tuple[KVCacheGroup, ...]:
    return tuple(value)


@attrs.frozen
class CoordinatorConfig:
    """What vLLM's KV-cache coordinator is built from, in vLLM's names:
    ``HybridKVCacheCoordinator`` for two groups or more (the registration
    boundary kvspec is about), the unitary one for a single group (driven by
    the stateful differential only)."""

    groups: tuple[KVCacheGroup, ...] = attrs.field(converter=_groups)
    scheduler_block_size: int = attrs.field(validator=_positive)
    hash_block_size: int = attrs.field(validator=_positive)
    enable_caching: bool = attrs.field(default=True, validator=_is_bool)
    num_prefill_lookahead: int = attrs.field(default=0, validator=_non_negative)
    dcp_world_size: int = attrs.field(default=1, validator=_positive)
    allow_partial_hash_hits: bool = attrs.field(default=True, validator=_is_bool)
    hash_scheme: HashScheme = attrs.field(default=HashScheme.LEGACY, converter=_hash_scheme)

    def __attrs_post_init__(self) -> None:
        S, H = self.scheduler_block_size, self.hash_block_size
        if not self.groups:
            raise InvalidGeometry("groups", "a KV-cache configuration needs at least one group", 0)
        for group in self.groups:
            if not isinstance(group, KVCacheGroup):
                raise InvalidGeometry("groups", "every group must be a KVCacheGroup", group)
        if S % H:
            raise InvalidGeometry(
                "scheduler_block_size", f"must be a multiple of hash_block_size (={H})", S
            )
        for i, group in enumerate(self.groups):
            if S % group.block_size:
                raise InvalidGeometry(
                    f"groups[{i}].block_size",
                    f"must divide scheduler_block_size (={S})",
                    group.block_size,
                )
            if group.block_size % H:
                raise InvalidGeometry(
                    f"groups[{i}].block_size",
                    f"a cacheable block must be a multiple of hash_block_size (={H})",
                    group.block_size,
                )
        if self.enable_caching and self.any_eagle and S < self.num_prefill_lookahead:
            raise InvalidGeometry(
                "num_prefill_lookahead",
                f"prefix caching with EAGLE needs scheduler_block_size (={S}) >= "
                "num_prefill_lookahead",
                self.num_prefill_lookahead,
            )

    @property
    def hybrid(self) -> bool:
        """Served by ``HybridKVCacheCoordinator``: two groups or more, as vLLM
        decides (one group gets the unitary coordinator, whose registration
        has no boundary between groups)."""
        return len(self.groups) >= 2

    @property
    def any_eagle(self) -> bool:
        return any(g.eagle for g in self.groups)

    @property
    def num_hash_lookahead_tokens(self) -> int:
        """``num_hash_lookahead_tokens`` as vLLM's configuration derives it:
        under lookahead hashes, with prefix caching and an EAGLE-family
        drafter, the prefill lookahead (at least 1: every EAGLE-family method
        has one, ``VllmConfig.num_prefill_lookahead_tokens``; kvspec's small
        scope lets 0 stand for it); 0 otherwise."""
        if self.hash_scheme is HashScheme.LOOKAHEAD and self.enable_caching and self.any_eagle:
            return max(1, self.num_prefill_lookahead)
        return 0

    @property
    def eagle_drop(self) -> bool:
        """Whether the scheduler builds the manager with ``use_eagle=True``
        (the EAGLE drop, and the EAGLE branch of the registration bound, are
        live): an EAGLE group and no lookahead hashes."""
        return self.any_eagle and not self.num_hash_lookahead_tokens

    @property
    def num_reprefillable_tokens(self) -> int:
        """Tokens multi-module MTP may prefill again: ``max(0, lookahead - 1)``."""
        return max(0, self.num_prefill_lookahead - 1)

    @property
    def partial_hash_hits(self) -> bool:
        """vLLM's ``enable_partial_hash_hits``, by its documented rule (0.28+)."""
        return derive_partial_hash_hits(self)

    @property
    def effective_eagle(self) -> tuple[bool, ...]:
        """Per-group EAGLE flag as the coordinator applies it.

        vLLM merges groups with an identical spec for lookup and gives the
        merged group the EAGLE bit if any member has it, so an unflagged twin of
        an EAGLE group is treated as EAGLE too.  Under lookahead hashes no
        group drops (``eagle_drop``): the groups stay flagged in vLLM, but the
        manager is built with ``use_eagle=False``, so every flag here is off.
        """
        if not self.eagle_drop:
            return tuple(False for _ in self.groups)
        flagged = {(g.kind, g.block_size, g.sliding_window) for g in self.groups if g.eagle}
        return tuple((g.kind, g.block_size, g.sliding_window) in flagged for g in self.groups)

    def describe(self) -> str:
        groups = ", ".join(g.label() for g in self.groups)
        hashes = " hashes=lookahead" if self.hash_scheme is HashScheme.LOOKAHEAD else ""
        return (
            f"S={self.scheduler_block_size} H={self.hash_block_size} "
            f"lookahead={self.num_prefill_lookahead} dcp={self.dcp_world_size} "
            f"caching={'on' if self.enable_caching else 'off'}{hashes} [{groups}]"
        )


def derive_partial_hash_hits(
    config: CoordinatorConfig, *, require_fine_grained_lookups: bool = True, dcp_partial: bool = True
) -> bool:
    """Whether fine-grained (sub-block) prefix-cache hits are on.

    They need prefix caching, the switch on, a Mamba "align" group whose block
    is coarser than the hash block (or equal to it under DCP, from 0.29:
    ``dcp_partial``; 0.26-0.28 had none under DCP), and -- from 0.28,
    ``require_fine_grained_lookups`` -- every other group able to look up
    inside its block (full attention, Mamba) or with a block equal to the hash
    block; 0.26-0.27 did not have that last fallback.
    """
    H, dcp = config.hash_block_size, config.dcp_world_size
    if not (config.enable_caching and config.allow_partial_hash_hits):
        return False
    if dcp > 1 and not dcp_partial:
        return False
    has_aligned_mamba = any(
        g.kind is GroupKind.MAMBA_ALIGN and (g.block_size > H if dcp == 1 else g.block_size >= H)
        for g in config.groups
    )
    lookups_compatible = all(g.kind.fine_grained_lookup or g.block_size == H for g in config.groups)
    return has_aligned_mamba and (lookups_compatible or not require_fine_grained_lookups)


@attrs.frozen
class GroupRegistration:
    """What one group registers at one ``cache_blocks`` call, with its derivation."""

    group: int
    tokens_to_cache: int
    registered_full_blocks: int
    eagle: bool
    # The derivation (None when the rule's steps are not known):
    cached: int | None = None  # the boundary for every group: _align_cacheable(n)
    finalized: int | None = None  # max(0, n - reprefillable)
    aligned_finalized: int | None = None  # _align_cacheable(finalized)
    eagle_bound: int | None = None  # min(finalized, aligned_finalized + block_size)
    eagle_branch: bool | None = None  # use_eagle and cached > 0

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)
