"""What a vLLM tree can do, and the one rule that turns it into a regime.

``Capabilities`` is found by introspecting a tree's code (the worker does it,
``subjects/vllm_side/introspection.py``), never by its version string: a PR branch or a
checkout between releases has no trustworthy version.  Everything kvspec
derives from a tree's era -- the regime the oracle predicts, the dimensions
the strategies generate, the inputs the symbolic harness admits, the rule a
history row names -- is derived here, from one value, by one rule.
"""

from __future__ import annotations

from typing import Any

import attrs

from .domain import CoordinatorConfig, derive_partial_hash_hits

__all__ = ["Capabilities", "ExpectedRegime", "expected_regime", "FLAGS", "ERAS", "known_capabilities",
           "reference_capabilities"]


def _keywords(value: Any) -> tuple[str, ...]:
    return tuple(sorted(value or ()))


@attrs.frozen
class Capabilities:
    """Introspected facts about one tree; the defaults are the newest era's."""

    # A HybridKVCacheCoordinator exists (0.18+).
    hybrid_coordinator: bool = True
    # KVCacheManager takes scheduler_block_size (0.23+): the rule kvspec models.
    scheduler_block_size: bool = True
    # The coordinator has enable_partial_hash_hits (0.26+).
    partial_hash_hits: bool = True
    # Group managers say whether they look up inside their block, and partial
    # hits turn off when one cannot (0.28+).
    fine_grained_lookup_fallback: bool = True
    # KVCacheManager takes num_prefill_lookahead: reprefillable tokens (0.28+).
    reprefillable_tokens: bool = True
    # KVCacheGroupSpec has is_eagle_group (0.23+); before, use_eagle made every group EAGLE.
    per_group_eagle: bool = True
    # The rule lives in HybridKVCacheCoordinator.get_num_cacheable_tokens (0.32+).
    get_num_cacheable_tokens: bool = True
    # KVCacheManager takes num_hash_lookahead_tokens: lookahead block hashes (0.33+).
    lookahead_block_hashes: bool = True
    # Partial hash hits also under DCP > 1, with the Mamba block equal to the
    # hash block (0.29+; 0.26-0.28 turned them off whenever dcp_world_size > 1).
    dcp_partial_hash_hits: bool = True
    # Deployment features kvspec's differential does not drive (not_covered):
    # a prefix-cache retention interval (an environment variable up to 0.29,
    # KVCacheConfig.prefix_cache_retention_interval from 0.29), replay
    # boundaries handed to every group's cache_blocks (0.30+), groups that opt
    # out of prefix caching (KVCacheSpec.prefix_cacheable, 0.29+).
    retention_interval: bool = True
    replay_boundaries: bool = True
    per_group_caching: bool = True
    # The keyword names of KVCacheManager.__init__ and Request.__init__.
    manager_keywords: tuple[str, ...] = attrs.field(default=(), converter=_keywords)
    request_keywords: tuple[str, ...] = attrs.field(default=(), converter=_keywords)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Capabilities":
        """From the worker's report (or a stored result); other keys are ignored."""
        names = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(self).items()}

    def unsupported_reason(self) -> str | None:
        """Why kvspec cannot model this tree at all, or None."""
        if not self.hybrid_coordinator:
            return "it has no HybridKVCacheCoordinator"
        if not self.scheduler_block_size:
            return ("KVCacheManager takes no scheduler_block_size (added in 0.23): "
                    "its registration rule predates the one kvspec models")
        return None

    def rule_text(self) -> str:
        """The spec's rule for this era, in words."""
        if not self.partial_hash_hits:
            return "floor to S; EAGLE min(n, floor(n/S)*S + B)"
        rule = "partial hits: no rounding; EAGLE min(f, aligned(f) + B)"
        rule += ", f = n - max(0, L - 1)" if self.reprefillable_tokens else ", f = n"
        if self.get_num_cacheable_tokens:
            rule += " (in get_num_cacheable_tokens)"
        return rule

    def era_restrictions(self) -> tuple[str, ...]:
        """Inputs this era cannot express, in words (empty for the newest)."""
        out = []
        if not self.partial_hash_hits:
            out.append("no partial hash hits (this release has none)")
        if not self.reprefillable_tokens:
            out.append("num_prefill_lookahead <= 1 (this release has no reprefillable tokens)")
        return tuple(out)

    def not_covered(self) -> tuple[str, ...]:
        """What this release can do that kvspec's differential does not drive,
        in words: every verdict on such a release lists them."""
        out = []
        if self.dcp_partial_hash_hits:
            out.append("DCP > 1: partial hash hits with the Mamba block equal to the hash block are in the "
                       "model's regime rule, but no DCP > 1 configuration is driven through vLLM")
        if self.retention_interval:
            out.append("the prefix-cache retention interval: the registration differential builds KVCacheConfig "
                       "by hand (its field default: dense, every boundary retained), which no default deployment "
                       "runs from 0.30.0 (CacheConfig default 0, sparse); the engine differential runs the "
                       "release's default or a drawn interval and holds resend and sibling hits to what retention "
                       "keeps (retention_hit, a lower bound)")
        if self.replay_boundaries:
            out.append("replay boundaries handed to cache_blocks: the bound each group receives is compared, "
                       "not which replay boundaries a group keeps")
        if self.per_group_caching:
            out.append("groups that opt out of prefix caching (KVCacheSpec.prefix_cacheable): every group "
                       "kvspec builds is cacheable")
        return tuple(out)

    def missing(self, reference: "Capabilities") -> tuple[str, ...]:
        """Flags ``reference`` has and this tree lacks: dimensions kvspec
        would not generate here (a renamed keyword looks exactly like this)."""
        return tuple(name for name in FLAGS if getattr(reference, name) and not getattr(self, name))


