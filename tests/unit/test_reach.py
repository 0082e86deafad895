"""Who a finding reaches (kvspec.reach), on modelled derivations (no vLLM:
tests/integration/test_cli_fuzz_reach.py runs it on the release's code)."""

from __future__ import annotations

import json

import attrs
import pytest

import kvspec.reach as reach
from kvspec.model.corpus import case as corpus_case
from kvspec.model.deployments import CATALOG, derive, schemes_for
from kvspec.model.finding import Finding, Reach
from kvspec.model.outcome import Outcome
from kvspec.model.variants import variant

from tests.support import FIXTURES, capabilities

FIXTURE = FIXTURES / "finding_refloor_50062.json"


def _finding(diagnosis: str = "regression_50062", version: str = "0.33.0") -> Finding:
    finding = Finding.from_dict(json.loads(FIXTURE.read_text()))
    subject = {**finding.compared["subject"], "version": version}
    return attrs.evolve(finding, compared={**finding.compared, "subject": subject},
                        explanation=attrs.evolve(finding.explanation, diagnosis=diagnosis, knobs=()))


@pytest.fixture
def modelled(monkeypatch):
    """Derivations from the model (as if the release's code could not run)."""
    def fake(finding, say):
        version = finding.compared["subject"]["version"]
        return [derive(p, version, legacy_hashes=legacy).because_not_called("unit test")
                for p in CATALOG for legacy in schemes_for(p, version)], version

    monkeypatch.setattr(reach, "_derivations", fake)
    monkeypatch.setattr(reach, "_release_facts", lambda finding: {"speculative_methods": {
        "eagle": {"use_eagle_block_drop": True}, "dspark": {"use_eagle_block_drop": False}}})
    monkeypatch.setenv("KVSPEC_REACH_HITRATE", "0")


def test_the_rule_on_the_seed_geometry():
    config = corpus_case("seed_52419").config
    impact = reach.rule_impact(config, capabilities("0.33.0"), variant("regression_50062").rule)
    eagle = impact["groups"][0]
    # (n mod 8) > 2 for n in 1..16: n = 3..7, 11..15 -> 10 lengths, at most 8 - 1 - 2 = 5 lost.
    assert (eagle["lengths_differing"], eagle["max_tokens_lost"]) == (10, 5) and impact["affected"]
    assert not reach.rule_impact(config, capabilities("0.33.0"), variant("spec").rule)["affected"]


def test_50062_reaches_only_a_drafter_page_larger_than_the_target_under_legacy_hashes(modelled):
    found = attrs.evolve(_finding())
    result, knobs = reach._assess(found)
    names = {(e["profile"], e["hash_scheme"]) for e in result.profiles}
    assert names == {("qwen3-next+eagle3-kv8+pmu16", "legacy")}
    assert not result.hardening and "hypothetical drafter geometry" in result.summary
    worst = result.worst
    assert worst["profile"] == "qwen3-next+eagle3-kv8+pmu16" and worst["max_tokens_lost"] == 559
    entry = result.profiles[0]
    assert entry["derivation"]["modelled"] and not entry["derivation"]["called"]
    assert any(k.startswith("hash scheme: reached only with legacy block hashes") for k in knobs)
    assert any("prefix_match_unit=16" in k for k in knobs)
    assert any("with the EAGLE block drop" in k and "eagle" in k for k in knobs)


def test_on_0_28_the_fallback_flags_every_group_eagle(modelled):
    result = reach.assess(_finding(version="0.28.0"))
    # 0.28 flags every group EAGLE: the Mamba groups of that profile lose too.
    groups = result.profiles[0]["impact"]["groups"]
    assert {g["kind"] for g in groups if g["lengths_differing"]} == {"mamba_align", "full_attention"}


def test_a_rule_no_profile_reaches_is_hardening(modelled, monkeypatch):
    # A rule that differs only below one token: no request reaches it.
    monkeypatch.setattr(reach, "rule_impact", lambda config, caps, rule: {"affected": False})
    result = reach.assess(_finding())
    assert result.hardening and result.summary.startswith("No known deployment")
    assert result.profiles == () and result.worst is None


def test_an_engine_registration_finding_is_reached_by_its_engine_flags(modelled, monkeypatch):
    """A registration finding the engine differential made (every cache_blocks
    call vLLM's Scheduler makes held to the bound) is reachable with its
    engine flags whatever the catalog says: never hardening for want of a
    profile, the profiles' verdict beside it, never "hand-built geometry only"."""
    monkeypatch.setattr(reach, "rule_impact", lambda config, caps, rule: {"affected": False})
    how = "reachable through vLLM's scheduler with `--prefix-match-unit 8` on toy-qwen3-next-eagle3"
    base = _finding()
    engine = attrs.evolve(base, inputs={**base.inputs, "engine_program": {"engine": {}, "ops": []},
                                        "how_a_user_reaches_it": how})
    result = reach.assess(engine)
    assert not result.hardening and result.summary.startswith(how + ". Deployment profiles: No known deployment")
    assert "hand-built geometry" not in result.summary
    assert reach.assess(base).hardening  # the same rule on a hand-built case is hardening


def test_attach_fills_reach_and_generated_knobs(modelled):
    finding = reach.attach(_finding())
    assert finding.reach is not None and finding.explanation.knobs
    assert finding.compared["hash_scheme"] == "legacy" and finding.compared["not_covered"]
    assert not any("most prompt lengths qualify" in k for k in finding.explanation.knobs)
    again = Finding.from_dict(json.loads(json.dumps(finding.to_dict())))
    assert again.reach == finding.reach


