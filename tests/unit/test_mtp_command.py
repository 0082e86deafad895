"""`kvspec mtp` without vLLM: usage errors and how the verdict is chosen."""

from __future__ import annotations

from kvspec.cli import main
from kvspec.model.outcome import Outcome
from kvspec.report.mtp import verdict as mtp_verdict


def _theorem(status="PROVED", as_expected=True):
    return {"name": "mtp.x", "status": status, "as_expected": as_expected}


def _subject(witnesses, matches=True, reach=(), scheme="legacy hashes + EAGLE drop"):
    return {"subject": "vllm 0.33.0", "reach": {"profiles": [{"profile": p} for p in reach],
                                               "fix_refuses_profiles": []},
            "schemes": {scheme: {"witnesses": witnesses, "cases": 100, "model_necessary": matches,
                                 "model_condition_matches": matches, "fix_refuses_every_stale": True,
                                 "fix_refuses_safe": []}}}


def test_no_subject_is_a_usage_error(capsys):
    assert main(["mtp"]) == Outcome.USAGE.exit_code
    assert "name a subject" in capsys.readouterr().err


def test_stale_reuse_where_the_model_says_is_hardening():
    verdict, code = mtp_verdict([_theorem()], [_subject(3)])
    assert code is Outcome.HARDENING and code.exit_code == 6 and verdict.startswith("HARDENING")
    assert "no deployment profile" in verdict and "acceptance only" in verdict
    verdict, code = mtp_verdict([_theorem()], [_subject(3, reach=["qwen3-next+x"])])
    assert code is Outcome.HARDENING and "qwen3-next+x" in verdict


def test_the_model_disagreeing_with_vllm_is_a_finding():
    verdict, code = mtp_verdict([_theorem()], [_subject(3, matches=False)])
    assert code is Outcome.FINDING and verdict.startswith("MODEL DISAGREES")


def test_stale_reuse_under_lookahead_hashes_is_a_finding():
    verdict, code = mtp_verdict([_theorem()], [_subject(2, scheme="lookahead block hashes")])
    assert code is Outcome.FINDING and verdict.startswith("COUNTEREXAMPLE")


def test_no_stale_reuse_is_ok_and_a_timeout_is_unknown_not_proved():
    assert mtp_verdict([_theorem()], [_subject(0)])[1] is Outcome.OK
    verdict, code = mtp_verdict([_theorem("UNKNOWN", as_expected=False)], [_subject(0)])
    assert code is Outcome.UNKNOWN and "timed out" in verdict


def test_a_theorem_not_as_expected_is_a_finding():
    verdict, code = mtp_verdict([_theorem("REFUTED", as_expected=False)], [_subject(0)])
    assert code is Outcome.FINDING and "NOT AS EXPECTED" in verdict
