"""A differential example: a configuration and the steps a request takes.

Plain values in vLLM's vocabulary; how one is sent to a worker is the
subject side's business (``subjects/protocol.py``)."""

from __future__ import annotations

from typing import Any

import attrs

from .domain import CoordinatorConfig, GroupKind, HashScheme, KVCacheGroup
from .errors import InputError

__all__ = ["Step", "Case", "LookupProbe", "InvalidCase", "prefill", "decode", "MAX_TOKENS", "MAX_STEPS",
           "MAX_DRAFTS"]

# The model's domain for one request: generous for any real prompt kvspec
# drives, and small enough that no input file can make a worker allocate
# without bound (a pool is sized from these).
MAX_TOKENS = 1 << 16
MAX_STEPS = 4096
MAX_DRAFTS = 64


class InvalidCase(InputError, ValueError):
    """A request kvspec's model does not describe (outside its domain)."""


def _count(limit: int):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise InvalidCase(f"{attribute.name} must be a whole number from 0 to {limit}, got {value!r}")
    return check


@attrs.frozen
class Step:
    kind: str  # "prefill" (a chunk of the prompt) or "decode" (1 token + drafts)
    tokens: int = attrs.field(default=0, validator=_count(MAX_TOKENS))  # prefill: prompt tokens in this chunk
    drafts: int = attrs.field(default=0, validator=_count(MAX_DRAFTS))  # decode: speculative tokens proposed
    accepted: int = attrs.field(default=0, validator=_count(MAX_DRAFTS))  # decode: drafts accepted

    def __attrs_post_init__(self) -> None:
        if self.kind not in ("prefill", "decode"):
            raise InvalidCase(f"step kind must be prefill or decode, got {self.kind!r}")
        if not 0 <= self.accepted <= self.drafts:
            raise InvalidCase(f"need 0 <= accepted <= drafts, got {self.accepted}/{self.drafts}")

    def label(self) -> str:
        if self.kind == "prefill":
            return f"prefill {self.tokens}"
        return f"decode +{self.drafts} drafts, {self.accepted} accepted" if self.drafts else "decode"


def prefill(tokens: int) -> Step:
    return Step("prefill", tokens=tokens)


def decode(drafts: int = 0, accepted: int = 0) -> Step:
    return Step("decode", drafts=drafts, accepted=accepted)


@attrs.frozen
class LookupProbe:
    """A later request that looks up after the writer's steps: its first
    ``shared`` tokens are the writer's (prompt and output), then ``extra``
    tokens of its own."""

    shared: int = attrs.field(validator=_count(MAX_TOKENS))
    extra: int = attrs.field(default=1, validator=_count(MAX_TOKENS))

    def __attrs_post_init__(self) -> None:
        if self.extra < 1:
            raise InvalidCase(f"need shared >= 0 and extra >= 1, got {self.shared}/{self.extra}")

    @property
    def total_tokens(self) -> int:
        return self.shared + self.extra


