"""Bounded-exhaustive conformance: every case of a declared small scope, on the real code.

The scope (``Scope``) is stated in the result: hash blocks, scheduler blocks,
group counts and kinds, every EAGLE flag pattern, lookaheads and prompt
lengths.  Each configuration is one request prefilled one token per step, so
``cache_blocks`` is called at every n = 1 .. prompt; every call of every case
is compared with the oracle.  Cases are spread over several live workers.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Iterator

import attrs

from kvspec.model.domain import CoordinatorConfig, GroupKind, InvalidGeometry, KVCacheGroup
from kvspec.model.case import Case, prefill
from kvspec.oracles.registration import compare
from kvspec.model.requests import Stream

__all__ = ["Scope", "enumerate_cases", "exhaust"]


@attrs.frozen
class Scope:
    hash_blocks: tuple[int, ...] = (1, 2, 4)
    scheduler_multiples: tuple[int, ...] = (1, 2, 3, 4)  # S = H * k
    max_groups: int = 3
    lookaheads: tuple[int, ...] = (0, 1, 2, 3)  # 3: R = 2 exceeds n = 1, where the clamp at 0 matters
    max_prompt: int = 48  # prompt = min(4 * S, max_prompt) tokens, one per step

    def describe(self) -> str:
        return (f"H in {list(self.hash_blocks)}, S = H * {list(self.scheduler_multiples)}, 2..{self.max_groups} "
                f"groups of distinct (kind, block) among full attention, sliding window (window S) and "
                f"Mamba align with blocks dividing S, every EAGLE pattern on attention groups, "
                f"lookahead in {list(self.lookaheads)}, one request of min(4S, {self.max_prompt}) tokens "
                f"prefilled one token per step (cache_blocks at every n)")


def enumerate_cases(scope: Scope, lookahead_supported: bool = True) -> Iterator[Case]:
    kinds = (GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW, GroupKind.MAMBA_ALIGN)
    for H in scope.hash_blocks:
        for k in scope.scheduler_multiples:
            S = H * k
            blocks = [b for b in range(H, S + 1, H) if S % b == 0]
            specs = [(kind, b) for kind in kinds for b in blocks]
            prompt = min(4 * S, scope.max_prompt)
            for count in range(2, scope.max_groups + 1):
                for chosen in itertools.combinations(specs, count):
                    attention = [i for i, (kind, _) in enumerate(chosen) if kind is not GroupKind.MAMBA_ALIGN]
                    for flags in itertools.product((False, True), repeat=len(attention)):
                        eagle = dict(zip(attention, flags))
                        groups = tuple(
                            KVCacheGroup(kind, b, eagle=eagle.get(i, False),
                                         sliding_window=S if kind is GroupKind.SLIDING_WINDOW else 0)
                            for i, (kind, b) in enumerate(chosen))
                        for lookahead in (scope.lookaheads if lookahead_supported else (0,)):
                            try:
                                config = CoordinatorConfig(groups=groups, scheduler_block_size=S,
                                                           hash_block_size=H,
                                                           num_prefill_lookahead=lookahead)
                            except InvalidGeometry:
                                continue  # e.g. EAGLE with a lookahead past S
                            yield Case(config, prompt, tuple(prefill(1) for _ in range(prompt)))


def exhaust(procs: list, scope: Scope, progress=None) -> dict[str, Any]:
    """Run every case of ``scope`` on the live workers ``procs``; returns the tally."""
    caps = procs[0].capabilities
    cases = list(enumerate_cases(scope, caps.reprefillable_tokens))
    lock = threading.Lock()
    tally = {"cases": 0, "calls": 0, "failing_cases": 0, "worker_seconds": 0.0, "discrepancies": []}
    chunks = [cases[i::len(procs)] for i in range(len(procs))]
    started = time.perf_counter()

    def work(proc, mine: list[Case]) -> None:
        for offset in range(0, len(mine), 16):
            batch = mine[offset:offset + 16]
            found = []
            # Iterate the stream itself (never zip it): it must run to its end marker.
            for index, reply in enumerate(proc.stream(Stream.of(batch))):
                found.append((batch[index], reply, compare(batch[index], caps, reply)))
            with lock:
                for case, reply, discrepancies in found:
                    tally["cases"] += 1
                    tally["calls"] += len(reply.get("calls", ()))
                    tally["worker_seconds"] += reply.get("seconds", 0.0)
                    tally["failing_cases"] += bool(discrepancies)
                    if discrepancies and len(tally["discrepancies"]) < 20:
                        tally["discrepancies"].append(
                            {"case": case.describe(), "found": [d.summary() for d in discrepancies]})
                if progress is not None:
                    progress(tally["cases"], len(cases), time.perf_counter() - started)

    threads = [threading.Thread(target=work, args=(p, c)) for p, c in zip(procs, chunks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    tally["worker_seconds"] = round(tally["worker_seconds"], 2)
    return {"scope": scope.describe(), "total_cases": len(cases), **tally,
            "seconds": round(seconds, 2), "cases_per_second": round(tally["cases"] / seconds, 1),
            "calls_per_second": round(tally["calls"] / seconds, 1), "workers": len(procs),
            # The raw driver's own rate: calls per second of time spent inside vLLM's workers.
            "raw_driver_calls_per_worker_second": round(tally["calls"] / max(tally["worker_seconds"], 1e-9), 1)}
