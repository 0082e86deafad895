"""The registration bound held by the engine differential
(``oracles.registration.RegistrationBound``) on ``cache_blocks`` calls as the
engine worker records them (no vLLM needed): the engines and calls below are
what vLLM's Scheduler built and made (the worker's ``open_engine`` answer and
its recorded calls), copied from real runs and cut to what the bound reads."""

from kvspec.model.finding import Category
from kvspec.oracles.registration import RegistrationBound

from tests.support import capabilities


def _mamba(block):
    return {"kind": "mamba_align", "block_size": block, "eagle": False, "sliding_window": 0}


def _attention(block, eagle=False):
    return {"kind": "full_attention", "block_size": block, "eagle": eagle, "sliding_window": 0}


# 0.33.0, toy-qwen3-next-eagle3 with vLLM's DecodeBenchConnector and one
# speculative token (lookahead hashes: the EAGLE drop is not live): S = 64,
# Mamba groups of 32, the drafter's full-attention group of 32.
EAGLE3_CONNECTOR_033 = {
    "groups": [_mamba(32), _mamba(32), _mamba(32), _attention(64), _attention(32)],
    "scheduler_block_size": 64, "hash_block_size": 32, "enable_caching": True, "num_prefill_lookahead": 1,
    "num_hash_lookahead_tokens": 0, "kv_connector": "DecodeBenchConnector"}
# 0.34.0, toy-nemotron-h with --block-size 16: two Mamba groups and full attention, S = H = 16.
NEMOTRON_034 = {"groups": [_mamba(16), _mamba(16), _attention(16)], "scheduler_block_size": 16,
                "hash_block_size": 16, "enable_caching": True, "num_prefill_lookahead": 0,
                "num_hash_lookahead_tokens": 0}


def _call(request, n, hashed, tokens, blocks, before, life=0):
    return {"request": request, "n": n, "hashed_tokens": hashed, "num_tokens": list(tokens),
            "registered_blocks": list(blocks), "registered_before": list(before), "life": life}


def test_blocks_a_connector_load_counted_registered_are_not_the_calls():
    """(a) DecodeBenchConnector loads 33 of a 34-token prompt: the allocation
    pads each Mamba group's skipped first block with the null block and counts
    it registered, so the first cache_blocks call (n = 34, below S: every
    group's bound is 0) finds one block registered in each Mamba group and
    registers nothing.  Held from none registered, it read as a block_mismatch
    (a false alarm on 0.33.0); held from what the allocation counted, it is
    within the bound."""
    call = _call("r1", 34, 32, [0] * 5, [1, 1, 1, 0, 0], before=[1, 1, 1, 0, 0])
    assert RegistrationBound(EAGLE3_CONNECTOR_033, capabilities("0.33.0")).check([call]) == []
    # What the call says decides it: the same call from a request the allocation counted nothing for.
    (found,) = RegistrationBound(EAGLE3_CONNECTOR_033, capabilities("0.33.0")).check(
        [dict(call, registered_before=[0] * 5)])
    assert found.category is Category.BLOCK_MISMATCH and found.expected_blocks == (0,) * 5


def test_a_preempted_request_starts_afresh():
    """(b) Request b registered six blocks per group (n = 96), was preempted
    (the manager gave its blocks back and forgot them), and its first call
    after resuming registers three (n = 48).  Held across the preemption, the
    six it registered before were owed again: a block_mismatch (the false alarm
    on 0.34.0); a new life of its blocks starts from none."""
    before = _call("b", 96, 96, [96] * 3, [6] * 3, before=[4] * 3)
    after = _call("b", 48, 96, [48] * 3, [3] * 3, before=[0] * 3, life=1)
    bound = RegistrationBound(NEMOTRON_034, capabilities("0.34.0"))
    assert bound.check([before]) == [] and bound.check([after]) == []
    assert bound.lives == 1 and bound.checked == 2 and bound.calls == {"b": [after]}
    # Another request's calls are not touched by b's preemption.
    bound.check([_call("a", 64, 96, [64] * 3, [4] * 3, before=[0] * 3)])
    assert set(bound.calls) == {"a", "b"} and bound.lives == 1


def test_a_call_outside_the_bound_is_found_in_a_later_life():
    """Starting a request afresh hides nothing: after its preemption, a call
    whose full-attention group gets fewer tokens than the bound is an
    under_registration at that life's call 0, named after the request."""
    bound = RegistrationBound(NEMOTRON_034, capabilities("0.34.0"))
    assert bound.check([_call("b", 96, 96, [96] * 3, [6] * 3, before=[0] * 3)]) == []
    (found,) = bound.check([_call("b", 48, 96, [48, 48, 32], [3, 3, 2], before=[0] * 3, life=1)])
    assert found.category is Category.UNDER_REGISTRATION and found.call == 0
    assert found.expected_tokens == (48, 48, 48) and found.observed_tokens == (48, 48, 32)
    assert "request b's cache_blocks call 0 through the real Scheduler" in found.detail


def test_one_group_or_no_prefix_caching_is_not_held():
    """The bound is the hybrid coordinator's: one group (the unitary
    coordinator registers the whole blocks of each call's n) or prefix
    caching off is not held, and says so (``live``)."""
    one = dict(NEMOTRON_034, groups=[_attention(16)])
    off = dict(NEMOTRON_034, enable_caching=False)
    for derived in (one, off):
        bound = RegistrationBound(derived, capabilities("0.34.0"))
        assert not bound.live and bound.check([_call("a", 48, 48, [40], [2], before=[0])]) == []
        assert bound.checked == 0
