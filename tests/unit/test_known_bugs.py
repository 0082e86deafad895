"""model.known: which releases carry which known vLLM bug, matched by
category and the discrepancy's own words."""

from __future__ import annotations

from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
from kvspec.model.finding import Category
from kvspec.model.known import KNOWN_BUGS, known_bugs, recognise, recognise_all


def test_release_ranges_are_half_open():
    hit_groups = {b.name: (b.first, b.fixed_in) for b in KNOWN_BUGS if b.category is Category.STATE_HIT_GROUPS}
    assert hit_groups == {"second_full_attention_group_untrimmed": ("0.23.0", "0.29.0"),
                          "hybrid_lookup_full_attention_short_of_mamba_hit": ("0.23.0", "0.26.0"),
                          "connector_lookup_takes_deepest_group_hit": ("0.24.0", "0.27.0")}
    assert [b.name for b in known_bugs("0.28.0", Category.STATE_HIT_GROUPS)] == ["second_full_attention_group_untrimmed"]
    assert len(known_bugs("0.25.1", Category.STATE_HIT_GROUPS)) == 3
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


def test_one_bug_one_identity_by_its_mechanism():
    """The Mamba estimate after a connector load is one bug: the broken
    estimate and the crash it causes with the pool tight both show it, on
    every supported release."""
    (bug,) = [b for b in KNOWN_BUGS if b.name == "mamba_estimate_below_allocation_after_connector_load"]
    estimate = "state_block_estimate: block_estimate: allocate_slots for request r0 took 4 free blocks; the groups estimated 3"
    crash = "subject_crash: vLLM raised during schedule: ValueError: Cannot get 2 free blocks from the pool"
    for version in ("0.23.0", "0.28.0", "0.34.0"):
        assert bug in known_bugs(version, Category.STATE_BLOCK_ESTIMATE, estimate)
        assert bug in known_bugs(version, Category.SUBJECT_CRASH, crash)
    assert bug not in known_bugs("0.22.0")
    assert not [b for b in KNOWN_BUGS if "free blocks from the pool" in b.signature and b is not bug]


def test_a_broken_estimate_is_the_known_bug_only_when_mamba_groups_broke_it():
    """The identity is the mechanism: an estimate a full-attention or sliding
    window group broke is another bug, whatever the words around it."""
    head = "block_estimate: allocate_slots for request r0 took 6 free blocks; the groups estimated 4 (1, 1, 2); "
    mamba = head + "group 0 (mamba_align) took 2 against its estimate 1, group 1 (mamba_align) took 2 against its estimate 1"
    window = head + "group 2 (sliding_window) took 3 against its estimate 2"
    mixed = head + "group 0 (mamba_align) took 2 against its estimate 1, group 2 (full_attention) took 3 against its estimate 2"
    assert [b.name for b in known_bugs("0.34.0", Category.STATE_BLOCK_ESTIMATE, mamba)] == [
        "mamba_estimate_below_allocation_after_connector_load"]
    assert known_bugs("0.34.0", Category.STATE_BLOCK_ESTIMATE, window) == []
    assert known_bugs("0.34.0", Category.STATE_BLOCK_ESTIMATE, mixed) == []
    crash = ("subject_crash: vLLM raised during engine step through the real Scheduler: ValueError: Cannot get 2 "
             "free blocks from the pool (in allocate_slots for request r1; group {}) asked for 2 against its estimate 1)")
    assert known_bugs("0.34.0", Category.SUBJECT_CRASH, crash.format("0 (mamba_align")) != []
    assert known_bugs("0.34.0", Category.SUBJECT_CRASH, crash.format("1 (full_attention")) == []


