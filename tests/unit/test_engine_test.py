"""An engine finding's regression test (``kvspec.emit.engine_test``),
without vLLM: written from the upstream script's validated values and its
engine code (one translation of an engine program, not two), named after
the behaviour, asserting what the finding measured, naming neither kvspec
nor the finding; a kind no test is written for says why."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from kvspec.emit.engine_test import ENGINE_TEST_KINDS, engine_test_code
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding
from kvspec.subjects.upstream_repro import ENGINE_CODE, Unscriptable, repro_script

FIXTURE = Path(__file__).parent.parent / "fixtures" / "finding_engine_mamba_estimate_0.34.0.json"


def _finding(category: Category | None = None) -> Finding:
    finding = Finding.from_dict(json.loads(FIXTURE.read_text()))
    return finding if category is None else attrs.evolve(finding, category=category)


def _shared(code: str) -> str:
    """The engine code of a generated file: from the model's config.json to the driver's end."""
    start = code.index("# The toy model's config.json")
    return code[start:code.index("            execute(*queue.pop())\n", start)]


@pytest.mark.parametrize("category, name, check", [
    (Category.STATE_BLOCK_ESTIMATE, "test_block_estimate_covers_allocate_slots", "watch_estimates(scheduler)"),
    (Category.STATE_WINDOW, "test_sliding_window_keeps_the_blocks_its_next_step_reads",
     "drive(scheduler, OPS, check=assert_window_held)"),
    (Category.SUBJECT_CRASH, "test_scheduler_step_does_not_raise", "drive(scheduler, OPS)"),
])
def test_the_test_is_the_scripts_engine_code_with_the_findings_assertion(category, name, check):
    finding = _finding(category)
    code = engine_test_code(finding, "0.34.0")
    compile(code, f"{name}.py", "exec")
    assert f"\ndef {name}(tmp_path):\n    scheduler = make_scheduler(str(tmp_path))\n" in code
    assert check in code and "kvspec" not in code and "finding" not in code.lower()
    assert "print(" not in code and "os.environ" not in code  # a test, not a script
    # One translation of the engine program: the script's, byte for byte.
    if category in (Category.STATE_BLOCK_ESTIMATE, Category.SUBJECT_CRASH):
        script = repro_script(EngineProgram.from_dict(finding.inputs["engine_program"]),
                              finding.run["engine_settings"], category, "0.34.0")
        assert _shared(code) == _shared(script.code)
    assert _shared(code).startswith(ENGINE_CODE.split("@", 1)[0])
    assert "NUM_BLOCKS = 22" in code and '("mamba_align", 64, 0, 1)' in code
    assert ("(add_request, schedule, update_from_output" in ENGINE_CODE
            or "update_from_output" in _shared(code))


def test_the_window_assertion_says_the_window_in_vllms_words():
    code = engine_test_code(_finding(Category.STATE_WINDOW), "0.34.0")
    assert '"a running request\'s sliding-window block table must hold real blocks "' in code
    assert "max(0, num_processed - window + 1) // block_size" in code
    assert all(len(line) <= 88 for line in code.splitlines())


def test_a_kind_without_a_test_says_why():
    other = next(c for c in Category if c.value.startswith("state_") and c not in ENGINE_TEST_KINDS)
    with pytest.raises(Unscriptable, match=f"no engine regression test for {other.value} findings yet"):
        engine_test_code(_finding(other), "0.34.0")
    with pytest.raises(Unscriptable, match="published release"):
        engine_test_code(_finding(Category.STATE_WINDOW), "a-tree")


def test_the_report_folds_the_test_anew_with_both_runs_and_its_command():
    """The Markdown shows the test emitted anew from the finding's validated
    inputs (never the stored code), both runs and the pytest command."""
    from kvspec.report.finding import render_markdown, render_text

    window = FIXTURE.parent / "finding_engine_window_frees_early_0.34.0.json"
    finding = Finding.from_dict(json.loads(window.read_text()))
    name = "test_sliding_window_keeps_the_blocks_its_next_step_reads"
    runs = [{"against": "vllm 0.34.0 + window_frees_early", "must": "failed", "outcome": "failed",
             "failure": "the test's assertion", "as_expected": True},
            {"against": "unmutated vllm 0.34.0", "must": "passed", "outcome": "passed", "as_expected": True}]
    finding = attrs.evolve(finding, regression_test={
        "test_name": name, "module": None, "proposed": True, "code": "import os  # stored, not shown",
        "verified": runs, "other_side": None, "lint": {"outcome": "passed"}})
    markdown = render_markdown(finding)
    assert f"Add as `tests/v1/core/{name}.py` of vLLM" in markdown and "# stored, not shown" not in markdown
    assert engine_test_code(finding, "0.34.0") in markdown
    assert (f"Regression test {name}, for tests/v1/core: failed on the test's assertion on vllm 0.34.0 + "
            "window_frees_early; passed on unmutated vllm 0.34.0; ruff check and ruff format --check with the "
            "release's configuration: passed") in markdown
    assert f"pytest tests/v1/core/{name}.py::{name}" in markdown
    assert f"regression test {name}" in render_text(finding)
    # Not proposed (it did not fail as the finding did): said, not folded.
    unoffered = attrs.evolve(finding, regression_test={**finding.regression_test, "proposed": False,
                                                       "why_not_proposed": "it did not fail on X as the finding did"})
    markdown = render_markdown(unoffered)
    assert "not proposed: it did not fail on X as the finding did" in markdown and "```python" not in markdown


def test_with_no_verify_test_the_test_is_written_not_offered(tmp_path):
    from kvspec.findings.engine import with_engine_test
    from kvspec.subjects.subject import mutant_subject

    window = FIXTURE.parent / "finding_engine_window_frees_early_0.34.0.json"
    finding = with_engine_test(Finding.from_dict(json.loads(window.read_text())), tmp_path / "f.json",
                               mutant_subject("0.34.0", "window_frees_early"), verify=False)
    test = finding.regression_test
    assert test["proposed"] is False and test["why_not_proposed"] == "not run (--no-verify-test)"
    assert (tmp_path / "f" / test["file_name"]).read_text() == test["code"] and not test["verified"]
    # A kind no test is written for says why, and nothing is written.
    other = with_engine_test(_finding(Category.STATE_LEAK), tmp_path / "g.json",
                             mutant_subject("0.34.0", "window_frees_early"), verify=False)
    assert other.regression_test["why_not_proposed"].startswith("no test written: no engine regression test for "
                                                                "state_leak findings yet")
    assert not (tmp_path / "g").exists()
