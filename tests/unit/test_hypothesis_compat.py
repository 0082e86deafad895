"""Each Hypothesis internal kvspec touches (diff_tests/hypothesis_compat.py)
still does what kvspec relies on, on the Hypothesis pyproject.toml declares
and CI installs."""

from __future__ import annotations

from hypothesis import Phase, Verbosity, given, settings, strategies as st
from hypothesis.database import InMemoryExampleDatabase
from hypothesis.internal.detection import is_hypothesis_test
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvspec.diff_tests.hypothesis_compat import (empty_local_constants, mark_state_machine_test,
                                                 set_database_key, set_seed, settings_of)


def _failing_test(db, seen):
    @settings(database=db, max_examples=50, phases=[Phase.reuse, Phase.generate], derandomize=False)
    @given(st.integers(0, 1000))
    def test(n):
        seen.append(n)
        assert n < 500

    return test


def _first_example(db, key):
    seen: list[int] = []
    test = _failing_test(db, seen)
    set_database_key(test.hypothesis.inner_test, key)
    set_seed(test, 1)
    try:
        test()
    except AssertionError:
        pass
    return seen[0], seen


def test_the_database_key_keeps_each_subjects_failures_apart():
    db = InMemoryExampleDatabase()
    _, seen = _first_example(db, b"subject-a")
    failing = [n for n in seen if n >= 500]
    assert failing
    # Another test function under the same key replays the saved failure first ...
    first_same, _ = _first_example(db, b"subject-a")
    assert first_same >= 500
    # ... one under another key does not (a fresh database for it would be the same).
    fresh = InMemoryExampleDatabase()
    other_first, _ = _first_example(fresh, b"subject-b")
    assert _first_example(db, b"subject-b")[0] == other_first


def test_a_seed_draws_the_same_examples():
    def draws(seed):
        seen: list[int] = []

        @settings(database=None, max_examples=20, derandomize=False)
        @given(st.integers(0, 10**9))
        def test(n):
            seen.append(n)

        set_seed(test, seed)
        test()
        return seen

    assert draws(3) == draws(3) and draws(3) != draws(4)


def test_a_state_machine_test_case_is_marked_as_a_hypothesis_test():
    class Machine(RuleBasedStateMachine):
        @rule()
        def nothing(self):
            pass

    class Case(Machine.TestCase):
        def runTest(self):
            pass

    assert not is_hypothesis_test(Case().runTest)
    mark_state_machine_test(Case.runTest, Machine)
    assert is_hypothesis_test(Case().runTest)
    assert Case.runTest._hypothesis_state_machine_class is Machine


def test_settings_of_reads_a_tests_budget():
    @settings(max_examples=7)
    @given(st.integers())
    def test(n):
        pass

    assert settings_of(test).max_examples == 7
    assert settings_of(lambda: None).max_examples == settings().max_examples


def test_this_hypothesis_has_a_local_constant_pool_to_pin():
    with empty_local_constants() as pinned:
        assert pinned


def _shrunk(runs: int | None) -> tuple[list[int], int]:
    """A test failing once its list sums past 1000, shrunk within ``runs``
    test runs (None: Hypothesis's own limits); the failing list reported
    and the number of runs."""
    from kvspec.diff_tests.hypothesis_compat import shrink_budget

    calls: list[list[int]] = []

    @settings(database=None, max_examples=200, derandomize=True, phases=[Phase.generate, Phase.shrink],
              verbosity=Verbosity.quiet)
    @given(st.lists(st.integers(0, 1000), max_size=20))
    def test(values):
        calls.append(values)
        if sum(values) > 1000:
            raise AssertionError(values)

    budget = None
    try:
        if runs is None:
            test()
        else:
            with shrink_budget(runs) as budget:
                test()
    except AssertionError as error:
        reported = error.args[0]
    else:
        raise AssertionError("the test never failed")
    if budget is not None:
        assert budget.exhausted and budget.spent == runs
    return reported, len(calls)


def test_a_shrink_budget_counts_runs_and_reports_the_smallest_failure_found_within_it():
    minimal, all_runs = _shrunk(None)
    assert len(minimal) == 2 and sum(minimal) == 1001  # Hypothesis's own shrink: [1, 1000]
    cut, cut_runs = _shrunk(5)
    assert sum(cut) > 1000  # the failure is reported (its final replay ran) ...
    assert cut_runs < all_runs  # ... after fewer runs ...
    again, again_runs = _shrunk(5)
    assert (again, again_runs) == (cut, cut_runs)  # ... the same ones every time (a count, not a clock)
    from hypothesis.internal.conjecture import engine

    assert engine.ConjectureRunner.test_function.__name__ == "test_function"  # restored on exit
    assert engine.ConjectureRunner.test_function.__module__ == engine.__name__


def test_no_other_module_reaches_into_hypothesis():
    """Every Hypothesis internal kvspec touches is in hypothesis_compat (so
    this module's tests cover each one): no other source file names one."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    internal = re.compile(r"hypothesis\.internal|_hypothesis_internal|_hypothesis_state_machine|\._get_local_constants")
    offenders = [str(path.relative_to(root)) for folder in ("model", "oracles", "proofs", "subjects", "diff_tests",
                                                             "kvspec")
                 for path in sorted((root / folder).rglob("*.py"))
                 if not path.is_symlink() and path.name != "hypothesis_compat.py"
                 and not any(part.is_symlink() for part in path.parents if part != root and root in part.parents)
                 and internal.search(path.read_text(encoding="utf-8"))]
    assert offenders == []
