"""`kvspec mtp` without vLLM: usage errors and how the verdict is chosen."""

from __future__ import annotations

from kvspec.cli import main
from kvspec.model.outcome import Outcome
from kvspec.report.mtp import verdict as mtp_verdict


def _theorem(status="PROVED", as_expected=True):
    return {"name": "mtp.x", "status": status, "as_expected": as_expected}


def _subject(witnesses):
    return {"subject": "vllm 0.33.0", "schemes": {"legacy hashes + EAGLE drop": {"witnesses": witnesses}}}


def test_no_subject_is_a_usage_error(capsys):
    assert main(["mtp"]) == Outcome.USAGE.exit_code
    assert "name a subject" in capsys.readouterr().err


def test_stale_reuse_on_a_subject_is_a_finding():
    verdict, code = mtp_verdict([_theorem()], [_subject(3)])
    assert code is Outcome.FINDING and verdict.startswith("COUNTEREXAMPLE")
    assert "vllm 0.33.0 with legacy hashes" in verdict


def test_no_stale_reuse_is_ok_and_a_timeout_is_unknown_not_proved():
    assert mtp_verdict([_theorem()], [_subject(0)])[1] is Outcome.OK
    verdict, code = mtp_verdict([_theorem("UNKNOWN", as_expected=False)], [_subject(0)])
    assert code is Outcome.UNKNOWN and "timed out" in verdict


def test_a_theorem_not_as_expected_is_a_finding():
    verdict, code = mtp_verdict([_theorem("REFUTED", as_expected=False)], [_subject(0)])
    assert code is Outcome.FINDING and "NOT AS EXPECTED" in verdict
