"""Snapshot tests of every renderer on one fixed finding (a real #50062 run, stored)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from kvspec.plot import render_svg
from kvspec.regression_test import ASSERT_MESSAGE, critical_steps, emit_test
from kvspec.render_finding import render_markdown, render_text
from kvspec.render_fuzz import render_markdown as render_fuzz_markdown
from model.finding import Finding

from .snapshot import assert_snapshot

FIXTURE = Path(__file__).with_name("fixtures") / "finding_refloor_50062.json"


@pytest.fixture
def finding() -> Finding:
    return Finding.from_dict(json.loads(FIXTURE.read_text()))


def test_text(finding):
    assert_snapshot("finding.txt", render_text(finding) + "\n")


def test_markdown(finding):
    text = render_markdown(finding, plot_path=finding.artifacts.get("plot"))
    assert text.startswith("### DISCREPANCY: under-registration")
    assert_snapshot("finding.md", text)


def test_fuzz_markdown(finding):
    doc = {"schema": "kvspec.fuzz/2", "versions": finding.compared["versions"],
           "settings": {"seed": 1, "max_examples": 500},
           "subjects": [{"subject": finding.compared["subject"], "verdict": "discrepancy",
                         "cases": finding.run["cases"], "seconds": finding.run["seconds"],
                         "finding": finding.to_dict()}],
           "errors": []}
    assert_snapshot("fuzz_report.md", render_fuzz_markdown(doc))


def test_json(finding):
    assert_snapshot("finding.json", json.dumps(finding.to_dict(), indent=2, sort_keys=True) + "\n")


def test_svg_plot_is_produced_and_shows_the_loss(finding):
    svg = render_svg(finding)
    assert_snapshot("finding.svg", svg)
    lines = re.findall(r'<polyline points="([^"]+)"', svg)
    assert len(lines) == 3  # computed, spec, subject
    assert all(len(l.split()) == len(finding.sweep["n"]) for l in lines)
    assert lines[1] != lines[2]  # the spec's and the subject's lines differ
    assert "<polygon" in svg


def test_plot_needs_a_sweep(finding):
    import attrs

    with pytest.raises(ValueError, match="no sweep"):
        render_svg(attrs.evolve(finding, sweep=None))


def test_emitted_regression_test(finding):
    caps = {"per_group_eagle": True, "reprefillable_tokens": True,
            "manager_keywords": ["kv_cache_config", "max_model_len", "scheduler_block_size",
                                 "hash_block_size", "enable_caching", "use_eagle",
                                 "num_prefill_lookahead", "dcp_world_size", "log_stats"],
            "request_keywords": ["request_id", "prompt_token_ids", "sampling_params",
                                 "pooling_params", "block_hasher"]}
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

    from kvspec.regression_test import LOOKUP_ASSERT_MESSAGE
    from model.finding import Category

    inputs = {**finding.inputs, "probe": {"shared": 6, "extra": 2}, **pinned}
    inputs.pop("expected_calls", None)
    lookup = attrs.evolve(finding, category=Category.HIT_MISMATCH, inputs=inputs, sweep=None)
    code = emit_test(lookup, {"per_group_eagle": True, "reprefillable_tokens": True})
    if not pinned:
        assert code is None  # nothing the spec pins: no test rather than a vacuous one
        return
    ast.parse(code)
    assert "list(request.all_token_ids)[:6]" in code and "range(2)" in code
    assert "def make_later_request(token_ids):" in code and LOOKUP_ASSERT_MESSAGE in code
    if "expected_hit" in pinned:
        assert "expected = 4" in code and "assert hit == expected" in code
    else:
        assert "admissible = [0, 2, 4]" in code and "assert hit in admissible" in code
    assert "a later request's prefix-cache hit (emitted by kvspec)" in code


def test_report_command_writes_every_form(tmp_path, monkeypatch):
    from kvspec import exitcodes
    from kvspec.cli import main

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out, plot, test = tmp_path / "r.md", tmp_path / "p.svg", tmp_path / "test_x.py"
    code = main(["report", str(FIXTURE), "--format", "markdown", "--output", str(out),
                 "--plot", str(plot), "--emit-test", str(test)])
    assert code == exitcodes.OK
    assert out.read_text() == summary.read_text()
    assert out.read_text().startswith("## DISCREPANCY: under-registration")
    assert plot.read_text().startswith("<svg")
    ast.parse(test.read_text())


def test_report_of_a_file_without_findings_is_a_usage_error(tmp_path, capsys):
    from kvspec import exitcodes
    from kvspec.cli import main

    empty = tmp_path / "prove.json"
    empty.write_text('{"schema": "kvspec.prove/1", "findings": []}')
    assert main(["report", str(empty)]) == exitcodes.USAGE
    assert "holds no finding" in capsys.readouterr().err
