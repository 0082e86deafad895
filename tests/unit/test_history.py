"""`kvspec history`: release selection and the rule each era's capabilities select."""

from __future__ import annotations

import pytest

from kvspec.arguments import releases
from kvspec.model.capabilities import Capabilities
from kvspec.model.errors import UsageError
from kvspec.report.history import ReleaseRow, render_table

from tests.support import capabilities

PUBLISHED = ["0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0",
             "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]


def test_a_range_takes_the_published_releases_between_its_ends():
    chosen = releases(["0.25.1..0.28.0"], published=lambda: PUBLISHED)
    assert chosen == ["0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0"]


def test_releases_and_ranges_combine_sorted_without_repeats():
    chosen = releases(["0.33.0", "0.32.0..0.33.0", "0.23.0"], published=lambda: PUBLISHED)
    assert chosen == ["0.23.0", "0.32.0", "0.33.0"]


@pytest.mark.parametrize("selector, why", [
    ("0.33", "give a release"), ("latest", "give a release"),
    ("0.33.0..0.23.0", "the range is empty (its low end is after its high end)"),
    ("0.23.0...0.33.0", "give a release"),
    ("0.35.0..0.40.0", "no final release of vLLM on the package index lies in that range"),
])
def test_bad_selectors_are_usage_errors_that_say_why(selector, why):
    with pytest.raises(UsageError, match=".*") as info:
        releases([selector], published=lambda: PUBLISHED)
    assert why in str(info.value)


def test_each_era_names_its_rule():
    assert capabilities("0.23.0").rule_text().startswith("floor to S")
    assert capabilities("0.26.0").rule_text().endswith("f = n")
    newest = capabilities("0.33.0").rule_text()
    assert "f = n - max(0, L - 1)" in newest and "get_num_cacheable_tokens" in newest


def test_table_rows_for_each_status():
    caps = Capabilities(lookahead_block_hashes=False).as_dict()
    rows = [{"version": "0.22.1", "status": "unsupported", "detail": "too old"},
            {"version": "0.33.0", "status": "conforms", "cases": 10, "rule": "r", "capabilities": caps,
             "failure": None, "lookup": {"cases": 7, "failure": None}},
            {"version": "0.34.0", "status": "discrepancy", "cases": 10, "rule": "r", "capabilities": caps,
             "failure": None, "lookup": {"cases": 3, "failure": {"summary": ["hit 4 vs 8"]}}}]
    table = render_table([ReleaseRow.parse(r) for r in rows], symbolic=False)
    assert "| 0.22.1 |  |  |  |  |  | unsupported: too old |  |" in table
    assert ("| 0.33.0 | yes | yes | yes | no | r | no discrepancy (10 cases) | no discrepancy (7 cases) | "
            "not run |") in table
    assert "| 0.34.0 | yes | yes | yes | no | r | no discrepancy (10 cases) | DISCREPANCY: hit 4 vs 8 |" in table
    assert "conforms" not in table  # a column says what it compared, never a blanket verdict


def test_a_run_that_stopped_early_is_never_no_discrepancy():
    caps = Capabilities().as_dict()
    stopped = {"cases": 80, "examples": 3, "operations": 80, "failure": None, "outcome": "INFRASTRUCTURE",
               "stopped": "the worker died twice"}
    rows = [{"version": "0.30.0", "status": "incomplete", "cases": 10, "rule": "r", "capabilities": caps,
             "failure": None, "overall": "INFRASTRUCTURE", "lookup": {"cases": 7, "failure": None},
             "stateful": stopped}]
    table = render_table([ReleaseRow.parse(r) for r in rows], symbolic=False)
    assert "INCOMPLETE after 3 programs, 80 operations: the worker died twice" in table
    assert "no invariant broken" not in table


def test_each_history_finding_is_explained_by_a_known_bug_of_its_release_or_said_unexplained():
    from kvspec.report.history import render_explanations

    def row(version, category, summary):
        failure = {"category": category, "summary": [summary]}
        return {"version": version, "status": "discrepancy", "failure": None, "lookup": {"failure": None},
                "stateful": {"failure": None}, "engine": {"failure": failure, "other_failures": []}}

    estimate = "state_block_estimate: block_estimate: allocate_slots for request r0 took 6 free blocks"
    text = render_explanations([ReleaseRow.parse(r) for r in (
        row("0.34.0", "state_block_estimate", estimate),
        row("0.34.0", "state_ref_count", "ref_counts: block 3 has reference count 2"),
        row("0.22.0", "state_block_estimate", estimate))])
    lines = text.splitlines()
    assert "`mamba_estimate_below_allocation_after_connector_load` (first in 0.23.0, still open)" in lines[0]
    # Unknown words, or a release outside the bug's range: not explained, and said so.
    assert "not explained by a known bug" in lines[1] and "not explained by a known bug" in lines[2]


def _run(outcome="OK", operations=None):
    from types import SimpleNamespace

    from kvspec.model.outcome import Outcome

    return SimpleNamespace(cases=120, examples=100, seconds=1.234, failure=None, outcome=Outcome[outcome],
                           stopped_why="", other_failures=(), settings={"x": 1},
                           tally=SimpleNamespace(operations=operations, refused=0), scope=lambda: "scope")


def test_a_history_row_is_typed_and_serialises_to_the_rows_of_kvspec_history_1():
    from kvspec.model.outcome import Outcome
    from kvspec.usecases.history import HistoryRow

    skipped = HistoryRow("0.22.0", not_run="unsupported", detail="no scheduler_block_size")
    assert skipped.as_dict() == {"version": "0.22.0", "status": "unsupported", "detail": "no scheduler_block_size"}
    assert skipped.overall is None
    row = HistoryRow("0.33.0", _run(), _run(), _run(operations=7), _run("INCOMPLETE", operations=9),
                     capabilities("0.33.0"))
    assert (row.status, row.overall) == ("incomplete", Outcome.INCOMPLETE)
    data = row.as_dict()
    assert set(data) == {"version", "status", "overall", "capabilities", "rule", "cases", "examples", "seconds",
                         "failure", "outcome", "stopped", "lookup", "stateful", "engine"}
    assert (data["overall"], data["seconds"], data["lookup"]["status"]) == ("INCOMPLETE", 1.23, "no discrepancy")
    assert data["engine"]["status"] == "incomplete" and data["engine"]["operations"] == 9
    table = render_table([ReleaseRow.parse(data), ReleaseRow.parse(skipped.as_dict())], symbolic=False)
    assert "INCOMPLETE after 100 programs, 9 operations: INCOMPLETE" in table and "| 0.22.0 |" in table
