"""The finding model, its producers on the proof side, the ledger and the Z3 leg."""

from __future__ import annotations

import json

import pytest

from kvspec.findings.assemble import theorem_finding
from kvspec.model.corpus import case as corpus_case
from kvspec.model.finding import Category, Finding, Blame, blame_of
from kvspec.proofs.catalog import theorem
from kvspec.proofs.concrete import z3_bounds
from kvspec.proofs.runner import run_theorem

from tests.support import FIXTURES, capabilities

FIXTURE = FIXTURES / "finding_refloor_50062.json"
VERSIONS = {"kvspec": "0.0.0", "z3": "z", "hypothesis": "h"}


@pytest.mark.parametrize("legs, blame", [
    (([22, 22], [22, 22], [18, 22]), Blame.IMPLEMENTATION_BUG),
    (([22, 22], [18, 22], [22, 22]), Blame.ORACLE_BUG),
    (([22, 22], [22, 22], [22, 22]), Blame.AGREE),
    (([22, 22], [20, 22], [18, 22]), Blame.UNDETERMINED),
    (([22, 22], [22, 22], None), Blame.UNDETERMINED),
])
def test_ledger_names_the_disagreeing_pair(legs, blame):
    assert blame_of(*legs) is blame


@pytest.mark.parametrize("name", ["seed_52419", "multi_module_mtp_lookahead",
                                  "sliding_window_switches_partial_off", "below_first_scheduler_block"])
def test_z3_leg_matches_the_hand_derived_corpus(name):
    c = corpus_case(name)
    got = z3_bounds(c.config, c.n, c.total_tokens or c.n, partial=c.config.partial_hash_hits,
                    eagle=c.config.effective_eagle, lookahead=c.config.num_prefill_lookahead)
    assert got == c.expected["spec"]


def test_the_refuted_50062_conformance_is_a_finding_with_its_proved_explanation():
    result = run_theorem(theorem("conformance.regression_50062"))
    finding = theorem_finding(result, VERSIONS)
    assert finding.source == "prove" and finding.category is Category.UNDER_REGISTRATION
    # The minimal counterexample is the corpus's smallest_regression (derived by hand).
    expected = corpus_case("smallest_regression").expected
    assert [g.expected_tokens for g in finding.groups] == list(expected["spec"])
    assert [g.observed_tokens for g in finding.groups] == list(expected["regression_50062"])
    assert finding.ledger.blame is Blame.IMPLEMENTATION_BUG
    e = finding.explanation
    assert e.diagnosis == "regression_50062" and e.reachable_here is True
    assert e.loss_predicted == e.loss_observed == 1
    assert {t.name: t.status for t in e.theorems} == {
        "reachability.regression_tokens": "PROVED", "reachability.regression_blocks": "PROVED",
        "loss.regression_closed_form": "PROVED", "loss.regression_worst_case": "PROVED"}
    # The subject's derivation shows where the tokens went: the floor to S.
    eagle_row = next(g for g in finding.groups if g.eagle)
    assert eagle_row.subject.aligned_finalized == 0 and eagle_row.spec.aligned_finalized == 2
    assert Finding.from_dict(json.loads(json.dumps(finding.to_dict()))) == finding


def test_a_variant_without_closed_form_still_reports_its_refutation_and_loss():
    result = run_theorem(theorem("conformance.lookahead_dropped"))
    finding = theorem_finding(result, VERSIONS)
    e = finding.explanation
    assert e.loss_formula is None and e.loss_observed == finding.differing_groups[0].token_gap
    assert [t.name for t in e.theorems] == ["conformance.lookahead_dropped"]


def test_the_stored_fixture_round_trips():
    data = json.loads(FIXTURE.read_text())
    finding = Finding.from_dict(data)
    written = finding.to_dict()
    # Fields added since the fixture was stored (vLLM's own tests, the worst
    # case's bounds, the measured impact) are written as None; nothing the file held changes.
    added = {"vllm_tests", "impact"}
    added_explanation = {"worst_case_bounds", "worst_case_covers", "worst_case_here"}
    assert all(written[k] is None for k in added) and all(written["explanation"][k] is None
                                                          for k in added_explanation)
    written = {k: v for k, v in written.items() if k not in added}
    written["explanation"] = {k: v for k, v in written["explanation"].items() if k not in added_explanation}
    assert written == data
    assert Finding.from_dict(finding.to_dict()) == finding


def test_a_finding_of_another_schema_is_refused():
    with pytest.raises(ValueError, match="not a kvspec.finding/2"):
        Finding.from_dict({"schema": "kvspec.finding/0"})


def test_a_spec_that_breaks_its_own_theorem_is_a_spec_bug():
    # Put a wrong rule in the spec's place: the safety theorem must now fail,
    # and the finding must blame the subject, not an implementation.
    import attrs

    from kvspec.model.variants import variant
    from kvspec.proofs.theorem import Target

    broken = attrs.evolve(theorem("safety.at_most_computed"),
                          target=Target("spec", variant("lookahead_unclamped").rule))
    result = run_theorem(broken, vacuity=False)
    assert not result.as_expected
    finding = theorem_finding(result, VERSIONS)
    assert finding.ledger.blame is Blame.SPEC_BUG
    assert finding.category is Category.OVER_REGISTRATION
    assert finding.verdict.startswith("REFUTED (NOT as expected): safety.at_most_computed")


def test_an_oracle_that_disagrees_with_z3_and_the_subject_is_an_oracle_bug():
    # A recorded reply that agrees with the subject, and an oracle claim that does
    # not: the ledger must blame the oracle (Z3 and the subject agree).
    from kvspec.diff_tests.fuzz import Failure, FuzzResult
    from kvspec.model.case import Case, prefill
    from kvspec.oracles.registration import Discrepancy
    from kvspec.findings.assemble import fuzz_finding

    seed = corpus_case("seed_52419")
    case = Case(seed.config, 22, (prefill(22),))
    reply = {"ok": True, "regime": {"coordinator": "HybridKVCacheCoordinator", "partial_hash_hits": True,
                                    "use_eagle": [True, False], "block_sizes": [2, 8], "num_reprefillable_tokens": 0},
             "calls": [{"n": 22, "hashed_tokens": 22, "num_tokens": [22, 22],
                        "registered_blocks": [11, 2]}]}
    claim = Discrepancy("over_registration", 0, 22, expected_tokens=(18, 22),
                        observed_tokens=(22, 22), expected_blocks=(9, 2), observed_blocks=(11, 2),
                        hashed_tokens=22, expected_calls=((18, 22),))
    result = FuzzResult(subject={"label": "recorded reply"}, capabilities=capabilities("0.33.0"), seed=0,
                        failure=Failure(case, (claim,), reply))
    finding = fuzz_finding(result, VERSIONS, explain=False)
    assert finding.ledger.z3_spec == (22, 22) and finding.ledger.oracle == (18, 22)
    assert finding.ledger.blame is Blame.ORACLE_BUG
