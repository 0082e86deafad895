"""A known vLLM bug's release range, by a targeted search per release at the manager level.

The counterpart of ``diff_tests/ranges.py`` for the known bugs no engine toy
reaches (a layout no toy model builds, or not on the releases concerned):
kvspec builds the KVCacheConfig by hand and drives vLLM's real KV-cache
manager (the stateful differential's worker, ``diff_tests/stateful.py``).
A release's answer says what vLLM's manager code does with a layout kvspec
built, never that a deployment reaches it: every record and row says its
level, ``MANAGER_LEVEL``.

On each release, within a fixed, deterministic budget:

1. the bug's example stateful ``Program``, replayed as it is;
2. the same program around it (``program_variants``): the pool a few blocks
   smaller and larger, every prompt a token shorter or longer, or a block
   longer (``POOL_DELTAS``, ``LENGTH_DELTAS``, as the engine's);
3. the stateful machine's own rules over the geometries of (2) that the
   release builds (``SEARCH_EXAMPLES`` programs from seed ``SEARCH_SEED``,
   at most ``SEARCH_STEPS`` rules each, no example database, no shrinking).

The example may instead be a registration/lookup ``Case`` (one request on a
fresh manager, then a later request's lookup if it has a probe): its pool
follows from its context (``Case.num_blocks``), so only its prompt length
varies (the last prefill chunk, by ``LENGTH_DELTAS``), and the search is the
registration differential on the example's KVCacheConfig:
``CASE_SEARCH_CASES`` requests drawn from ``random.Random(SEARCH_SEED)``
(``strategies.random_request``, with a lookup probe where the example has
one), no Hypothesis, no database.

A discrepancy is the bug when ``model.known.recognise`` recognises it as that
bug.  "not expressible": the release's worker cannot build any of the
geometries, or vLLM refused them all.
"""

from __future__ import annotations

import random
import time
from typing import Any

import attrs
from hypothesis import Phase, reject, strategies as st
from hypothesis.errors import HypothesisException

from kvspec.model.case import Case, InvalidCase, LookupProbe
from kvspec.model.errors import InfrastructureError, KvspecError, SetupError
from kvspec.model.finding import Category
from kvspec.model.known import KnownBug, recognise
from kvspec.model.program import Program
from kvspec.model.replies import ErrorKind
from kvspec.model.requests import Stream
from kvspec.oracles.lookup import check_case
from kvspec.subjects.process import SubjectProcess

from .reproduce import SEARCH_EXAMPLES, SEARCH_SEED, SEARCH_STEPS
from .seeding import fixed_constant_pool
from .stateful import _machine_test, replay_program, state_machine
from .strategies import random_probe, random_request

__all__ = ["MANAGER_LEVEL", "ENGINE_LEVEL", "CASE_SEARCH_CASES", "resized_arrival", "program_variants", "case_variants",
           "searched_cases", "search_release_program", "search_release_case"]

CASE_SEARCH_CASES = 400  # requests of a Case example's targeted search (one fresh manager each)

MANAGER_LEVEL = "manager (hand-built KVCacheConfig)"
ENGINE_LEVEL = "engine"


def resized_arrival(op: dict[str, Any], delta: int) -> dict[str, Any]:
    """An operation with an arrival's prompt ``delta`` tokens longer or
    shorter (at least one token kept; added tokens distinct and the same for
    every request, so shared prefixes and resends stay shared; connector
    tokens, where given, kept within the prompt); any other as it is."""
    if op["do"] != "arrive":
        return op
    tokens = list(op["tokens"])
    tokens = tokens[:max(1, len(tokens) + delta)] if delta < 0 else tokens + [70_000 + i for i in range(delta)]
    op = {**op, "tokens": tokens}
    if op.get("external"):
        op["external"] = min(op["external"], len(tokens))
    return op


def program_variants(example: Program, pool_deltas: tuple[int, ...],
                     length_deltas: tuple[int, ...]) -> list[Program]:
    """The example, then the same operations around it: every pool of
    ``pool_deltas`` (at least one block) with every prompt-length change of
    ``length_deltas`` (a prompt keeps at least one token; added tokens are
    distinct and the same for every request, so shared prefixes and resends
    stay shared; a request's connector tokens stay within its prompt)."""
    out: list[Program] = []
    for pool in pool_deltas:
        for delta in length_deltas:
            ops = tuple(resized_arrival(op, delta) for op in example.ops)
            program = attrs.evolve(example, num_blocks=max(1, example.num_blocks + pool), ops=ops)
            if program not in out:
                out.append(program)
    return out


