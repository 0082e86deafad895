"""vLLM's own tests asked first, and proved figures printed with their bounds.

A finding that a test of the release already catches names that test and
offers no test of kvspec's own; one no test catches says the suite passed on
it and proposes the test for the release's module of the area.  A proved
worst case is printed with the bounds it was proved over, and never as if it
covered a finding outside them."""

from __future__ import annotations

import json

import attrs
import pytest

from kvspec.model.finding import Finding
from kvspec.proofs.explain import worst_case_scope
from kvspec.report.finding import render_markdown, render_text
from kvspec.findings.vllm_suite import caught_by, covering_module
from kvspec.emit.vllm_tests import SUITE
from kvspec.subjects.testrun import junit_outcomes

from tests.support import FIXTURES, VLLM_CATCHER, asked_vllm_tests as _asked

CATCHER = VLLM_CATCHER


@pytest.fixture
def finding() -> Finding:
    return Finding.from_dict(json.loads((FIXTURES / "finding_refloor_50062.json").read_text()))


def test_a_failure_counts_only_when_the_release_passes_it():
    here = {"failed": ["a.py::t1", "a.py::t2"], "errors": ["a.py::t3"]}
    assert caught_by(here, {"outcome": "failed", "failed": ["a.py::t2"], "errors": []}) == ["a.py::t1", "a.py::t3"]
    # A release run that did not finish says nothing passes there.
    assert caught_by(here, {"outcome": "error", "failed": [], "errors": []}) == []
    # A tree has no release to compare with: every failure of its tests counts
    # (an error, perhaps the test environment's, does not).
    assert caught_by(here, None) == ["a.py::t1", "a.py::t2"]


def test_the_test_that_names_the_behaviour_comes_first(tmp_path, monkeypatch):
    from kvspec.findings import vllm_suite

    def fake(subject, root, files, env=None):
        return {"against": "s", "outcome": "failed", "errors": [], "skipped": [],
                "failed": ["t.py::test_dcp[a]", "t.py::test_eagle_tail"],
                "passed": ["t.py::test_dcp[b]", "t.py::test_dcp[c]", "t.py::test_other"]}

    monkeypatch.setattr("kvspec.subjects.testrun.run_pytest_files", fake)
    run = vllm_suite._run(None, tmp_path, [])
    assert run["failed"] == ["t.py::test_eagle_tail", "t.py::test_dcp[a]"]
    assert (run["passed"], run["tests"]) == (3, 5)


def test_a_finding_vllm_already_catches_offers_no_test_of_its_own(finding):
    caught = attrs.evolve(finding, vllm_tests=_asked([CATCHER]),
                          regression_test={**finding.regression_test, "proposed": False, "verified": []})
    text, markdown = render_text(caught), render_markdown(caught)
    assert f"already caught by {CATCHER}: it fails on the subject and passes on the release" in text
    assert "the test kvspec emitted for tests/v1/core/test_prefix_cache_registration.py: not proposed" in text
    assert "recorded 2026-12-06 17:27 UTC, reused" in text
    assert f"pytest '{CATCHER}'" in text and "test_cache_blocks_bound" not in text
    assert "Add as `tests/v1/core/" not in markdown and "```python" not in markdown
    assert f"Already caught by {CATCHER}" in markdown
    # The same finding without vLLM's answer proposes kvspec's test, as before.
    assert "```python" in render_markdown(finding)


def test_a_finding_no_vllm_test_catches_is_proposed_for_the_releases_module(finding):
    module = "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py"
    missed = attrs.evolve(finding, vllm_tests=_asked([]),
                          regression_test={**finding.regression_test, "module": module})
    text = render_text(missed)
    assert "not caught by vLLM's tests: its 313 CPU tests of these files pass on it" in text
    assert f"to merge into {module} (the release's module that already covers this)" in text
    assert "```python" in render_markdown(missed)


def test_a_node_id_from_a_file_is_shown_only_when_it_reads_as_one(finding):
    hostile = attrs.evolve(finding, vllm_tests=_asked(["tests/x.py::t; rm -rf /"], failed_here=["x"]))
    text = render_text(hostile)
    assert "rm -rf" not in text and "already caught" not in text


