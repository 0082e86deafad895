"""model.retention by hand from vLLM's rule (window 32, block 16: a hit needs 2 blocks)."""

from kvspec.model.domain import GroupKind, KVCacheGroup
from kvspec.model.retention import RetentionLayout, RetentionLedger, registered_blocks, replay_boundaries

SW = KVCacheGroup(GroupKind.SLIDING_WINDOW, 16, sliding_window=32)
FA = KVCacheGroup(GroupKind.FULL_ATTENTION, 16)
LAYOUT = RetentionLayout((SW, FA), (16, 16), 16, 0)


def test_sparse_keeps_the_run_ending_on_the_replay_boundary_only():
    assert replay_boundaries(100, 16, eagle=False) == (99,)
    assert registered_blocks(SW, 6, 16, 0, (99,)) == (False,) * 4 + (True, True)
    assert registered_blocks(SW, 6, 16, None, (99,)) == (True,) * 6  # dense: the run fills every segment
    assert registered_blocks(SW, 8, 16, 64, (99,)) == (False, False, True, True, True, True, True, True)


def test_the_ledger_owes_a_resend_until_an_entry_leaves_the_map():
    ledger = RetentionLedger(LAYOUT)
    ledger.arrive("r0", list(range(100)))
    ledger.progress({"r0": 100}, frozenset({(1, 1)}))
    ledger.arrive("r1", list(range(100)))
    assert ledger.owed("r1", 100, frozenset({(1, 1), (2, 2)}))[0] == 96
    assert ledger.owed("r1", 100, frozenset({(2, 2)}))[0] == 0  # evicted since: nothing owed
    assert ledger.owed("r1", 101, frozenset({(1, 1)}))[0] == 0  # a preempted request's lookup: not predicted
