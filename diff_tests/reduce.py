"""Greedy minimisation of one failing case (or program) against the live subject.

Hypothesis has already shrunk the configuration and the batch to one
request; this loop shrinks that request (shorter prompt, fewer chunks and
steps, fewer drafts), keeping a candidate only when the subject still
shows a discrepancy of the same category.  Every kept step is a real rerun
of vLLM, so the minimal example is a genuine discrepancy by construction.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, TypeVar

import attrs

from kvspec.model.case import Case, InvalidCase, LookupProbe, Step
from kvspec.model.program import Program

_SAME = object()  # keep the case's own lookup probe
T = TypeVar("T")

__all__ = ["reduce_case", "reduce_program"]

MAX_RERUNS = 400


def _with(case: Case, prompt_len: int, steps: list[Step], probe: Any = _SAME) -> Case | None:
    probe = case.probe if probe is _SAME else probe
    try:
        writer = Case(case.config, prompt_len, tuple(steps))
        if probe is not None and probe.shared > writer.writer_tokens:
            # A shorter writer: the later request shares what there is.
            probe = LookupProbe(writer.writer_tokens, probe.extra)
        return attrs.evolve(writer, probe=probe)
    except ValueError:
        return None


def _smaller_probes(case: Case) -> Iterator[Case | None]:
    probe = case.probe
    if probe is None:
        return
    if probe.extra > 1:
        yield _with(case, case.prompt_len, list(case.steps), LookupProbe(probe.shared, 1))
    for shared in range(probe.shared):
        yield _with(case, case.prompt_len, list(case.steps), LookupProbe(shared, probe.extra))


def _fewer_groups(case: Case) -> Iterator[Case]:
    groups = case.config.groups
    for i in range(len(groups)):
        kept = groups[:i] + groups[i + 1:]
        if len({(g.kind, g.block_size, g.sliding_window) for g in kept}) < 2:
            continue  # a hybrid model keeps two distinct specs
        try:
            config = attrs.evolve(case.config, groups=kept)
        except ValueError:
            continue
        yield Case(config, case.prompt_len, case.steps, case.probe)


def _candidates(case: Case) -> Iterator[Case]:
    prefills = [s for s in case.steps if s.kind == "prefill"]
    decodes = [s for s in case.steps if s.kind == "decode"]
    yield from _fewer_groups(case)
    # The shortest prompt, in one chunk, that still fails.
    for length in range(1, case.prompt_len):
        yield _with(case, length, [Step("prefill", tokens=length)] + decodes)
    # Drop decode steps (later ones first), then simplify the survivors.
    for i in reversed(range(len(decodes))):
        yield _with(case, case.prompt_len, prefills + decodes[:i] + decodes[i + 1:])
    for i, d in enumerate(decodes):
        if d.drafts:
            smaller = Step("decode", drafts=d.drafts - 1, accepted=min(d.accepted, d.drafts - 1))
            yield _with(case, case.prompt_len, prefills + decodes[:i] + [smaller] + decodes[i + 1:])
    # Merge prefill chunks.
    for i in range(len(prefills) - 1):
        merged = Step("prefill", tokens=prefills[i].tokens + prefills[i + 1].tokens)
        yield _with(case, case.prompt_len, prefills[:i] + [merged] + prefills[i + 2:] + decodes)
    # Shorten the prompt: take tokens off the last chunk (by halves, then one).
    last = prefills[-1].tokens
    for cut in sorted({last // 2, 1} - {0}, reverse=True):
        if cut < last:
            shorter = prefills[:-1] + [Step("prefill", tokens=last - cut)]
            yield _with(case, case.prompt_len - cut, shorter + decodes)
        elif len(prefills) > 1:
            yield _with(case, case.prompt_len - last, prefills[:-1] + decodes)
    # The later request: fewer tokens of its own, then a shorter shared prefix.
    yield from _smaller_probes(case)


def reduce_case(case: Case, still_fails: Callable[[Case], bool]) -> tuple[Case, int]:
    """The smallest case reachable by greedy steps; returns it and the reruns used."""
    return _greedy(case, _candidates, still_fails)


def _greedy(start: T, candidates: Callable[[T], Iterator[T | None]], still_fails: Callable[[T], bool]) -> tuple[T, int]:
    """Take the first candidate that still fails, again from there, until none
    does or the reruns run out; returns the last and the reruns used."""
    current, reruns, improved = start, 0, True
    while improved and reruns < MAX_RERUNS:
        improved = False
        for candidate in candidates(current):
            if candidate is None:
                continue
            reruns += 1
            if still_fails(candidate):
                current, improved = candidate, True
                break
            if reruns >= MAX_RERUNS:
                break
    return current, reruns


def _without(program: Program, drop: set[int]) -> Program | None:
    """``program`` without the operations at ``drop``, and without what names
    a request whose arrival is dropped (it would name no one)."""
    gone = {program.ops[i]["id"] for i in drop if program.ops[i]["do"] == "arrive"}
    ops = [op for i, op in enumerate(program.ops) if i not in drop and op.get("id") not in gone]
    if len(ops) == len(program.ops):
        return None
    try:
        return program.with_ops(ops)
    except InvalidCase:
        return None


def _program_candidates(program: Program) -> Iterator[Program | None]:
    # Chunks first (halves, quarters, ...), then single operations, last first:
    # Hypothesis shrinks rule by rule and can leave operations that do nothing
    # (a step with no request) or that the failure does not need.
    n = len(program.ops)
    size = n // 2
    while size >= 1:
        for start in range(n - size, -1, -size):
            yield _without(program, set(range(start, start + size)))
        size //= 2


def reduce_program(program: Program, still_fails: Callable[[Program], bool]) -> tuple[Program, int]:
    """The shortest program reachable by deleting operations, each candidate
    a real rerun that must still fail the same way; returns it and the reruns."""
    return _greedy(program, _program_candidates, still_fails)
