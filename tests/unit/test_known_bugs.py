"""model.known: which releases carry which known vLLM bug, matched by
category and the discrepancy's own words."""

from __future__ import annotations

from kvspec.model.finding import Category
from kvspec.model.known import KNOWN_BUGS, known_bugs


def test_release_ranges_are_half_open():
    hit_groups = [b for b in KNOWN_BUGS if b.category is Category.STATE_HIT_GROUPS]
    assert hit_groups and all(b.fixed_in == "0.29.0" for b in hit_groups)
    assert known_bugs("0.28.0", Category.STATE_HIT_GROUPS)
    assert not known_bugs("0.29.0", Category.STATE_HIT_GROUPS)
    assert not known_bugs("0.22.0", Category.STATE_HIT_GROUPS)


def test_a_crash_matches_only_by_its_own_words():
    crash = "subject_crash: vLLM raised during schedule: ValueError: Cannot get 1 free blocks from the pool"
    assert known_bugs("0.28.0", Category.SUBJECT_CRASH, crash)
    other = "subject_crash: vLLM raised during schedule: KeyError: 'r3'"
    assert known_bugs("0.28.0", Category.SUBJECT_CRASH, other) == []


def test_anything_but_a_release_number_carries_nothing():
    assert known_bugs(None) == [] and known_bugs("0.34.0.dev3+gabc") == [] and known_bugs("main") == []
    assert all(b.summary and b.signature for b in KNOWN_BUGS)
