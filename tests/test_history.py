"""`kvspec history`: release selection and the rule each era's capabilities select."""

from __future__ import annotations

import pytest

from kvspec.cli import UsageError
from kvspec.history_command import expand, render_table, rule_in_force

PUBLISHED = ["0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0",
             "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]


def test_a_range_takes_the_published_releases_between_its_ends():
    chosen = expand(["0.25.1..0.28.0"], published=lambda: PUBLISHED)
    assert chosen == ["0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0"]


def test_releases_and_ranges_combine_sorted_without_repeats():
    chosen = expand(["0.33.0", "0.32.0..0.33.0", "0.23.0"], published=lambda: PUBLISHED)
    assert chosen == ["0.23.0", "0.32.0", "0.33.0"]


@pytest.mark.parametrize("selector", ["0.33", "latest", "0.33.0..0.23.0", "0.23.0...0.33.0"])
def test_bad_selectors_are_usage_errors(selector):
    with pytest.raises(UsageError):
        expand([selector], published=lambda: PUBLISHED)


def test_each_era_names_its_rule():
    assert rule_in_force({"partial_hash_hits": False}).startswith("floor to S")
    assert rule_in_force({"partial_hash_hits": True}).endswith("f = n")
    lookahead = rule_in_force({"partial_hash_hits": True, "reprefillable_tokens": True,
                               "get_num_cacheable_tokens": True})
    assert "f = n - max(0, L - 1)" in lookahead and "get_num_cacheable_tokens" in lookahead


def test_table_rows_for_each_status():
    caps = {"partial_hash_hits": True, "reprefillable_tokens": True, "per_group_eagle": True,
            "lookahead_block_hashes": False, "get_num_cacheable_tokens": True}
    rows = [{"version": "0.22.1", "status": "unsupported", "detail": "too old"},
            {"version": "0.33.0", "status": "conforms", "cases": 10, "rule": "r", "capabilities": caps,
             "failure": None, "lookup": {"cases": 7, "failure": None}},
            {"version": "0.34.0", "status": "discrepancy", "cases": 10, "rule": "r", "capabilities": caps,
             "failure": None, "lookup": {"cases": 3, "failure": {"summary": ["hit 4 vs 8"]}}}]
    table = render_table(rows, symbolic=False)
    assert "| 0.22.1 |  |  |  |  |  | unsupported: too old |  |" in table
    assert "| 0.33.0 | yes | yes | yes | no | r | conforms (10 cases) | conforms (7 cases) |" in table
    assert "| 0.34.0 | yes | yes | yes | no | r | conforms (10 cases) | DISCREPANCY: hit 4 vs 8 |" in table
