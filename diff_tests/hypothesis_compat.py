"""Every place kvspec reaches into Hypothesis beyond its public API, in one module.

kvspec needs five things Hypothesis has no public way to say: the example
database key of a test (so each subject and differential keeps its own saved
failures), a test's seed without ``@seed`` at definition time, a state
machine's ``TestCase`` marked as a Hypothesis test for HypoFuzz, a pool of
local constants pinned empty (so a seed draws the same examples whatever was
imported), and a shrinking budget counted in test runs (Hypothesis's own is
five minutes of the clock, so what it reports would depend on the machine).
Each is written once here and tested in ``tests/unit/test_hypothesis_compat.py`` against the Hypothesis installed, the
one ``pyproject.toml`` declares and CI installs: a Hypothesis that moves one of
these fails that test, not a user's run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import attrs

__all__ = ["set_database_key", "set_seed", "mark_state_machine_test", "settings_of", "empty_local_constants",
           "shrink_budget", "ShrinkBudget"]


def set_database_key(test: Any, key: bytes) -> None:
    """Save and replay ``test``'s failures under ``key`` in the example
    database (``test``: a ``@given`` test's inner test, or a state machine class)."""
    test._hypothesis_internal_add_digest = key


def set_seed(test: Any, seed: int) -> None:
    """Run the ``@given`` (or state machine) test ``test`` with ``seed``, as ``@seed(seed)`` would."""
    test._hypothesis_internal_use_seed = seed


def mark_state_machine_test(method: Any, machine: type) -> None:
    """Mark a ``TestCase`` method that runs ``machine`` as a Hypothesis test
    (HypoFuzz finds its targets by these marks)."""
    method.is_hypothesis_test = True
    method._hypothesis_state_machine_class = machine


def settings_of(test: Any) -> Any:
    """The settings a ``@given`` test runs with (Hypothesis's defaults when it sets none)."""
    from hypothesis import settings

    return getattr(test, "_hypothesis_internal_use_settings", None) or settings()


@contextlib.contextmanager
def empty_local_constants() -> Iterator[bool]:
    """Within this block Hypothesis draws no constants mined from local
    modules; yields whether this Hypothesis had a pool to pin."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - another Hypothesis layout
        yield False
        return
    current = getattr(providers, "_get_local_constants", None)
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    constants = getattr(providers, "Constants", None)
    if current is None or cache is None or constants is None:
        yield False
        return
    empty = constants()
    providers._get_local_constants = lambda: empty
    cache.clear()  # entries computed from the growing pool
    try:
        yield True
    finally:
        providers._get_local_constants = current
        cache.clear()


@attrs.define
class ShrinkBudget:
    """The test runs Hypothesis may spend shrinking (``runs``), and how many it spent."""

    runs: int
    spent: int = 0

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.runs


@contextlib.contextmanager
def shrink_budget(runs: int) -> Iterator[ShrinkBudget]:
    """Within this block Hypothesis stops shrinking after ``runs`` test runs
    (counted over every failure it shrinks) and reports the smallest failing
    example found by then, as its five-minute limit would."""
    from hypothesis.internal.conjecture import engine

    budget = ShrinkBudget(runs)
    original = engine.ConjectureRunner.test_function

    def test_function(runner: Any, data: Any) -> Any:
        # The deadline is set only while shrinking, and checked after each run:
        # passed before the budget's last run, it ends shrinking there (quietly
        # at kvspec's verbosity; Hypothesis's own warning speaks of minutes).
        if runner.finish_shrinking_deadline is not None:
            budget.spent += 1
            if budget.exhausted:
                runner.finish_shrinking_deadline = 0.0
        return original(runner, data)

    engine.ConjectureRunner.test_function = test_function
    try:
        yield budget
    finally:
        engine.ConjectureRunner.test_function = original
