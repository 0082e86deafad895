"""The hit-rate replay: a multi-request workload through one KV-cache manager.

One scheduler (``replay``) drives a workload (``model.workload``) through a
*cache backend* and measures the prefix-cache hit rate the way vLLM's stats
do (hit tokens over prompt tokens of every lookup).  Two backends answer the
same actions: ``SubjectCache``, vLLM's own ``KVCacheManager`` in a subject's
worker (``get_computed_blocks``, ``allocate_slots``, ``free``), and the
spec's ideal cache (``oracles.ideal_cache.SpecCache``).

The pool is sized so that nothing is evicted, so the two are comparable.
The scheduler decides chunk sizes and draft acceptance from the workload
and each backend's answers (the hit it got, the tokens it has computed), so a
backend with a smaller hit prefills more.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.model.capabilities import ExpectedRegime, expected_regime
from kvspec.model.case import Case, prefill
from kvspec.model.domain import CoordinatorConfig, GroupKind
from kvspec.model.replies import SessionAnswer
from kvspec.model.requests import OpenSession, SessionActions, case_message
from kvspec.model.workload import Workload, WorkloadRequest

from ..process import SubjectError

__all__ = ["ReplayError", "RequestOutcome", "ReplayResult", "SubjectCache", "replay", "session_case"]


class ReplayError(SubjectError):
    """The subject failed mid-replay (its error and traceback are the message)."""


@attrs.frozen
class RequestOutcome:
    index: int
    conversation: int
    turn: int
    prompt_tokens: int
    hit: int
    # Per group, the ``num_tokens`` of the request's last cache_blocks call:
    # the boundary the next turn's lookup runs into.
    final_registration: tuple[int | None, ...]


@attrs.frozen
class ReplayResult:
    backend: str
    outcomes: tuple[RequestOutcome, ...]
    seconds: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(o.prompt_tokens for o in self.outcomes)

    @property
    def hit_tokens(self) -> int:
        return sum(o.hit for o in self.outcomes)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def per_turn(self) -> list[float]:
        """The hit rate of each conversation turn (turn 0 can only hit the
        shared system prompts; later turns also hit their history)."""
        turns = max((o.turn for o in self.outcomes), default=-1) + 1
        rates = []
        for t in range(turns):
            mine = [o for o in self.outcomes if o.turn == t]
            prompt = sum(o.prompt_tokens for o in mine)
            rates.append(sum(o.hit for o in mine) / prompt if prompt else 0.0)
        return rates

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "requests": len(self.outcomes),
                "prompt_tokens": self.prompt_tokens, "hit_tokens": self.hit_tokens,
                "hit_rate": round(self.hit_rate, 6), "seconds": round(self.seconds, 3),
                "hits": [o.hit for o in self.outcomes]}


def session_case(config: CoordinatorConfig, workload: Workload) -> dict[str, Any]:
    """The worker's geometry for a replay: a pool large enough for every
    token of the workload in every group (nothing is evicted)."""
    requests = workload.requests()
    longest = max(len(r.prompt) + len(r.output) for r in requests)
    total = sum(len(r.prompt) + len(r.output) + workload.drafts for r in requests)
    case = case_message(Case(config, 1, (prefill(1),)))  # the geometry fields of every case
    for key in ("prompt_len", "steps"):
        case.pop(key)
    case["max_model_len"] = longest + workload.drafts + 16
    # Blocks are pooled across groups (the hash block as the smallest unit,
    # generously: an evicting pool would make the two backends incomparable).
    case["num_blocks"] = len(config.groups) * (total // config.hash_block_size + 4 * len(requests)) + 16
    return case


class SubjectCache:
    """vLLM's KVCacheManager in a live subject worker."""

    def __init__(self, subject, config: CoordinatorConfig, workload: Workload):
        self.name = subject.subject.label
        self.subject, self.config = subject, config
        self.regime = expected_regime(config, subject.capabilities)
        reply = subject.session(OpenSession(session_case(config, workload)))
        if not reply.ok:
            raise ReplayError(f"{self.name}: cannot build the manager: {reply.error.message}")

    def apply(self, actions: list[dict[str, Any]]) -> tuple[SessionAnswer, ...]:
        reply = self.subject.session(SessionActions(actions))
        if not reply.ok:
            raise ReplayError(f"{self.name}: {reply.error.message}\n{reply.error.traceback or ''}".rstrip())
        return reply.payload


