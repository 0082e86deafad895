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


# The control run ``kvspec fuzz --vllm 0.34.0 --engine --max-examples 200 --seed 0`` (toy-gpt-oss: window 32,
# block 32; 19 blocks; 128-token budget; sparse retention): r10's 129-token prompt registers its first 128
# tokens in one step (sliding window: blocks 1 and 3 for its junction 64 and replay boundary 128; map entries
# as the worker reported them), then the next step computes its last token: the window frees blocks 0-2
# (remove_skipped_blocks) and r14's allocation, the pool empty, evicts block 1's key (12 on block 13) -- all
# before r10's prompt counts as computed.  r15 (66 tokens, 66 shared with r10) then hit 0: vLLM's LRU, no bug.
GPT_OSS = RetentionLayout((KVCacheGroup(GroupKind.SLIDING_WINDOW, 32, sliding_window=32),
                           KVCacheGroup(GroupKind.FULL_ATTENTION, 32)), (32, 32), 32, 0)
SHARED = list(range(2000, 2096))
R10, R15 = SHARED + list(range(600, 633)), SHARED[:66]
AFTER_FIRST_CHUNK = frozenset(map(tuple, [[0, 7], [1, 5], [1, 8], [2, 6], [2, 9], [3, 1], [4, 2], [5, 14], [6, 16],
                                          [7, 17], [8, 18], [9, 11], [10, 12], [11, 15], [12, 13]]))
AFTER_LAST_TOKEN = frozenset(map(tuple, [[0, 7], [1, 8], [2, 9], [3, 1], [4, 2], [9, 11], [10, 12], [11, 15],
                                         [13, 13]]))


def _chunked_r10(after_last_token: frozenset) -> RetentionLedger:
    ledger = RetentionLedger(GPT_OSS)
    ledger.arrive("r10", R10)
    ledger.arrive("r15", R15)
    ledger.lookup_made("r10", 64)  # the full-attention hit ran past the window's: junction 64
    ledger.progress({"r10": 128}, AFTER_FIRST_CHUNK, settled=False)  # schedule(): 128 of 129 tokens
    ledger.progress({"r10": 128}, AFTER_FIRST_CHUNK)  # its output
    ledger.progress({"r10": 129}, after_last_token, settled=False)  # the last token's schedule(): r14 evicts key 12
    ledger.progress({"r10": 129}, after_last_token)
    return ledger


def test_a_window_block_evicted_before_the_prompt_completes_is_not_owed():
    ledger = _chunked_r10(AFTER_LAST_TOKEN)
    assert ledger.owed("r15", 66, AFTER_LAST_TOKEN) == (0, "")


def test_a_chunked_prompt_whose_blocks_all_stayed_is_still_owed():
    ledger = _chunked_r10(AFTER_FIRST_CHUNK | AFTER_LAST_TOKEN)
    owed, why = ledger.owed("r15", 66, AFTER_FIRST_CHUNK | AFTER_LAST_TOKEN)
    assert owed == 64 and "sharing 66 tokens with r10" in why and "since they were first scheduled" in why


def test_a_request_preempted_before_its_prompt_was_computed_is_not_owed_from():
    ledger = RetentionLedger(LAYOUT)
    ledger.arrive("r0", list(range(100)))
    ledger.progress({"r0": 64}, frozenset({(1, 1)}))
    ledger.preempted(["r0"])  # its blocks of that schedule may have been evicted unseen
    ledger.progress({"r0": 100}, frozenset({(1, 1)}))
    ledger.arrive("r1", list(range(100)))
    assert ledger.owed("r1", 100, frozenset({(1, 1)}))[0] == 0
    ledger.arrive("r0", list(range(100)))  # sent again: owed from once computed
    ledger.progress({"r0": 100}, frozenset({(1, 1)}))
    assert ledger.owed("r1", 100, frozenset({(1, 1)}))[0] == 96
