"""A differential example: a configuration and the steps a request takes.

Plain values in vLLM's vocabulary; how one is sent to a worker is the
subject side's business (``subjects/protocol.py``)."""

from __future__ import annotations

from typing import Any

import attrs

from .domain import CoordinatorConfig, GroupKind, KVCacheGroup

__all__ = ["Step", "Case", "LookupProbe", "prefill", "decode"]


@attrs.frozen
class Step:
    kind: str  # "prefill" (a chunk of the prompt) or "decode" (1 token + drafts)
    tokens: int = 0  # prefill: prompt tokens in this chunk
    drafts: int = 0  # decode: speculative tokens proposed
    accepted: int = 0  # decode: drafts accepted

    def __attrs_post_init__(self) -> None:
        if self.kind not in ("prefill", "decode"):
            raise ValueError(f"step kind must be prefill or decode, got {self.kind!r}")
        if not 0 <= self.accepted <= self.drafts:
            raise ValueError(f"need 0 <= accepted <= drafts, got {self.accepted}/{self.drafts}")

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

    shared: int
    extra: int = 1

    def __attrs_post_init__(self) -> None:
        if self.shared < 0 or self.extra < 1:
            raise ValueError(f"need shared >= 0 and extra >= 1, got {self.shared}/{self.extra}")

    @property
    def total_tokens(self) -> int:
        return self.shared + self.extra


@attrs.frozen
class Case:
    config: CoordinatorConfig
    prompt_len: int
    steps: tuple[Step, ...] = attrs.field(converter=tuple)
    probe: LookupProbe | None = None

    def __attrs_post_init__(self) -> None:
        chunks = [s.tokens for s in self.steps if s.kind == "prefill"]
        if sum(chunks) != self.prompt_len or any(c < 1 for c in chunks):
            raise ValueError("prefill chunks must be positive and cover the prompt exactly")
        kinds = [s.kind for s in self.steps]
        if "decode" in kinds and "prefill" in kinds[kinds.index("decode"):]:
            raise ValueError("prefill chunks come before decode steps")
        if self.probe is not None and self.probe.shared > self.writer_tokens:
            raise ValueError(f"the probe shares {self.probe.shared} tokens, the writer has {self.writer_tokens}")

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
            },
            "prompt_len": self.prompt_len,
            "steps": [attrs.asdict(s) for s in self.steps],
            **({"probe": attrs.asdict(self.probe)} if self.probe else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Case":
        cfg = dict(data["config"])
        cfg["groups"] = tuple(KVCacheGroup(**g) for g in cfg["groups"])
        probe = LookupProbe(**data["probe"]) if data.get("probe") else None
        return cls(CoordinatorConfig(**cfg), data["prompt_len"], tuple(Step(**s) for s in data["steps"]),
                   probe)

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