def _replay(proc: SubjectProcess, program: Program, bug: KnownBug, refusals: list[str]) -> str:
    """What ``program`` shows on ``proc``: "shown" (the bug), "other" (another
    discrepancy first), "held" (nothing broke), "refused" (this release's
    worker cannot build the geometry or run an operation of it, or vLLM
    refused the geometry; the reason is appended to ``refusals``)."""
    try:
        found, _ = replay_program(proc, program)
    except SetupError:
        raise
    except InfrastructureError as error:
        if "cannot drive the program" in str(error) or "cannot run on this subject" in str(error):
            refusals.append(str(error))
            return "refused"
        raise
    if not found:
        return "held"
    if recognise((bug,), found) is not None:
        return "shown"
    if found[0].category is Category.PRECONDITION:
        refusals.append(found[0].summary())
        return "refused"
    return "other"


class _Shown(BaseException):
    """The targeted search met the bug: it ends there (not a failure of Hypothesis's test)."""

    def __init__(self, program: Program):
        super().__init__(program.describe())
        self.program = program


def targeted_program_search(proc: SubjectProcess, geometries: list[Program], bug: KnownBug,
                            others: dict[str, int], counts: dict[str, int] | None = None) -> Program | None:
    """The stateful machine's rules over ``geometries`` only (their pools and
    layouts; their operations are not replayed), ``SEARCH_EXAMPLES`` programs
    from ``SEARCH_SEED``, no database, no shrinking: the first program whose
    discrepancy is ``bug``, or None.  Another discrepancy ends its program
    (counted in ``others`` by category) and the search goes on.  ``counts``
    receives the programs opened and the geometries refused."""
    bare = [g.with_ops(()) for g in geometries]
    counts = {} if counts is None else counts

    def on_program(machine, refused: str | None = None) -> None:
        key = "refused" if refused is not None else "programs"
        counts[key] = counts.get(key, 0) + 1

    base = state_machine(proc, on_program, known=lambda: (bug,), geometry=lambda caps: st.sampled_from(bare))

    class Targeted(base):  # type: ignore[valid-type, misc]
        def _fail(self, program: Program, found, reply) -> None:
            if recognise((bug,), found) is not None:
                self.inert = True
                raise _Shown(program)
            if self.oracle is None:  # vLLM refused the geometry: not a program of this search
                reject()
            key = found[0].category.value
            others[key] = others.get(key, 0) + 1
            self.inert = True  # the rest of this program sends nothing

    test = _machine_test(Targeted, proc, SEARCH_EXAMPLES, SEARCH_SEED, SEARCH_STEPS, None,
                         [Phase.explicit, Phase.generate])
    try:
        with fixed_constant_pool():
            test()
    except _Shown as shown:
        return shown.program
    return None


def search_release_program(proc: SubjectProcess, bug: KnownBug, example: Program,
                           pool_deltas: tuple[int, ...], length_deltas: tuple[int, ...]) -> dict[str, Any]:
    """One release's answer for ``bug`` at the manager level (module docstring)."""
    started = time.perf_counter()
    answers: dict[str, int] = {}
    refusals: list[str] = []
    buildable: list[Program] = []
    row: dict[str, Any] = {"release": proc.describe().get("vllm_version"), "level": MANAGER_LEVEL}

    def seconds() -> float:
        return round(time.perf_counter() - started, 1)

    try:
        for index, program in enumerate(program_variants(example, pool_deltas, length_deltas)):
            answer = _replay(proc, program, bug, refusals)
            answers[answer] = answers.get(answer, 0) + 1
            if answer == "shown":
                how = "the example as it is" if index == 0 else "a variant of the example (pool, prompt lengths)"
                return {**row, "status": "shown", "how": how, "program": program.describe(),
                        "manager_program": program.as_dict(), "replays": answers, "seconds": seconds()}
            if answer in ("held", "other") and program.with_ops(()) not in [b.with_ops(()) for b in buildable]:
                buildable.append(program)
        if not buildable:
            return {**row, "status": "not expressible",
                    "why": "this release builds none of the hand-built geometries (its worker cannot, or vLLM "
                           "refused them)", "refusals": sorted(set(refusals)), "replays": answers,
                    "seconds": seconds()}
        others: dict[str, int] = {}
        counts: dict[str, int] = {}
        found = targeted_program_search(proc, buildable, bug, others, counts)
    except (KvspecError, HypothesisException) as error:
        return {**row, "status": "unknown", "why": f"{type(error).__name__}: {error}", "replays": answers,
                "seconds": seconds()}
    row.update(replays=answers, search_others=others, search_programs=counts.get("programs", 0),
               seconds=seconds())
    if found is not None:
        return {**row, "status": "shown", "how": "the targeted stateful search (hand-built KVCacheConfig)",
                "program": found.describe(), "manager_program": found.as_dict()}
    return {**row, "status": "not shown"}