# The boolean facts, in the order reports list them.
FLAGS = tuple(f.name for f in attrs.fields(Capabilities) if f.type in (bool, "bool"))


@attrs.frozen
class ExpectedRegime:
    """What the spec says the coordinator must choose for a configuration."""

    partial_hash_hits: bool
    eagle: tuple[bool, ...]
    num_prefill_lookahead: int
    # Tokens past each block its hash covers (0: legacy hashes).
    num_hash_lookahead_tokens: int = 0

    @property
    def eagle_branch_live(self) -> bool:
        """Whether any group takes the EAGLE branch of the registration bound."""
        return any(self.eagle)

    @property
    def hash_scheme(self) -> str:
        return "lookahead" if self.num_hash_lookahead_tokens else "legacy"


def expected_regime(config: CoordinatorConfig, capabilities: Capabilities) -> ExpectedRegime:
    """The regime, derived from the configuration and the era alone (never
    adopted from the subject's own flags: a difference is a finding)."""
    partial = capabilities.partial_hash_hits and derive_partial_hash_hits(
        config, require_fine_grained_lookups=capabilities.fine_grained_lookup_fallback,
        dcp_partial=capabilities.dcp_partial_hash_hits)
    # Lookahead block hashes replace the EAGLE drop (the scheduler builds the
    # manager with use_eagle=False): config.effective_eagle is all off then.
    hash_lookahead = config.num_hash_lookahead_tokens if capabilities.lookahead_block_hashes else 0
    if capabilities.per_group_eagle or not config.eagle_drop:
        eagle = config.effective_eagle
    else:  # one global use_eagle flag: every group is EAGLE
        eagle = tuple(config.any_eagle for _ in config.groups)
    lookahead = config.num_prefill_lookahead if capabilities.reprefillable_tokens else 0
    return ExpectedRegime(partial, eagle, lookahead, hash_lookahead)


# What each published release's code holds, as introspected (``kvspec
# history`` prints it): a tree that says it is one of these releases is held
# to that era, so a renamed keyword cannot quietly shrink what is fuzzed.
_BEFORE_029 = dict(dcp_partial_hash_hits=False, replay_boundaries=False, per_group_caching=False)
ERAS: tuple[tuple[str, str, Capabilities], ...] = (
    ("0.23.0", "0.25.1", Capabilities(partial_hash_hits=False, fine_grained_lookup_fallback=False,
                                      reprefillable_tokens=False, get_num_cacheable_tokens=False,
                                      lookahead_block_hashes=False, **_BEFORE_029)),
    ("0.26.0", "0.27.1", Capabilities(reprefillable_tokens=False, get_num_cacheable_tokens=False,
                                      lookahead_block_hashes=False, **_BEFORE_029)),
    ("0.28.0", "0.28.0", Capabilities(get_num_cacheable_tokens=False, lookahead_block_hashes=False,
                                      **_BEFORE_029)),
    ("0.29.0", "0.29.0", Capabilities(get_num_cacheable_tokens=False, lookahead_block_hashes=False,
                                      replay_boundaries=False)),
    ("0.30.0", "0.31.0", Capabilities(get_num_cacheable_tokens=False, lookahead_block_hashes=False)),
    ("0.32.0", "0.32.0", Capabilities(lookahead_block_hashes=False)),
    ("0.33.0", "0.34.0", Capabilities()),
)


def known_capabilities(version: str) -> Capabilities | None:
    """The era's capabilities of release ``version`` (a final release number
    from 0.23.0 on; a newer one than kvspec has seen is held to the newest
    era), or None for anything else."""
    from .about import release_key

    try:
        key = release_key(version)
    except ValueError:
        return None
    if len(key) != 3 or key < release_key(ERAS[0][0]):
        return None
    for low, high, capabilities in ERAS:
        if release_key(low) <= key <= release_key(high):
            return capabilities
    return ERAS[-1][2] if key > release_key(ERAS[-1][1]) else None


def reference_capabilities(version: str | None) -> tuple[Capabilities, str]:
    """What a tree that reports ``version`` should be able to do, and whose
    era that is in words: its release's era, the newest era for a version
    newer than any kvspec knows, or (a checkout's own version string may be
    anything) the newest era when the version says nothing."""
    import re

    from .about import release_key

    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", version or "")
    if match:
        number = ".".join(match.groups())
        known = known_capabilities(number)
        if known is not None:
            newest = release_key(number) > release_key(ERAS[-1][1])
            return known, (f"the newest release kvspec knows ({ERAS[-1][1]})" if newest
                           else f"vLLM {number}")
    return ERAS[-1][2], f"the newest release kvspec knows ({ERAS[-1][1]}; the tree's version {version!r} " \
                        "names no release)"
