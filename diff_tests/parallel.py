"""Fuzzing one subject on several cores: ``kvspec fuzz --jobs N``.

Each job is an independent Hypothesis run in its own process with its own
vLLM worker (so 2N processes: the Hypothesis engine and the oracle on one
side, vLLM on the other), seeded ``seed + i`` and given an equal share of the
budget. All jobs share the example database, so a failure one job saves is
replayed by every later run. Results are merged: counts are summed, the
failures deduplicated by (category, minimal case), and the smallest reported
as the subject's finding.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from kvspec.model.errors import InfrastructureError
from kvspec.model.outcome import Outcome

from kvspec.subjects.subject import Subject

from .fuzz import FuzzResult
from .property import Failure, Tally

__all__ = ["fuzz_parallel", "merge_results", "job_shares"]


def job_shares(max_examples: int, jobs: int) -> list[int]:
    """The budget split as evenly as it goes (the first jobs take the remainder)."""
    base, extra = divmod(max_examples, jobs)
    return [base + (1 if i < extra else 0) for i in range(jobs)]


def _job(subject: Subject, max_examples: int, seed: int, database: str, lookup: bool,
         hash_schemes: tuple[str, ...] | None = None, include_known: bool = False) -> FuzzResult:
    from kvspec.subjects.process import SubjectProcess

    from .database import example_database
    from .fuzz import fuzz_subject

    with SubjectProcess(subject) as proc:
        return fuzz_subject(proc, max_examples, seed, database=example_database(database), lookup=lookup,
                            hash_schemes=hash_schemes, include_known=include_known)


def _size(failure: Failure) -> tuple[int, ...]:
    case = failure.case
    return (len(case.config.groups), len(case.steps), case.prompt_len,
            sum(s.drafts for s in case.steps), len(case.describe()))


def merge_results(results: list[FuzzResult], seconds: float) -> FuzzResult:
    """One result for the subject; ``failures`` lists every distinct one found."""
    first = results[0]
    distinct: dict[tuple[str, str], Failure] = {}
    for result in results:
        if result.failure is not None:
            distinct.setdefault((result.failure.category, result.failure.case.describe()), result.failure)
    ordered = sorted(distinct.values(), key=_size)
    times = [r.seconds_to_first_failure for r in results if r.seconds_to_first_failure is not None]
    counts = [r.cases_to_first_failure for r in results if r.cases_to_first_failure is not None]
    tally = Tally.summed(r.tally for r in results)
    return FuzzResult(
        subject=first.subject, capabilities=first.capabilities, seed=first.seed, tally=tally,
        seconds=seconds, failure=ordered[0] if ordered else None,
        cases_to_first_failure=min(counts) if counts else None,
        seconds_to_first_failure=min(times) if times else None,
        jobs=len(results), other_failures=tuple(ordered[1:]), lookup=first.lookup,
        restarts=tuple(r for result in results for r in result.restarts),
        hash_schemes=first.hash_schemes, schemes_left_out=first.schemes_left_out, narrowed=first.narrowed,
        deployment_configs=first.deployment_configs, deployments_note=first.deployments_note,
        scope_reduction=first.scope_reduction,
    )


def fuzz_parallel(subject: Subject, jobs: int, max_examples: int, seed: int,
                  database: str = "", lookup: bool = False,
                  hash_schemes: tuple[str, ...] | None = None, include_known: bool = False) -> FuzzResult:
    """``jobs`` independent runs of ``spec`` at once; SubjectError if one cannot start."""
    from kvspec.subjects.subject import resolve_subject

    start = time.perf_counter()
    resolve_subject(subject)  # provision here, once, not in N jobs racing for the cache
    shares = [(i, n) for i, n in enumerate(job_shares(max_examples, jobs)) if n > 0]
    # spawn, not fork: the parent may hold threads and open pipes to other workers.
    context = multiprocessing.get_context("spawn")
    results: list[FuzzResult] = []
    lost: list[str] = []
    with ProcessPoolExecutor(max_workers=len(shares), mp_context=context) as pool:
        futures = [pool.submit(_job, subject, n, seed + i, database, lookup, hash_schemes, include_known) for i, n in shares]
        for future in futures:
            try:
                results.append(future.result())
            except BrokenProcessPool as exc:
                # A job's process was killed (the machine, not vLLM: a vLLM
                # failure comes back as a result); the jobs still running go with it.
                lost.append(str(exc) or "a job's process died")
    if not results:
        raise InfrastructureError(f"{subject.label}: a fuzzing job's process died ({lost[0]}); "
                                  "its examples did not run")
    merged = merge_results(results, time.perf_counter() - start)
    if lost:  # the finished jobs' results (a finding among them) are kept; the run is not whole
        merged.stopped = Outcome.INFRASTRUCTURE
        merged.stopped_why = (f"{subject.label}: {len(lost)} of {len(shares)} fuzzing jobs did not finish (a "
                              f"job's process died: {lost[0]}); the {len(results)} finished kept")
    return merged
