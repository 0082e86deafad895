"""model.known: which releases carry which known vLLM bug, matched by
category and the discrepancy's own words."""

from __future__ import annotations

from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
from kvspec.model.finding import Category
from kvspec.model.known import KNOWN_BUGS, known_bugs, stateful_exclusions


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


def _layout(*kinds: GroupKind) -> CoordinatorConfig:
    return CoordinatorConfig(groups=tuple(KVCacheGroup(k, 4, sliding_window=4 if k is GroupKind.SLIDING_WINDOW
                                                       else 0) for k in kinds),
                             scheduler_block_size=4, hash_block_size=4)


def test_the_stateful_draw_withholds_connector_tokens_only_where_a_carried_bug_lives():
    hybrid = _layout(GroupKind.FULL_ATTENTION, GroupKind.MAMBA_ALIGN)
    attention = _layout(GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW)
    assert stateful_exclusions("0.25.1") == ()  # no connector bug known before 0.26.0
    for version in ("0.26.0", "0.28.0", "0.31.0", "0.34.0"):
        known = stateful_exclusions(version)
        assert known and all(b.carried_by(version) for b in known), version
        assert any(b.withholds_connector(hybrid) for b in known)
        assert not any(b.withholds_connector(attention) for b in known)  # the draw keeps its connector there
    assert stateful_exclusions("0.35.0.dev1+gabc") == ()  # a tree's own version: every bug may show
    assert all(b.name for b in KNOWN_BUGS if b.withholds_connector or b.draw_exclusion)
