"""The finding model, its producers on the proof side, the ledger and the Z3 leg."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.findings import theorem_finding
from model.corpus import case as corpus_case
from model.finding import Category, Finding, LedgerVerdict, ledger_verdict
from proofs.catalog import theorem
from proofs.concrete import z3_bounds
from proofs.runner import run_theorem

FIXTURE = Path(__file__).with_name("fixtures") / "finding_refloor_50062.json"
VERSIONS = {"kvspec": "0.0.0", "z3": "z", "hypothesis": "h"}


@pytest.mark.parametrize("legs, verdict", [
    (([22, 22], [22, 22], [18, 22]), LedgerVerdict.IMPLEMENTATION_BUG),
    (([22, 22], [18, 22], [22, 22]), LedgerVerdict.ORACLE_BUG),
    (([22, 22], [22, 22], [22, 22]), LedgerVerdict.AGREE),
    (([22, 22], [20, 22], [18, 22]), LedgerVerdict.UNDETERMINED),
    (([22, 22], [22, 22], None), LedgerVerdict.UNDETERMINED),
])
def test_ledger_names_the_disagreeing_pair(legs, verdict):
    assert ledger_verdict(*legs) is verdict


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
    assert finding.ledger.verdict is LedgerVerdict.IMPLEMENTATION_BUG
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
    assert finding.to_dict() == data


def test_a_finding_of_another_schema_is_refused():
    with pytest.raises(ValueError, match="not a kvspec.finding/1"):
        Finding.from_dict({"schema": "kvspec.finding/0"})


def test_a_spec_that_breaks_its_own_theorem_is_a_spec_bug():
    # Put a wrong rule in the spec's place: the safety theorem must now fail,
    # and the finding must blame the spec, not an implementation.
    import attrs

    from model.variants import variant
    from proofs.theorem import Subject

    broken = attrs.evolve(theorem("safety.at_most_computed"),
                          subject=Subject("spec", variant("lookahead_unclamped").rule))
    result = run_theorem(broken, vacuity=False)
    assert not result.as_expected
    finding = theorem_finding(result, VERSIONS)
    assert finding.ledger.verdict is LedgerVerdict.SPEC_BUG
    assert finding.category is Category.OVER_REGISTRATION
    assert finding.verdict.startswith("REFUTED (NOT as expected): safety.at_most_computed")


def test_an_oracle_that_disagrees_with_z3_and_the_subject_is_an_oracle_bug():
    # A recorded reply that agrees with the spec, and an oracle claim that does
    # not: the ledger must blame the oracle (Z3 and the subject agree).
    from diff_tests.fuzz import Failure, FuzzResult
    from oracles.case import Case, prefill
    from oracles.oracle import Discrepancy
    from kvspec.findings import fuzz_finding

    seed = corpus_case("seed_52419")
    case = Case(seed.config, 22, (prefill(22),))
    reply = {"ok": True, "regime": {"partial_hash_hits": True, "use_eagle": [True, False]},
             "calls": [{"n": 22, "hashed_tokens": 22, "num_tokens": [22, 22],
                        "registered_blocks": [11, 2]}]}
    claim = Discrepancy("over_registration", 0, 22, expected_tokens=(18, 22),
                        observed_tokens=(22, 22), expected_blocks=(9, 2), observed_blocks=(11, 2))
    caps = {"partial_hash_hits": True, "per_group_eagle": True, "reprefillable_tokens": True,
            "fine_grained_lookup_fallback": True}
    result = FuzzResult(subject={"label": "recorded reply"}, capabilities=caps, seed=0,
                        failure=Failure(case, (claim,), reply))
    finding = fuzz_finding(result, VERSIONS, explain=False)
    assert finding.ledger.z3_spec == (22, 22) and finding.ledger.oracle == (18, 22)
    assert finding.ledger.verdict is LedgerVerdict.ORACLE_BUG