def case_variants(example: Case, length_deltas: tuple[int, ...]) -> list[Case]:
    """The example, then the same request with its prompt ``length_deltas``
    tokens longer or shorter (the last prefill chunk changes; the prompt
    keeps at least one token per chunk; a probe shares at most what the
    writer then holds).  A case's pool follows from its context: no pool
    variants."""
    out: list[Case] = []
    last = max(i for i, step in enumerate(example.steps) if step.kind == "prefill")
    for delta in length_deltas:
        chunk = max(1, example.steps[last].tokens + delta)
        steps = list(example.steps)
        steps[last] = attrs.evolve(steps[last], tokens=chunk)
        prompt = example.prompt_len - example.steps[last].tokens + chunk
        try:
            case = Case(example.config, prompt, tuple(steps))
            if example.probe is not None:
                case = attrs.evolve(case, probe=LookupProbe(min(example.probe.shared, case.writer_tokens),
                                                            example.probe.extra))
        except InvalidCase:
            continue
        if case not in out:
            out.append(case)
    return out


def _case_answer(case: Case, reply, caps, bug: KnownBug, refusals: list[str] | None = None) -> str:
    """What one case's reply shows: "shown", "other", "held" or "refused"
    (this release's worker cannot build the case, or vLLM refused its
    configuration; the reason is appended to ``refusals``)."""
    if reply.error is not None and reply.error.kind in (ErrorKind.UNSUPPORTED, ErrorKind.CONSTRUCT):
        if refusals is not None:
            refusals.append(f"{reply.error.kind.value}: {reply.error.message}")
        return "refused"
    found = check_case(case, caps, reply)
    if not found:
        return "held"
    return "shown" if recognise((bug,), found) is not None else "other"


def searched_cases(example: Case) -> list[Case]:
    """The targeted search's requests on the example's configuration."""
    rng = random.Random(SEARCH_SEED)
    out: list[Case] = []
    while len(out) < CASE_SEARCH_CASES:
        prompt_len, steps = random_request(rng)
        case = Case(example.config, prompt_len, steps)
        if example.probe is not None:
            unit = rng.choice([g.block_size for g in example.config.groups] + [example.config.scheduler_block_size])
            case = attrs.evolve(case, probe=random_probe(rng, case.writer_tokens, unit))
        out.append(case)
    return out


def search_release_case(proc: SubjectProcess, bug: KnownBug, example: Case,
                        length_deltas: tuple[int, ...]) -> dict[str, Any]:
    """One release's answer for ``bug`` from a registration/lookup ``Case``
    (module docstring), at the manager level."""
    started = time.perf_counter()
    caps = proc.capabilities
    answers: dict[str, int] = {}
    refusals: list[str] = []
    row: dict[str, Any] = {"release": proc.describe().get("vllm_version"), "level": MANAGER_LEVEL}

    def seconds() -> float:
        return round(time.perf_counter() - started, 1)

    try:
        around = case_variants(example, length_deltas)
        for index, (case, reply) in enumerate(zip(around, proc.stream(Stream.of(around)))):
            answer = _case_answer(case, reply, caps, bug, refusals)
            answers[answer] = answers.get(answer, 0) + 1
            if answer == "shown":
                how = "the example as it is" if index == 0 else "a variant of the example (prompt length)"
                return {**row, "status": "shown", "how": how, "case": case.describe(), "manager_case": case.as_dict(),
                        "replays": answers, "seconds": seconds()}
        if not answers.get("held") and not answers.get("other"):
            return {**row, "status": "not expressible",
                    "why": "this release builds none of the hand-built cases (its worker cannot, or vLLM refused "
                           "the configuration)", "refusals": sorted(set(refusals)), "replays": answers,
                    "seconds": seconds()}
        others: dict[str, int] = {}
        searched = searched_cases(example)
        for case, reply in zip(searched, proc.stream(Stream.of(searched))):
            answer = _case_answer(case, reply, caps, bug)
            if answer == "shown":
                return {**row, "status": "shown", "how": "the targeted registration search (hand-built "
                        "KVCacheConfig)", "case": case.describe(), "manager_case": case.as_dict(),
                        "replays": answers, "search_others": others, "seconds": seconds()}
            if answer != "held":
                others[answer] = others.get(answer, 0) + 1
    except KvspecError as error:
        return {**row, "status": "unknown", "why": f"{type(error).__name__}: {error}", "replays": answers,
                "seconds": seconds()}
    return {**row, "status": "not shown", "replays": answers, "search_others": others,
            "search_cases": len(searched), "seconds": seconds()}