def test_the_configuration_line_says_hardening_only_when_nothing_reaches_it(modelled, monkeypatch):
    from kvspec.model.engine import HAND_BUILT

    finding = attrs.evolve(_finding(), compared={**_finding().compared, "configuration": HAND_BUILT})
    reached = reach.attach(finding)
    assert not reached.reach.hardening
    line = reached.compared["configuration"]
    assert line.startswith("hand-built:") and "hardening until reproduced" not in line
    assert "a deployment profile vLLM's own configuration code derives reaches it" in line
    # What the engine search showed stays said after the corrected words.
    searched = reach.configuration_line(f"{HAND_BUILT}; not reproduced through vLLM's engine", reached.reach)
    assert searched.endswith("; not reproduced through vLLM's engine") and "until reproduced" not in searched
    monkeypatch.setattr(reach, "rule_impact", lambda config, caps, rule: {"affected": False})
    unreached = reach.attach(finding)
    assert unreached.reach.hardening and unreached.compared["configuration"] == HAND_BUILT


def test_a_hardening_finding_exits_6():
    from kvspec.diff_tests.fuzz import FuzzResult
    from kvspec.diff_tests.property import Failure
    from kvspec.usecases.fuzz import FuzzRun, FuzzSettings, SubjectRun

    finding = _finding()
    result = FuzzResult(subject=finding.compared["subject"], capabilities=capabilities(), seed=0,
                        failure=Failure(None, (), {}))
    run = FuzzRun(FuzzSettings(), ["s"], [SubjectRun(result, attrs.evolve(finding, reach=Reach("x", hardening=True)))])
    assert run.outcome is Outcome.HARDENING and run.outcome.exit_code == 6
    run.subjects[0].finding = attrs.evolve(finding, reach=Reach("y", hardening=False))
    assert run.outcome is Outcome.FINDING


def test_a_hardening_finding_in_a_reduced_scope_exits_incomplete():
    """What was not searched is never less urgent than a hardening finding
    (a tree whose code is newer than its _version.py says)."""
    from kvspec.diff_tests.fuzz import FuzzResult
    from kvspec.diff_tests.property import Failure
    from kvspec.usecases.fuzz import FuzzRun, FuzzSettings, SubjectRun

    finding = _finding()
    result = FuzzResult(subject=finding.compared["subject"], capabilities=capabilities(), seed=0,
                        failure=Failure(None, (), {}), scope_reduction="tree has X, which 0.28.0 lacks")
    run = FuzzRun(FuzzSettings(), ["s"], [SubjectRun(result, attrs.evolve(finding, reach=Reach("x", hardening=True)))])
    assert run.outcome is Outcome.INCOMPLETE and run.status.value == "REDUCED SCOPE"
    run.subjects[0].finding = attrs.evolve(finding, reach=Reach("y", hardening=False))
    assert run.outcome is Outcome.FINDING


def test_a_release_before_the_derived_eras_is_not_assessed(modelled):
    result = reach.assess(_finding(version="0.25.1"))
    assert result.summary.startswith("Not assessed") and not result.hardening


def test_a_stateful_finding_is_not_assessed_and_never_hardening(modelled):
    """A program is not replayed on the profiles: who it reaches is not
    measured, so it is not called hardening (which would turn a finding's exit
    code into 6 on a measurement never made)."""
    finding = attrs.evolve(_finding(), inputs={"program": {"ops": []}, "describe": "a program"})
    result = reach.attach(finding).reach
    assert result.summary.startswith("Not assessed: a stateful finding") and not result.hardening


def test_a_hand_built_findings_affected_line_says_the_engine_search_ran():
    from kvspec.report.finding import affected_lines

    missed = {"status": "not reproduced", "summary": "hand-built only: not reproduced through the engine in ..."}
    finding = attrs.evolve(_finding(), reach=Reach("hand-built only: ...", hardening=True),
                           inputs={**_finding().inputs, "engine_reproduction": missed})
    (line,) = affected_lines(finding)
    assert line.endswith("not reproduced through vLLM's engine in the search the impact line states)")
    (line,) = affected_lines(attrs.evolve(finding, inputs=_finding().inputs))
    assert line.endswith("no engine configuration was driven for it)")


def test_a_case_crash_is_looked_for_through_the_engine_by_its_exception(monkeypatch):
    import kvspec.diff_tests.reproduce as reproduce
    from kvspec.model.finding import Category

    asked = []
    monkeypatch.setattr(reproduce, "reproduce_case_through_engine",
                        lambda proc, case, found, exception=None: asked.append((found.category, exception)) or "r")
    inputs = {"config": _finding().inputs["config"], "prompt_len": 8,
              "steps": [{"kind": "prefill", "tokens": 8, "drafts": 0, "accepted": 0}]}
    crash = attrs.evolve(_finding(), category=Category.SUBJECT_CRASH, inputs=inputs, groups=(),
                         observations={"ok": False, "error_kind": "drive", "error": "AssertionError: x"})
    assert reach._engine_reproduction(crash, object(), lambda line: None) == "r"
    assert asked == [(Category.SUBJECT_CRASH, "AssertionError")]
    # The worker itself died on the case: every engine driving it would die again.
    died = attrs.evolve(crash, observations={"ok": False, "error_kind": "crashed", "error": "worker exited"})
    assert reach._engine_reproduction(died, object(), lambda line: None) is None
