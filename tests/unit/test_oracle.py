"""The oracle's comparison on hand-made subject replies (no vLLM needed).

The replies below are what a subject *could* say; the expected categories
follow from the subject values written out beside each case.
"""

from kvspec.model.capabilities import expected_regime
from kvspec.model.case import Case, decode, prefill
from kvspec.model.corpus import case as corpus_case
from kvspec.model.replies import Reply
from kvspec.model.requests import case_message
from kvspec.oracles.registration import compare

from tests.support import capabilities

CAPS_033 = capabilities("0.33.0")
SEED = corpus_case("seed_52419").config  # FA(2, EAGLE) + Mamba(8), S=8, H=2: partial hits on


def reply(tokens, blocks, n=22, hashed=22, partial=True, eagle=(True, False)):
    return Reply.parse({"ok": True, "regime": {"coordinator": "HybridKVCacheCoordinator", "partial_hash_hits": partial,
                                               "use_eagle": list(eagle), "block_sizes": [2, 8],
                                               "num_reprefillable_tokens": 0},
                        "calls": [{"n": n, "hashed_tokens": hashed, "num_tokens": tokens,
                                   "registered_blocks": blocks}]})


CASE = Case(SEED, 22, (prefill(22),))


def test_agreeing_reply_has_no_discrepancy():
    # subject: [22, 22] tokens; blocks floor(22/2)=11 and floor(22/8)=2
    assert compare(CASE, CAPS_033, reply([22, 22], [11, 2])) == []


def test_under_registration():
    (d,) = compare(CASE, CAPS_033, reply([18, 22], [9, 2]))
    assert d.category == "under_registration"
    assert (list(d.expected_tokens), list(d.observed_tokens)) == ([22, 22], [18, 22])


def test_over_registration():
    (d,) = compare(CASE, CAPS_033, reply([24, 22], [11, 2]))
    assert d.category == "over_registration"


def test_block_mismatch_with_right_tokens():
    (d,) = compare(CASE, CAPS_033, reply([22, 22], [10, 2]))
    assert d.category == "block_mismatch"


def test_regime_mismatch_is_its_own_kind():
    found = compare(CASE, CAPS_033, reply([18, 16], [9, 2], partial=False))
    assert [d.category for d in found] == ["regime_mismatch"]
    assert "the model derives True, vLLM chose False" in found[0].detail


def test_call_count_mismatch():
    two_steps = Case(SEED, 22, (prefill(22), decode()))
    (d,) = compare(two_steps, CAPS_033, reply([22, 22], [11, 2]))
    assert d.category == "call_mismatch"


def test_crash_and_rejection():
    def failed(kind, error):
        return compare(CASE, CAPS_033, Reply.parse({"ok": False, "error_kind": kind, "error": error}))

    assert failed("drive", "boom")[0].category == "subject_crash"
    assert failed("crashed", "the vLLM worker exited")[0].category == "subject_crash"
    (refused,) = failed("construct", "no")
    assert refused.category == "precondition" and refused.detail.endswith(": no")


def test_regime_follows_capabilities():
    old = capabilities("0.25.1")
    regime = expected_regime(SEED, old)
    assert regime.partial_hash_hits is False and regime.num_prefill_lookahead == 0
    # 0.23-0.25 have no partial hits: the subject then predicts the measured [18, 16].
    assert compare(CASE, old, reply([18, 16], [9, 2], partial=False)) == []


def test_worker_message_carries_the_case():
    import attrs

    case = Case(SEED, 70, (prefill(30), prefill(40), decode(3, 1), decode()))
    message = case_message(case)
    assert message["steps"] == [attrs.asdict(s) for s in case.steps]
    # Room for the prompt and every decoded token, rounded so a batch shares one geometry.
    assert message["max_model_len"] % 128 == 0 and message["max_model_len"] >= 70 + 4 + 1
    assert Case(SEED, 9, (prefill(9),)).max_model_len == message["max_model_len"]
    assert message["num_blocks"] >= sum(message["max_model_len"] // g.block_size for g in SEED.groups)


def test_batches_print_briefly():
    # Hypothesis prints the example it replays: a batch shows its configuration
    # and its first requests, not a hundred full reprs.
    from kvspec.diff_tests.strategies import Batch

    cases = [Case(SEED, n, (prefill(n),)) for n in range(1, 101)]
    text = repr(Batch(cases))
    assert text.startswith(f"Batch({SEED.describe()}: 100 requests: prompt=1 steps=[prefill 1]; prompt=2 ")
    assert text.endswith("; ... 97 more)") and len(text) < 400
