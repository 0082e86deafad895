"""Registered versus computed tokens over a range of prompt lengths.

For a finding's configuration, one request per prompt length n (a single
prefill, so ``cache_blocks`` sees exactly n computed tokens) is run on the
live subject and predicted by the oracle: the data behind the sawtooth plot,
and the search space for the smallest single-call reproduction.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.capabilities import expected_regime
from kvspec.model.case import Case, prefill
from kvspec.oracles.registration import compare, expected_calls

from ..process import SubjectProcess
from kvspec.model.requests import Stream

__all__ = ["sweep", "sweep_range"]


MAX_POINTS = 160  # prompt lengths a sweep runs (and the plot shows)


def sweep_range(case: Case, n: int | None) -> range:
    """Enough periods of the scheduler block to show the pattern around ``n``;
    at real sizes (S in the hundreds) MAX_POINTS lengths centred on ``n``, so
    the finding's own length, and the loss it starts, are always in view."""
    S = case.config.scheduler_block_size
    upper = max(8 * S, (n or 0) + 2 * S, 24)
    if upper <= MAX_POINTS or n is None or n <= MAX_POINTS // 2:
        return range(1, min(upper, MAX_POINTS) + 1)
    start = n - MAX_POINTS // 2
    return range(start, start + MAX_POINTS)


def sweep(proc: SubjectProcess, case: Case, ns: range) -> dict[str, Any]:
    """Per group: the spec's and the subject's bound for a single prefill of each n."""
    caps = proc.capabilities
    regime = expected_regime(case.config, caps)
    cases = [Case(case.config, n, (prefill(n),)) for n in ns]
    replies = proc.run_many(Stream.of(cases))
    groups = len(case.config.groups)
    spec: list[list[int | None]] = [[] for _ in range(groups)]
    subject: list[list[int | None]] = [[] for _ in range(groups)]
    differing: list[int] = []
    for c, reply in zip(cases, replies):
        calls = reply.get("calls") if reply.ok else None
        if not calls:
            for g in range(groups):
                spec[g].append(None)
                subject[g].append(None)
            continue
        tokens = expected_calls(c, regime, calls[:1])[0][0]
        for g in range(groups):
            spec[g].append(tokens[g])
            subject[g].append(calls[0]["num_tokens"][g])
        if compare(c, caps, reply):
            differing.append(c.prompt_len)
    return {"n": list(ns), "spec": spec, "subject": subject, "differing_n": differing,
            "label": proc.subject.label}