def test_a_crash_inside_allocate_slots_names_the_groups_that_asked_for_more_than_they_estimated():
    from kvspec.diff_tests.engine import engine_crash

    groups = (KVCacheGroup(GroupKind.MAMBA_ALIGN, 16), KVCacheGroup(GroupKind.FULL_ATTENTION, 16))
    from kvspec.model.replies import AllocationSeen, ErrorKind, WorkerError

    error = WorkerError(ErrorKind.DRIVE, "ValueError: Cannot get 2 free blocks from the pool")
    allocations = (AllocationSeen("r0", (1, 1), 9, 7, taken=(1, 1), allocated=True),
                   AllocationSeen("r1", (1, 1), 1, None, taken=(2, 0)))
    crash = engine_crash({"do": "step"}, error, allocations, groups)
    assert crash.detail.endswith(
        "(in allocate_slots for request r1; group 0 (mamba_align) asked for 2 against its estimate 1)")
    assert crash.group_kinds == (GroupKind.MAMBA_ALIGN,)
    # Raised elsewhere (the last allocation completed), or nothing observed: the words alone.
    assert engine_crash({"do": "step"}, error, allocations[:1], groups).detail.endswith("from the pool")
    assert engine_crash({"do": "step"}, error, (), groups).detail.endswith("from the pool")


def test_a_failure_is_recognised_only_if_all_of_it_is_one_known_bug():
    from kvspec.oracles.registration import Discrepancy

    known = known_bugs("0.34.0")
    crash = Discrepancy(Category.SUBJECT_CRASH, None, None,
                        detail="vLLM raised during schedule: ValueError: Cannot get 2 free blocks from the pool")
    other = Discrepancy(Category.STATE_REF_COUNT, None, None, detail="ref_counts: block 3 has reference count 2")
    assert recognise(known, [crash]).name == "mamba_estimate_below_allocation_after_connector_load"
    assert recognise(known, [crash, other]) is None
    assert recognise((), [crash]) is None and recognise(known, []) is None


def test_a_step_that_breaks_two_known_bugs_is_both_of_them():
    """0.28.0's engine fuzz (seed 0) met a step breaking the second
    full-attention group's trim and #46892's estimate at once: neither bug
    alone is all of it, so it was shrunk as new; together they are."""
    from kvspec.oracles.registration import Discrepancy

    known = known_bugs("0.28.0")
    crash = Discrepancy(Category.SUBJECT_CRASH, None, None,
                        detail="vLLM raised during schedule: ValueError: Cannot get 2 free blocks from the pool")
    untrimmed = Discrepancy(Category.STATE_HIT_GROUPS, None, None, detail="hit_groups: request r2: group 2 "
                            "(full_attention(block 32, EAGLE)) holds 2 blocks for a hit of 0 tokens",
                            group_kinds=(GroupKind.FULL_ATTENTION,))
    other = Discrepancy(Category.STATE_REF_COUNT, None, None, detail="ref_counts: block 3 has reference count 2")
    assert recognise(known, [crash, untrimmed]) is None
    assert [b.name for b in recognise_all(known, [crash, untrimmed])] == [
        "mamba_estimate_below_allocation_after_connector_load", "second_full_attention_group_untrimmed"]
    assert recognise_all(known, [crash, untrimmed, other]) == () and recognise_all(known, []) == ()
    assert recognise_all(known, [crash]) == (recognise(known, [crash]),)


def test_an_untrimmed_group_is_the_known_bug_only_when_it_is_full_attention():
    line = "hit_groups: request r1: group 1 ({}) returned 3 blocks for a hit of 32 tokens; every group must hold cdiv(hit, 16) = 2"
    full = line.format("full_attention(block 16)")
    window = line.format("sliding_window(block 16, window 32)")
    assert [b.name for b in known_bugs("0.28.0", Category.STATE_HIT_GROUPS, full)] == ["second_full_attention_group_untrimmed"]
    assert known_bugs("0.28.0", Category.STATE_HIT_GROUPS, window) == []


def test_the_mechanism_is_matched_as_data_and_read_from_words_only_for_old_records():
    """A discrepancy carries the kinds of the groups its rule names; the known
    bug is recognised by them, not by its words.  A summary recorded before
    the kinds were carried has them read back from its words."""
    from kvspec.oracles.registration import Discrepancy

    detail = "block_estimate: allocate_slots for request r0 took 4 free blocks; the groups estimated 3 (1, 2)"
    mamba = Discrepancy(Category.STATE_BLOCK_ESTIMATE, None, None, detail=detail, group_kinds=("mamba_align",))
    window = Discrepancy(Category.STATE_BLOCK_ESTIMATE, None, None, detail=detail,
                         group_kinds=(GroupKind.SLIDING_WINDOW,))
    (bug,) = [b for b in KNOWN_BUGS if b.name == "mamba_estimate_below_allocation_after_connector_load"]
    assert recognise((bug,), [mamba]) is bug
    assert recognise((bug,), [window]) is None  # the same words, another mechanism
    # Stored and read back, the kinds stay data.
    assert mamba.as_dict()["group_kinds"] == ["mamba_align"]
    assert Discrepancy(**{**mamba.as_dict(), "registrations": ()}).group_kinds == (GroupKind.MAMBA_ALIGN,)
    # An old record: the words name the groups.
    old = detail + "; group 1 (sliding_window) took 3 against its estimate 2"
    assert not bug.matches(old, Category.STATE_BLOCK_ESTIMATE)
    assert bug.matches(old.replace("sliding_window", "mamba_align"), Category.STATE_BLOCK_ESTIMATE)


