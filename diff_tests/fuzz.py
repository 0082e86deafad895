"""Differential fuzzing of one subject with Hypothesis: the engine behind
``kvspec fuzz`` (the pytest tests in this package use the same pieces)."""

from __future__ import annotations

import time
from typing import Any, Callable

import attrs
from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hypothesis_seed, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky

from oracles.case import Case
from oracles.lookup import check_case
from oracles.oracle import Discrepancy
from oracles.subject import SubjectProcess

from .reduce import reduce_case
from .seeding import fixed_constant_pool
from .strategies import batches, lookup_batches

__all__ = ["Failure", "FuzzResult", "fuzz_subject", "check_case"]


@attrs.frozen
class Failure:
    case: Case
    discrepancies: tuple[Discrepancy, ...]
    reply: dict[str, Any]  # the subject's raw observations (or its traceback)
    flaky: bool = False

    @property
    def category(self) -> str:
        return self.discrepancies[0].category

    def as_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "case": self.case.as_dict(),
            "case_text": self.case.describe(),
            "discrepancies": [d.as_dict() for d in self.discrepancies],
            "summary": [d.summary() for d in self.discrepancies],
            "observed": self.reply,
            "flaky": self.flaky,
        }


@attrs.define
class FuzzResult:
    subject: dict[str, Any]
    capabilities: dict[str, Any]
    seed: int
    examples: int = 0  # Hypothesis examples (one configuration, a batch of requests)
    cases: int = 0  # differential cases: one request on a fresh manager, compared
    calls: int = 0
    seconds: float = 0.0
    failure: Failure | None = None
    examples_to_first_failure: int | None = None
    seconds_to_first_failure: float | None = None
    jobs: int = 1  # parallel runs merged into this result (diff_tests/parallel.py)
    other_failures: tuple[Failure, ...] = ()  # distinct from `failure`, found by other jobs
    lookup: bool = False  # cases carry a later request's lookup (the hit-length differential)

    def as_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "capabilities": self.capabilities,
            "seed": self.seed,
            "examples": self.examples,
            "cases": self.cases,
            "cache_blocks_calls": self.calls,
            "seconds": round(self.seconds, 3),
            "examples_to_first_failure": self.examples_to_first_failure,
            "seconds_to_first_failure": None if self.seconds_to_first_failure is None
            else round(self.seconds_to_first_failure, 3),
            "verdict": "discrepancy" if self.failure else "no discrepancy",
            "failure": None if self.failure is None else self.failure.as_dict(),
            "jobs": self.jobs,
            "lookup": self.lookup,
            "other_failures": [f.as_dict() for f in self.other_failures],
        }


def fuzz_subject(
    proc: SubjectProcess,
    max_examples: int,
    seed: int,
    database: ExampleDatabase | None = None,
    progress: Callable[[int, float], None] | None = None,
    stop_at_first: bool = False,
    on_first_failure: Callable[["FuzzResult"], None] | None = None,
    lookup: bool = False,
) -> FuzzResult:
    """Fuzz one live subject; the returned failure is Hypothesis's shrunk minimum.

    With ``lookup``, every request is followed by a later request that looks
    up (``oracles.lookup``): the hit-length differential."""
    caps = proc.capabilities
    result = FuzzResult(subject=proc.describe(), capabilities=caps, seed=seed, lookup=lookup)
    failures: list[Failure] = []
    start = time.perf_counter()

    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if not stop_at_first:
        phases.append(Phase.shrink)

    # @settings goes outside @seed: @seed alone turns the database off, and a
    # seeded run must still replay (and save) the failures of earlier runs.
    @settings(
        max_examples=max_examples, deadline=None, database=database, verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck), phases=phases, report_multiple_bugs=False,
    )
    @hypothesis_seed(seed)
    @given(batch=(lookup_batches if lookup else batches)(caps))
    def differential(batch: tuple[Case, ...]) -> None:
        result.examples += 1
        if progress is not None and result.examples % 100 == 0:
            progress(result.cases, time.perf_counter() - start)
        failed = None
        # Replies stream in: case i is compared while the worker drives case i + 1.
        # (Iterate the stream itself, never zip it: it must run to its end marker.)
        for index, reply in enumerate(proc.stream([case.to_worker() for case in batch])):
            case = batch[index]
            if failed is not None:
                continue  # drain the stream; the first failure is the example's
            result.cases += 1
            result.calls += len(reply.get("calls", ()))
            found = check_case(case, caps, reply)
            if found:
                if result.examples_to_first_failure is None:
                    result.examples_to_first_failure = result.cases
                    result.seconds_to_first_failure = time.perf_counter() - start
                    if on_first_failure is not None:
                        on_first_failure(result)
                failed = Failure(case, tuple(found), reply)
        if failed is not None:
            failures.append(failed)
            raise AssertionError(failed.discrepancies[0].summary())

    # The database is keyed by subject and differential. Hypothesis deletes a
    # saved failure that passes when replayed, so with one key for all, fuzzing
    # a correct release erased what a mutant or a PR tree had saved.
    differential.hypothesis.inner_test._hypothesis_internal_add_digest = database_key(proc.spec.label, lookup)
    try:
        with fixed_constant_pool():
            differential()
    except AssertionError:
        # Hypothesis replays its minimal failing batch last.
        result.failure = failures[-1]
    except Flaky:
        result.failure = attrs.evolve(failures[-1], flaky=True) if failures else None
    if result.failure is not None and not stop_at_first:
        result.failure = _minimise(proc, caps, result.failure)
    result.seconds = time.perf_counter() - start
    return result


def database_key(subject_label: str, lookup: bool) -> bytes:
    """What sets a subject's saved failures apart in the example database."""
    return f"{subject_label}|{'lookup' if lookup else 'registration'}".encode()


def _minimise(proc: SubjectProcess, caps: dict[str, Any], failure: Failure) -> Failure:
    category = failure.category
    latest: dict[str, Any] = {}

    def still_fails(case: Case) -> bool:
        reply = proc.run(case.to_worker())
        found = check_case(case, caps, reply)
        if found and found[0].category == category:
            latest[case] = (tuple(found), reply)
            return True
        return False

    smallest, _ = reduce_case(failure.case, still_fails)
    if smallest == failure.case:
        return failure
    found, reply = latest[smallest]
    return attrs.evolve(failure, case=smallest, discrepancies=found, reply=reply)
