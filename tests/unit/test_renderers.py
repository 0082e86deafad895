"""Snapshot tests of every renderer on one fixed finding (a real #50062 run, stored)."""

from __future__ import annotations

import ast
import json
import re

import pytest

from kvspec.report.plot import render_svg
from kvspec.report.regression_test import ASSERT_MESSAGE, critical_steps, emit_test
from kvspec.report.finding import render_markdown, render_text
from kvspec.report.fuzz import render_markdown as render_fuzz_markdown
from kvspec.model.finding import Finding

from tests.support import FIXTURES, assert_snapshot, capabilities

FIXTURE = FIXTURES / "finding_refloor_50062.json"


@pytest.fixture
def finding() -> Finding:
    return Finding.from_dict(json.loads(FIXTURE.read_text()))


def test_text(finding):
    assert_snapshot("finding.txt", render_text(finding) + "\n")


def test_markdown(finding):
    text = render_markdown(finding, plot_path=finding.artifacts.get("plot"))
    assert text.startswith("### DISCREPANCY: under-registration")
    assert_snapshot("finding.md", text)


def _fuzz_run(finding, stopped=None):
    """A one-subject fuzz run holding ``finding``, as the fuzz command records it."""
    from kvspec.diff_tests.fuzz import FuzzResult
    from kvspec.diff_tests.property import Failure, Tally
    from kvspec.model.case import Case
    from kvspec.usecases import FuzzRun, FuzzSettings, SubjectRun

    failure = Failure(Case.from_dict(finding.inputs), (), {})
    result = FuzzResult(subject=finding.compared["subject"], capabilities=capabilities("0.33.0"), seed=1,
                        tally=Tally(cases=finding.run["cases"]), seconds=finding.run["seconds"],
                        failure=failure)
    run = FuzzRun(FuzzSettings(max_examples=500, seed=1), [finding.compared["subject"]["label"], "vllm 0.34.0"],
                  [SubjectRun(result, finding)])
    if stopped is not None:
        run.stopped, run.stopped_why = stopped
    return run


def test_fuzz_markdown(finding, monkeypatch):
    import kvspec.report.fuzz as fuzz_report

    monkeypatch.setattr(fuzz_report, "versions", lambda: finding.compared["versions"])
    run = _fuzz_run(finding)
    run.planned = run.planned[:1]
    assert_snapshot("fuzz_report.md", render_fuzz_markdown(run))


def test_an_interrupted_run_never_reads_as_clean(finding):
    from kvspec.model.outcome import Outcome

    run = _fuzz_run(finding, stopped=(Outcome.INTERRUPTED, "interrupted while fuzzing vllm 0.34.0"))
    run.subjects[0].finding = None
    run.subjects[0].result.failure = None
    text = render_fuzz_markdown(run)
    first = text.splitlines()[0]
    assert first.startswith("## kvspec fuzz: INTERRUPTED (interrupted while fuzzing vllm 0.34.0; 1 of 2")
    assert "no discrepancy found so far" in first and "| vllm 0.34.0 | | not run | | |" in text


def test_json(finding):
    assert_snapshot("finding.json", json.dumps(finding.to_dict(), indent=2, sort_keys=True) + "\n")


def test_svg_plot_is_produced_and_shows_the_loss(finding):
    svg = render_svg(finding)
    assert_snapshot("finding.svg", svg)
    lines = re.findall(r'<polyline points="([^"]+)"', svg)
    assert len(lines) == 3  # computed, subject, subject
    assert all(len(l.split()) == len(finding.sweep["n"]) for l in lines)
    assert lines[1] != lines[2]  # the spec's and the subject's lines differ
    assert "<polygon" in svg


def test_plot_needs_a_sweep(finding):
    import attrs

    with pytest.raises(ValueError, match="no sweep"):
        render_svg(attrs.evolve(finding, sweep=None))


def test_emitted_regression_test(finding):
    import attrs

    caps = attrs.evolve(capabilities("0.33.0"),
                        manager_keywords=["kv_cache_config", "max_model_len", "scheduler_block_size",
                                          "hash_block_size", "enable_caching", "use_eagle",
                                          "num_prefill_lookahead", "dcp_world_size", "log_stats"],
                        request_keywords=["request_id", "prompt_token_ids", "sampling_params",
                                          "pooling_params", "block_hasher"])
    code = emit_test(finding, caps)
    ast.parse(code)
    prompt_len, steps, expected = critical_steps(finding)
    # The critical case is the smallest single prefill the sweep saw differ.
    assert prompt_len == min(finding.sweep["differing_n"]) and len(steps) == 1
    assert f"expected = {expected!r}" in code and ASSERT_MESSAGE in code
    assert "eos_token_id" not in code  # this Request takes no such keyword
    assert len(code.splitlines()) < 100  # reviewers reject bloated tests
    assert_snapshot("regression_test.py.txt", code)


@pytest.mark.parametrize("pinned", [{"expected_hit": 4, "admissible_hits": [0, 2, 4]},
                                    {"admissible_hits": [0, 2, 4]}, {}])
def test_emitted_lookup_regression_test(finding, pinned):
    """A lookup finding's test drives the writer, then the later request, and
    pins the spec's hit (exact model) or the contract's admissible hits."""
    import attrs

    from kvspec.report.regression_test import LOOKUP_ASSERT_MESSAGE
    from kvspec.model.finding import Category

    inputs = {**finding.inputs, "probe": {"shared": 3, "extra": 2}, **pinned}
    inputs.pop("expected_calls", None)
    lookup = attrs.evolve(finding, category=Category.HIT_MISMATCH, inputs=inputs, sweep=None)
    code = emit_test(lookup, capabilities("0.33.0"))
    if not pinned:
        assert code is None  # nothing the subject pins: no test rather than a vacuous one
        return
    ast.parse(code)
    assert "list(request.all_token_ids)[:3]" in code and "range(2)" in code
    assert "def make_later_request(token_ids):" in code and LOOKUP_ASSERT_MESSAGE in code
    if "expected_hit" in pinned:
        assert "expected = 4" in code and "assert hit == expected" in code
    else:
        assert "admissible = [0, 2, 4]" in code and "assert hit in admissible" in code
    assert "a later request's prefix-cache hit (emitted by kvspec)" in code


def test_report_command_writes_every_form(tmp_path, monkeypatch):
    from kvspec.model.outcome import Outcome
    from kvspec.cli import main

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out, plot, test = tmp_path / "r.md", tmp_path / "p.svg", tmp_path / "test_x.py"
    code = main(["report", str(FIXTURE), "--format", "markdown", "--output", str(out),
                 "--plot", str(plot), "--emit-test", str(test)])
    assert code == Outcome.OK.exit_code
    assert out.read_text() == summary.read_text()
    assert out.read_text().startswith("## DISCREPANCY: under-registration")
    assert plot.read_text().startswith("<svg")
    ast.parse(test.read_text())


def test_report_of_a_file_without_findings_is_a_usage_error(tmp_path, capsys):
    from kvspec.model.outcome import Outcome
    from kvspec.cli import main

    empty = tmp_path / "prove.json"
    empty.write_text('{"schema": "kvspec.prove/1", "findings": []}')
    assert main(["report", str(empty)]) == Outcome.USAGE.exit_code
    assert "holds no finding" in capsys.readouterr().err
