"""A synthetic serving workload for the hit-rate replay, and the layouts it is
replayed on (``subjects/drivers/hitrate.py``).

Conversations share a few system prompts; each turn's prompt is the previous
turn's prompt and answer plus a new user message, so a later turn can hit
everything the earlier one computed (the multi-turn pattern behind the hit
rate the seed measured).  Up to ``concurrency`` requests run at once; a turn
arrives only once the previous turn of its conversation has finished.
Decodes propose ``drafts`` speculative tokens and accept a seeded random
number of them, like an EAGLE-family drafter.

The workload is data (token ids and the acceptance of every decode step),
generated once from the seed, so every backend that replays it sees the same
requests.
"""

from __future__ import annotations

import random

import attrs

from .domain import CoordinatorConfig, GroupKind, KVCacheGroup

__all__ = ["Workload", "WorkloadRequest", "LAYOUTS", "layout"]


def _positive(instance, attribute, value) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, got {value}")


def _range(instance, attribute, value) -> None:
    low, high = value
    if not 1 <= low <= high:
        raise ValueError(f"{attribute.name} must be a range 1 <= low <= high, got {value}")


@attrs.frozen
class WorkloadRequest:
    index: int
    conversation: int
    turn: int
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    accepted: tuple[int, ...]  # drafts accepted at each decode step, cycled
    after: int | None  # the request that must finish before this one arrives


@attrs.frozen
class Workload:
    seed: int = 0
    system_prompts: int = attrs.field(default=4, validator=_positive)
    system_prompt_tokens: int = attrs.field(default=300, validator=_positive)
    conversations: int = attrs.field(default=24, validator=_positive)
    turns: int = attrs.field(default=4, validator=_positive)
    user_tokens: tuple[int, int] = attrs.field(default=(20, 120), converter=tuple, validator=_range)
    output_tokens: tuple[int, int] = attrs.field(default=(16, 96), converter=tuple, validator=_range)
    concurrency: int = attrs.field(default=16, validator=_positive)
    chunk_tokens: int = attrs.field(default=512, validator=_positive)
    drafts: int = attrs.field(default=3, validator=attrs.validators.ge(0))

    def requests(self) -> tuple[WorkloadRequest, ...]:
        rng = random.Random(self.seed)
        fresh = iter(range(10_000, 10**9))  # token ids: every generated token is new

        def tokens(count: int) -> tuple[int, ...]:
            return tuple(next(fresh) for _ in range(count))

        systems = [tokens(self.system_prompt_tokens) for _ in range(self.system_prompts)]
        out: list[WorkloadRequest] = []
        histories = [systems[rng.randrange(self.system_prompts)] for _ in range(self.conversations)]
        last: list[int | None] = [None] * self.conversations
        # Turns interleave across conversations, in arrival order.
        for turn in range(self.turns):
            for conversation in range(self.conversations):
                prompt = histories[conversation] + tokens(rng.randint(*self.user_tokens))
                output = tokens(rng.randint(*self.output_tokens))
                accepted = tuple(rng.randint(0, self.drafts) for _ in range(len(output)))
                out.append(WorkloadRequest(len(out), conversation, turn, prompt, output, accepted,
                                           last[conversation]))
                last[conversation] = len(out) - 1
                histories[conversation] = prompt + output
        return tuple(out)

    def describe(self) -> str:
        return (f"{self.conversations} conversations x {self.turns} turns over {self.system_prompts} "
                f"system prompts of {self.system_prompt_tokens} tokens; user {self.user_tokens[0]}-"
                f"{self.user_tokens[1]}, output {self.output_tokens[0]}-{self.output_tokens[1]} tokens; "
                f"concurrency {self.concurrency}, prefill chunks of {self.chunk_tokens}, "
                f"{self.drafts} drafts per decode (seed {self.seed})")


LAYOUTS = ("mamba-hybrid", "full-attention")


def layout(name: str, scheduler_block_size: int):
    """The replayed model's KV-cache groups, the drafter's (EAGLE) with the
    hash block of 16.

    ``mamba-hybrid``: a Mamba "align" group whose block is the scheduler block
    (as vLLM sizes it) and a full-attention EAGLE group: partial hash hits,
    the path #50062 broke.  ``full-attention``: two full-attention groups, the
    layout whose lookup the model predicts exactly (``oracles.lookup``), so
    the spec's ideal is the reference there.
    """
    S = scheduler_block_size
    if name == "mamba-hybrid":
        groups = (KVCacheGroup(GroupKind.MAMBA_ALIGN, S), KVCacheGroup(GroupKind.FULL_ATTENTION, 16, eagle=True))
    else:
        groups = (KVCacheGroup(GroupKind.FULL_ATTENTION, 16, eagle=True), KVCacheGroup(GroupKind.FULL_ATTENTION, S))
    return CoordinatorConfig(groups=groups, scheduler_block_size=S, hash_block_size=16)
