"""An interrupt is an interrupt however Hypothesis reports it."""

from __future__ import annotations

from kvspec.diff_tests.fuzz import interrupt_behind


def _hypothesis_like() -> None:
    # Hypothesis 6.157's engine, interrupted before its runner exists, asserts
    # on the way out: the interrupt survives only as the assertion's context.
    try:
        raise KeyboardInterrupt
    except BaseException:
        runner = None
        assert runner is not None


def test_an_interrupt_hypothesis_turned_into_an_assertion_is_still_an_interrupt():
    try:
        _hypothesis_like()
    except AssertionError as error:
        assert interrupt_behind(error)
    else:
        raise AssertionError("the stand-in did not raise")


def test_an_assertion_without_aninterrupt_behind_it_is_not_one():
    try:
        raise AssertionError("a real failure")
    except AssertionError as error:
        assert not interrupt_behind(error)
    chained = ValueError("outer")
    chained.__cause__ = RuntimeError("inner")
    assert not interrupt_behind(chained)
