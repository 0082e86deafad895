"""One seed, the same examples, whatever the process imported in between
(``diff_tests.seeding``)."""

from __future__ import annotations

import importlib
import sys

from hypothesis import Phase, given, seed, settings

from kvspec.diff_tests.seeding import fixed_constant_pool
from kvspec.diff_tests.strategies import batches

from tests.support import capabilities

CAPS = capabilities("0.33.0")


def _generated(examples: int = 40) -> list[str]:
    drawn: list[str] = []

    @settings(max_examples=examples, database=None, phases=[Phase.generate], deadline=None)
    @seed(1234)
    @given(batch=batches(CAPS))
    def record(batch):
        drawn.append(repr(tuple(case.describe() for case in batch)))

    record()
    return drawn


def _import_module_with_constants(directory, name: str, base: int) -> None:
    """A new local module full of integers no other module has (the pool only
    grows, and the tests share a process), as a newly imported kvspec module
    would be: the kind of source Hypothesis mines for constants."""
    values = ", ".join(str(base + v) for v in range(400))
    (directory / f"{name}.py").write_text(f"VALUES = [{values}]\nWORDS = ['prefill', 'decode']\n")
    sys.path.insert(0, str(directory))
    try:
        importlib.import_module(name)
    finally:
        sys.path.remove(str(directory))


def test_a_seed_generates_the_same_examples_after_new_imports(tmp_path):
    with fixed_constant_pool():
        before = _generated()
    _import_module_with_constants(tmp_path, "kvspec_seeding_probe_a", base=1_000_000)
    with fixed_constant_pool():
        after = _generated()
    assert before == after


def test_without_the_pin_new_imports_change_the_examples(tmp_path):
    """The control: the pin is what makes the test above pass (on a
    Hypothesis that mines local constants; this one does)."""
    from hypothesis.internal.conjecture import providers

    assert hasattr(providers, "_get_local_constants"), "this Hypothesis has no local constant pool"
    # A constant is drawn now and then, so the control needs enough examples
    # for one of the new ones to be drawn (40 were not enough once batches
    # drew the hash scheme too).
    before = _generated(100)
    _import_module_with_constants(tmp_path, "kvspec_seeding_probe_b", base=2_000_000)
    after = _generated(100)
    assert before != after


def test_the_pin_is_undone_afterwards():
    from hypothesis.internal.conjecture import providers

    original = providers._get_local_constants
    with fixed_constant_pool():
        assert providers._get_local_constants is not original
        assert len(providers._get_local_constants().integers) == 0
    assert providers._get_local_constants is original
