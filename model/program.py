"""A stateful example: a manager's geometry and the scheduler operations run on it.

The stateful differential (``diff_tests/stateful.py``) builds programs one
operation at a time; a failing one, shrunk, is what a finding records and a
replay reruns.  Operations are plain dicts in the worker's vocabulary
(``subjects/vllm_side/state_machine.py``, ``Machine.apply``): ``arrive`` (id, tokens, external) queues
a request (``external``: tokens a KV connector offers past its local hit); ``schedule`` (budget, drafts, accepted) runs one scheduler step
over the running and waiting requests; ``finish`` and ``preempt`` (id);
``reset``; ``evict`` (id, from_block) as a failed KV load does.
"""

from __future__ import annotations

from typing import Any

import attrs

from .case import MAX_STEPS, MAX_TOKENS, InvalidCase
from .domain import CoordinatorConfig, KVCacheGroup

__all__ = ["Program", "OPERATIONS", "describe_op", "validated_ops"]

OPERATIONS = ("arrive", "schedule", "finish", "preempt", "reset", "evict")


def validated_ops(value: Any, operations: tuple[str, ...], counts: tuple[str, ...],
                  what: str = "operation") -> tuple[dict[str, Any], ...]:
    """A program's operations, checked: known kinds, token lists of token ids,
    whole-number ``counts`` fields, plain request ids (a stored program is
    untrusted input)."""
    ops = tuple(dict(op) for op in value)
    if len(ops) > MAX_STEPS:
        raise InvalidCase(f"a program runs at most {MAX_STEPS} operations, got {len(ops)}")
    for op in ops:
        if op.get("do") not in operations:
            raise InvalidCase(f"unknown {what} {op.get('do')!r}; known: {', '.join(operations)}")
        tokens = op.get("tokens", [])
        if not isinstance(tokens, list) or len(tokens) > MAX_TOKENS or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in tokens):
            raise InvalidCase(f"an operation's tokens must be a list of at most {MAX_TOKENS} token ids")
        for key in counts:
            if key in op and (isinstance(op[key], bool) or not isinstance(op[key], int)
                              or not 0 <= op[key] <= MAX_TOKENS):
                raise InvalidCase(f"an operation's {key} must be a whole number from 0 to {MAX_TOKENS}")
        if "id" in op and not (isinstance(op["id"], str) and op["id"].isidentifier()):
            raise InvalidCase(f"a request id must be a plain name, got {op['id']!r}")
    return ops


def _ops(value: Any) -> tuple[dict[str, Any], ...]:
    return validated_ops(value, OPERATIONS, ("budget", "drafts", "accepted", "from_block", "external"),
                         what="operation")


@attrs.frozen
class Program:
    config: CoordinatorConfig = attrs.field(validator=attrs.validators.instance_of(CoordinatorConfig))
    num_blocks: int  # the pool: small enough that eviction happens
    max_model_len: int
    ops: tuple[dict[str, Any], ...] = attrs.field(default=(), converter=_ops)
    retention_interval: int | None = None  # None: dense caching (the release's default)
    num_hash_lookahead_tokens: int = 0
    # vLLM's --scheduler-reserve-full-isl (on by default in every supported release): a waiting
    # request is admitted only if its whole prompt would fit.
    reserve_full_sequence: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        for name in ("num_blocks", "max_model_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2 * MAX_TOKENS:
                raise InvalidCase(f"{name} must be a whole number from 1 to {2 * MAX_TOKENS}, got {value!r}")

    def machine_case(self) -> dict[str, Any]:
        """The worker's ``open_machine`` message."""
        c = self.config
        return {
            "groups": [{"kind": g.kind.value, "block_size": g.block_size, "eagle": g.eagle,
                        "sliding_window": g.sliding_window} for g in c.groups],
            "scheduler_block_size": c.scheduler_block_size, "hash_block_size": c.hash_block_size,
            "enable_caching": c.enable_caching, "num_prefill_lookahead": c.num_prefill_lookahead,
            "dcp_world_size": c.dcp_world_size, "max_model_len": self.max_model_len,
            "num_blocks": self.num_blocks, "retention_interval": self.retention_interval,
            "num_hash_lookahead_tokens": self.num_hash_lookahead_tokens,
            "full_sequence_must_fit": self.reserve_full_sequence,
        }

    def with_ops(self, ops) -> "Program":
        return attrs.evolve(self, ops=tuple(ops))

    def as_dict(self) -> dict[str, Any]:
        return {"config": {"groups": [{"kind": g.kind.value, "block_size": g.block_size, "eagle": g.eagle,
                                       "sliding_window": g.sliding_window} for g in self.config.groups],
                           "scheduler_block_size": self.config.scheduler_block_size,
                           "hash_block_size": self.config.hash_block_size,
                           "enable_caching": self.config.enable_caching,
                           "num_prefill_lookahead": self.config.num_prefill_lookahead,
                           "dcp_world_size": self.config.dcp_world_size,
                           "allow_partial_hash_hits": self.config.allow_partial_hash_hits},
                "num_blocks": self.num_blocks, "max_model_len": self.max_model_len,
                "retention_interval": self.retention_interval,
                "num_hash_lookahead_tokens": self.num_hash_lookahead_tokens,
                "reserve_full_sequence": self.reserve_full_sequence, "ops": [dict(op) for op in self.ops]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Program":
        try:
            cfg = dict(data["config"])
            cfg["groups"] = tuple(KVCacheGroup(**g) for g in cfg["groups"])
            return cls(CoordinatorConfig(**cfg), data["num_blocks"], data["max_model_len"], data["ops"],
                       data.get("retention_interval"), data.get("num_hash_lookahead_tokens", 0),
                       data.get("reserve_full_sequence", True))
        except (TypeError, KeyError, AttributeError) as exc:
            raise InvalidCase(f"not a kvspec program ({type(exc).__name__}: {exc})") from None

    def describe(self) -> str:
        retention = "" if self.retention_interval is None else f" retention={self.retention_interval}"
        if not self.reserve_full_sequence:
            retention += " --no-scheduler-reserve-full-isl"
        ops = "; ".join(describe_op(op) for op in self.ops)
        return (f"{self.config.describe()} pool={self.num_blocks} blocks{retention} "
                f"ops=[{ops}]")


def describe_op(op: dict[str, Any]) -> str:
    kind = op["do"]
    if kind == "arrive":
        external = f", a connector offers {op['external']} more" if op.get("external") else ""
        return f"arrive {op['id']} ({len(op['tokens'])} tokens{external})"
    if kind == "schedule":
        budget = f"budget {op['budget']}" if "budget" in op else "no budget"
        extra = f", {op['drafts']} drafts, {op.get('accepted', 0)} accepted" if op.get("drafts") else ""
        return f"schedule ({budget}{extra})"
    if kind == "evict":
        return f"evict {op['id']} from block {op.get('from_block', 0)}"
    if kind in ("finish", "preempt"):
        return f"{kind} {op['id']}"
    return kind