def test_the_module_that_covers_the_area_is_read_from_the_releases_tests(tmp_path):
    for name, body in ((SUITE[0], "x.cache_blocks(); y.cache_blocks()\n"), (SUITE[1], "cache_blocks\n"),
                       (SUITE[3], "get_computed_blocks\n")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    assert covering_module(tmp_path) == SUITE[0]
    assert covering_module(tmp_path, "get_computed_blocks") == SUITE[3]
    assert covering_module(None) is None
    # An engine finding's test extends vLLM's tests of the Scheduler where the
    # cached copy keeps them (one cached before they were kept falls back).
    from kvspec.emit.vllm_tests import SCHEDULER_TESTS
    from kvspec.findings.vllm_suite import engine_test_module

    assert engine_test_module(tmp_path, "get_computed_blocks") == SUITE[3]
    (tmp_path / SCHEDULER_TESTS).write_text("def test_schedule(): ...\n")
    assert engine_test_module(tmp_path, "get_computed_blocks") == SCHEDULER_TESTS
    assert engine_test_module(None, "get_computed_blocks") is None


def testjunit_outcomes_give_pytest_node_ids(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.v1.core.test_a" file="tests/v1/core/test_a.py" name="test_ok[1-2]"/>'
        '<testcase classname="tests.v1.core.test_a.TestK" file="tests/v1/core/test_a.py" name="test_bad">'
        '<failure message="assert"/></testcase>'
        '<testcase classname="tests.v1.core.test_a" file="tests/v1/core/test_a.py" name="test_err">'
        '<error message="boom"/></testcase>'
        '</testsuite></testsuites>')
    assert junit_outcomes(str(report)) == {
        "tests/v1/core/test_a.py::test_ok[1-2]": "passed",
        "tests/v1/core/test_a.py::TestK::test_bad": "failed",
        "tests/v1/core/test_a.py::test_err": "error"}


# -- stated bounds --------------------------------------------------------------

def test_the_worst_case_scope_of_a_finding_outside_its_bounds():
    inside, outside = worst_case_scope("regression_50062", 64, 2), worst_case_scope("regression_50062", 1120, 560)
    assert (inside.bounds, inside.covers, inside.here) == ("S <= 64", True, None)
    assert (outside.bounds, outside.covers) == ("S <= 64", False)
    assert "S - 1 - B = 559 tokens per call" in outside.here
    assert worst_case_scope("no_such_variant", 8, 2) is None


def _at(finding: Finding, S: int, B: int, recorded: bool) -> Finding:
    """The fixture's finding moved to scheduler block S (its differing group's block B)."""
    config = {**finding.inputs["config"], "scheduler_block_size": S}
    groups = tuple(attrs.evolve(g, block_size=B) if g.differs else g for g in finding.groups)
    explanation = finding.explanation
    if recorded:
        scope = worst_case_scope("regression_50062", S, B)
        explanation = attrs.evolve(explanation, worst_case_bounds=scope.bounds, worst_case_covers=scope.covers,
                                   worst_case_here=scope.here)
    return attrs.evolve(finding, inputs={**finding.inputs, "config": config}, groups=groups,
                        explanation=explanation)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "stored-before-bounds"])
def test_a_proved_worst_case_is_never_printed_beside_a_finding_it_does_not_cover(finding, recorded):
    outside = render_text(_at(finding, 1120, 560, recorded))
    assert ("worst case (PROVED) covers only S <= 64; this finding's S = 1120 is outside it, so its figure "
            "does not apply here; instead, at this finding's S = 1120 and B = 560") in outside
    assert "62 tokens per call" not in outside
    inside = render_text(_at(finding, 3, 1, recorded))
    assert ("worst case (PROVED over S <= 64, which covers this finding's S = 3): over S <= 64, #50062 loses "
            "at most S_max - 2 = 62 tokens per call") in inside
    assert "62 tokens per call" not in render_markdown(_at(finding, 1120, 560, recorded))


def test_an_emitted_test_is_laid_out_beside_the_helpers_not_the_suite(tmp_path):
    from kvspec.emit.vllm_tests import HELPER_FILE, verification_tree

    root = tmp_path / "sdist"
    for name in (HELPER_FILE, *SUITE):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("# x\n")
    test = verification_tree(tmp_path / "out", root, "test_new.py", "def test_x():\n    pass\n")
    assert test.read_text().startswith("def test_x") and (tmp_path / "out" / HELPER_FILE).is_file()
    assert not any((tmp_path / "out" / name).exists() for name in SUITE)
