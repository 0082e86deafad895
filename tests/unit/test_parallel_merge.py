"""Merging the results of parallel fuzzing jobs (no vLLM needed)."""

from __future__ import annotations

from types import SimpleNamespace

from kvspec.diff_tests.fuzz import FuzzResult
from kvspec.diff_tests.parallel import job_shares, merge_results
from kvspec.diff_tests.property import Failure, Tally
from kvspec.model.case import Case, decode, prefill
from kvspec.model.corpus import case as corpus_case

from tests.support import capabilities

CONFIG = corpus_case("seed_52419").config


def _failure(prompt: int, *steps) -> Failure:
    case = Case(CONFIG, prompt, (prefill(prompt), *steps))
    return Failure(case, (SimpleNamespace(category="under_registration"),), reply={})


def _result(seed, failure=None, cases=10, first=None) -> FuzzResult:
    return FuzzResult(subject={"label": "s"}, capabilities=capabilities("0.33.0"), seed=seed,
                      tally=Tally(examples=5, cases=cases, calls=2 * cases), seconds=1.0, failure=failure,
                      cases_to_first_failure=first, seconds_to_first_failure=None if first is None else 0.1 * first)


def test_the_budget_is_split_evenly():
    assert job_shares(10, 3) == [4, 3, 3] and sum(job_shares(2001, 2)) == 2001
    assert job_shares(1, 2) == [1, 0]


def test_counts_are_summed_and_the_same_failure_is_reported_once():
    same = _failure(22)
    merged = merge_results([_result(0, same, first=7), _result(1, _failure(22), first=3), _result(2)], 4.2)
    assert (merged.examples, merged.cases, merged.calls, merged.jobs) == (15, 30, 60, 3)
    assert merged.failure.case == same.case and merged.other_failures == ()
    assert merged.cases_to_first_failure == 3 and merged.seconds == 4.2


def test_distinct_failures_are_kept_smallest_first():
    large, small = _failure(30, decode(), decode()), _failure(8)
    merged = merge_results([_result(0, large, first=1), _result(1, small, first=2)], 1.0)
    assert merged.failure.case == small.case
    assert [f.case for f in merged.other_failures] == [large.case]


def test_no_failure_anywhere():
    merged = merge_results([_result(0), _result(1)], 1.0)
    assert merged.failure is None and merged.cases_to_first_failure is None
    assert merged.as_dict()["verdict"] == "no discrepancy" and merged.as_dict()["jobs"] == 2


def test_known_bugs_met_by_the_jobs_are_summed_and_said_in_the_verdict():
    crash = "sliding_window_eagle_multi_module_lookahead_crash"
    one, two = _result(0), _result(1)
    one.tally.known_met, one.tally.known_first = {crash: 2}, {crash: "S=4 first"}
    two.tally.known_met, two.tally.known_first = {crash: 3}, {crash: "S=6 later"}
    doc = merge_results([one, two, _result(2)], 1.0).as_dict()
    assert doc["known_met"] == {crash: 5} and doc["known_first"] == {crash: "S=4 first"}
    assert doc["verdict"] == ("no discrepancy but known vLLM bugs (model/known.py), met and recognised: "
                              f"{crash} in 5 example(s)")


def test_a_job_that_dies_does_not_discard_the_other_jobs_finding(monkeypatch):
    """Issue 28: with --jobs 2, killing one job discarded the other's finished finding."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from kvspec.diff_tests import parallel
    from kvspec.model.outcome import Outcome
    from kvspec.subjects import subject as subjects

    finished = _result(0, _failure(22), first=3)

    class Pool:
        def __init__(self, **kwargs):
            self.futures = []

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            future = Future()
            if self.futures:
                future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
            else:
                future.set_result(finished)
            self.futures.append(future)
            return future

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(subjects, "resolve_subject", lambda subject: None)
    merged = parallel.fuzz_parallel(SimpleNamespace(label="s"), 2, 20, 0)
    assert merged.failure is finished.failure
    assert merged.stopped is Outcome.INFRASTRUCTURE and "1 of 2 fuzzing jobs did not finish" in merged.stopped_why