def _prefill_stops(config: CoordinatorConfig, regime: ExpectedRegime, prompt_tokens: int) -> list[int]:
    """Where a prefill chunk must end so that a Mamba "align" group keeps a
    reusable state there: vLLM's scheduler (``_mamba_block_aligned_split``)
    ends chunks on Mamba block boundaries and, under partial hash hits, at the
    prompt's last hash-block checkpoint (one hash block earlier when the
    EAGLE drop applies).  Layouts without a Mamba group have no stops."""
    mamba = [g.block_size for g in config.groups if g.kind is GroupKind.MAMBA_ALIGN]
    if not mamba:
        return []
    block, H = mamba[0], config.hash_block_size
    stops = list(range(block, prompt_tokens, block))
    if regime.partial_hash_hits:
        drop = any(regime.eagle)
        limit = prompt_tokens if drop else prompt_tokens - 1
        tail = max(0, limit // H * H - (H if drop else 0))
        stops.append(tail)
    return sorted(set(s for s in stops if 0 < s < prompt_tokens))


def _next_step(workload: Workload, request: WorkloadRequest, running: dict[str, Any], stops: list[int]):
    """The scheduler's next step for a running request and the output tokens
    it emits: a prefill chunk (the last one emits the first output token),
    or a decode that accepts the workload's number of drafts."""
    prompt, output = request.prompt, request.output
    computed, emitted = running["computed"], running["emitted"]
    if computed < len(prompt):
        end = min(computed + workload.chunk_tokens, len(prompt))
        end = next((s for s in stops if computed < s <= end), end)
        chunk = end - computed
        step = {"kind": "prefill", "tokens": chunk, "drafts": 0, "accepted": 0}
        return step, list(output[:1]) if end == len(prompt) else []
    remaining = len(output) - emitted
    drafts = workload.drafts
    accepted = min(request.accepted[running["decodes"] % len(request.accepted)], drafts, remaining - 1)
    running["decodes"] += 1
    step = {"kind": "decode", "tokens": 0, "drafts": drafts, "accepted": accepted}
    return step, list(output[emitted:emitted + accepted + 1])


def replay(workload: Workload, cache, progress=None) -> ReplayResult:
    """Run every request of ``workload`` through ``cache`` (a backend) with
    at most ``workload.concurrency`` at once; a turn starts once the previous
    turn of its conversation has finished."""
    import time

    started = time.perf_counter()
    requests = workload.requests()
    pending = list(range(len(requests)))
    finished: set[int] = set()
    running: dict[int, dict[str, Any]] = {}
    outcomes: dict[int, RequestOutcome] = {}
    while pending or running:
        starts = []
        for i in list(pending):
            if len(running) + len(starts) >= workload.concurrency:
                break
            after = requests[i].after
            if after is None or after in finished:
                starts.append(i)
                pending.remove(i)
        answers = cache.apply([{"do": "new_step", "id": None}]
                              + [{"do": "start", "id": i, "tokens": list(requests[i].prompt)}
                                 for i in starts])[1:]
        for i, answer in zip(starts, answers):
            running[i] = {"hit": answer.hit, "computed": answer.hit, "emitted": 0, "decodes": 0,
                          "stops": _prefill_stops(cache.config, cache.regime, len(requests[i].prompt)),
                          "handed": (None,) * len(cache.config.groups)}
        actions, order = [], []
        for i, state in running.items():
            step, outputs = _next_step(workload, requests[i], state, state["stops"])
            state["emitted"] += len(outputs)
            actions.append({"do": "step", "id": i, "step": step, "outputs": outputs})
            order.append(i)
        done = [i for i in order if running[i]["emitted"] >= len(requests[i].output)]
        answers = cache.apply(actions + [{"do": "free", "id": i} for i in done])
        for i, answer in zip(order, answers):
            state = running[i]
            if any(t is not None for t in answer.num_tokens):
                state["handed"] = answer.num_tokens
            state["computed"] = answer.computed
        for i in done:
            state = running.pop(i)
            r = requests[i]
            outcomes[i] = RequestOutcome(i, r.conversation, r.turn, len(r.prompt), state["hit"],
                                         state["handed"])
            finished.add(i)
        if progress is not None:
            progress(len(finished), len(requests))
    return ReplayResult(cache.name, tuple(outcomes[i] for i in range(len(requests))),
                        time.perf_counter() - started)