@attrs.frozen
class Case:
    config: CoordinatorConfig = attrs.field(validator=attrs.validators.instance_of(CoordinatorConfig))
    prompt_len: int = attrs.field(validator=_count(MAX_TOKENS))
    steps: tuple[Step, ...] = attrs.field(converter=tuple)
    probe: LookupProbe | None = None

    def __attrs_post_init__(self) -> None:
        if not self.config.hybrid:
            raise InvalidCase("a case exercises the hybrid coordinator's registration boundary: it needs at "
                              "least two KV-cache groups (vLLM serves one group with the unitary coordinator)")
        if len(self.steps) > MAX_STEPS or not all(isinstance(s, Step) for s in self.steps):
            raise InvalidCase(f"a request takes at most {MAX_STEPS} steps, each a Step")
        if self.probe is not None and not isinstance(self.probe, LookupProbe):
            raise InvalidCase(f"the probe must be a LookupProbe, got {self.probe!r}")
        chunks = [s.tokens for s in self.steps if s.kind == "prefill"]
        if sum(chunks) != self.prompt_len or any(c < 1 for c in chunks) or self.prompt_len < 1:
            raise InvalidCase("prefill chunks must be positive and cover the prompt exactly")
        kinds = [s.kind for s in self.steps]
        if "decode" in kinds and "prefill" in kinds[kinds.index("decode"):]:
            raise InvalidCase("prefill chunks come before decode steps")
        if self.max_model_len > 2 * MAX_TOKENS:
            raise InvalidCase(f"the request runs to {self.max_model_len} tokens; kvspec's model stops at "
                              f"{2 * MAX_TOKENS}")
        if self.probe is not None and self.probe.shared > self.writer_tokens:
            raise InvalidCase(f"the probe shares {self.probe.shared} tokens, the writer has {self.writer_tokens}")

    @property
    def writer_tokens(self) -> int:
        """The writer's tokens after its steps: the prompt, one output token
        once the prompt is done, one more per decode plus accepted drafts."""
        return self.prompt_len + 1 + sum(s.accepted + 1 for s in self.steps if s.kind == "decode")

    @property
    def max_model_len(self) -> int:
        """The model's context length: room for every token the steps
        compute plus slack, rounded up to a multiple of 128 so that the
        requests of a fuzzing batch share one manager geometry (the worker
        reuses a manager across cases of equal geometry)."""
        needed = self.prompt_len + sum(s.drafts + 1 for s in self.steps if s.kind == "decode") + 16
        return -(-needed // 128) * 128

    @property
    def num_blocks(self) -> int:
        """The block pool: every group's blocks for the whole context, and spares."""
        return sum(self.max_model_len // g.block_size + 2 for g in self.config.groups) + 4

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": {
                "groups": [attrs.asdict(g, value_serializer=_enum_value) for g in self.config.groups],
                "scheduler_block_size": self.config.scheduler_block_size,
                "hash_block_size": self.config.hash_block_size,
                "enable_caching": self.config.enable_caching,
                "num_prefill_lookahead": self.config.num_prefill_lookahead,
                "dcp_world_size": self.config.dcp_world_size,
                "allow_partial_hash_hits": self.config.allow_partial_hash_hits,
                # Written only when not the legacy default, so older case files read the same.
                **({"hash_scheme": self.config.hash_scheme.value}
                   if self.config.hash_scheme is not HashScheme.LEGACY else {}),
            },
            "prompt_len": self.prompt_len,
            "steps": [attrs.asdict(s) for s in self.steps],
            **({"probe": attrs.asdict(self.probe)} if self.probe else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Case":
        """From its JSON form; anything else (a wrong type, a field too many, a
        value outside the model's domain) is an InputError, never a crash."""
        try:
            cfg = dict(data["config"])
            groups = cfg["groups"]
            if not isinstance(groups, list) or len(groups) > 16:
                raise InvalidCase(f"groups must be a list of at most 16 groups, got {groups!r}")
            cfg["groups"] = tuple(KVCacheGroup(**g) for g in groups)
            steps = data["steps"]
            if not isinstance(steps, list):
                raise InvalidCase(f"steps must be a list, got {steps!r}")
            probe = LookupProbe(**data["probe"]) if data.get("probe") else None
            return cls(CoordinatorConfig(**cfg), data["prompt_len"], tuple(Step(**s) for s in steps), probe)
        except InputError:
            raise
        except (TypeError, KeyError, AttributeError) as exc:
            raise InvalidCase(f"not a kvspec case ({type(exc).__name__}: {exc})") from None

    def describe(self) -> str:
        # Runs of the same step are written once with a count ("prefill 1 x16").
        runs: list[list] = []
        for step in self.steps:
            if runs and runs[-1][0] == step:
                runs[-1][1] += 1
            else:
                runs.append([step, 1])
        steps = "; ".join(s.label() + (f" x{n}" if n > 1 else "") for s, n in runs)
        probe = ""
        if self.probe is not None:
            probe = f" then lookup(shared={self.probe.shared}, extra={self.probe.extra})"
        return f"{self.config.describe()} prompt={self.prompt_len} steps=[{steps}]{probe}"


def _enum_value(instance: Any, field: Any, value: Any) -> Any:
    return value.value if isinstance(value, GroupKind) else value