def test_a_bare_assertion_is_named_by_the_vllm_function_that_raised_it():
    from kvspec.diff_tests.engine import engine_crash
    from kvspec.model.replies import ErrorKind, WorkerError

    bare = WorkerError(ErrorKind.DRIVE, "AssertionError: ", origin="vllm",
                       where="kv_cache_manager.py:792 in truncate_computed_blocks")
    said = engine_crash({"do": "step"}, bare).summary()
    assert said.endswith("AssertionError (raised in truncate_computed_blocks, kv_cache_manager.py)"), said
    [bug] = known_bugs("0.27.1", Category.SUBJECT_CRASH, said)
    assert bug.name == "truncate_asserts_mamba_group_covers_connector_hit"
    assert not known_bugs("0.28.0", Category.SUBJECT_CRASH, said)  # 0.28.0 clamps a Mamba group
    # An exception that says what happened is said as it is, where it came from not added.
    said = engine_crash({"do": "step"}, WorkerError(ErrorKind.DRIVE, "KeyError: 'r3'", origin="vllm",
                                                    where="scheduler.py:10 in schedule")).summary()
    assert said.endswith("KeyError: 'r3'")


def test_the_sliding_window_zeroing_bug_is_not_a_full_attention_groups_miss():
    """sliding_window_blocks_not_zeroed is about sliding-window groups (the
    managers' exact list of full-attention spec types): a full-attention
    group's missed zeroing is not it, from the violation's kinds or from a
    recorded summary's words alike."""
    said = ("state_zeroing_missed: zeroing_missed: request r2, group 3 (full_attention(block 32)): block 4, new in "
            "slot 0 and not a cache hit, was not handed out for zeroing (after step)")
    assert known_bugs("0.25.0", Category.STATE_ZEROING_MISSED, said) == []
    window = said.replace("full_attention(block 32)", "sliding_window(block 1, window 1)")
    [bug] = known_bugs("0.25.0", Category.STATE_ZEROING_MISSED, window)
    assert bug.name == "sliding_window_blocks_not_zeroed"
    assert known_bugs("0.25.0", Category.STATE_ZEROING_MISSED, said, (GroupKind.FULL_ATTENTION,)) == []


def test_a_full_attention_group_short_of_the_hit_is_its_own_bug_by_the_lookup_that_answered():
    """A full-attention group holding fewer blocks than the hit (tokens
    counted computed without their KV) is not the second group left
    untrimmed (more blocks than the hit): the hybrid lookup's and the
    connector's per-group lookup's are told apart by the state rule's words,
    which name the lookup."""
    short = ("state_hit_groups: hit_groups: request r1: group 2 (full_attention(block 32, EAGLE)) holds 1 blocks, "
             "short of the hit of 64 tokens, which needs cdiv(hit, 32) = 2: 32 tokens counted computed without "
             "their KV")
    connector = short.replace("the hit of", "the connector lookup's hit (its deepest group's) of")
    assert [b.name for b in known_bugs("0.25.1", Category.STATE_HIT_GROUPS, short)] == [
        "hybrid_lookup_full_attention_short_of_mamba_hit"]
    assert [b.name for b in known_bugs("0.26.0", Category.STATE_HIT_GROUPS, connector)] == [
        "connector_lookup_takes_deepest_group_hit"]
    assert known_bugs("0.26.0", Category.STATE_HIT_GROUPS, short) == []  # fixed there: a finding
    assert known_bugs("0.27.0", Category.STATE_HIT_GROUPS, connector) == []
