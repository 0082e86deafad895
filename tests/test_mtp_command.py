"""`kvspec mtp` without vLLM: usage errors and how the verdict is chosen."""

from __future__ import annotations

from kvspec import exitcodes
from kvspec.cli import main
from kvspec.mtp_command import _verdict


def _theorem(status="PROVED", as_expected=True):
    return {"name": "mtp.x", "status": status, "as_expected": as_expected}


def _subject(witnesses):
    return {"subject": "vllm 0.33.0", "schemes": {"legacy hashes + EAGLE drop": {"witnesses": witnesses}}}


def test_no_subject_is_a_usage_error(capsys):
    assert main(["mtp"]) == exitcodes.USAGE
    assert "name a subject" in capsys.readouterr().err


def test_stale_reuse_on_a_subject_is_a_finding():
    verdict, code = _verdict([_theorem()], [_subject(3)])
    assert code == exitcodes.FINDING and verdict.startswith("COUNTEREXAMPLE")
    assert "vllm 0.33.0 with legacy hashes" in verdict


def test_no_stale_reuse_is_ok_and_a_timeout_is_unknown_not_proved():
    assert _verdict([_theorem()], [_subject(0)])[1] == exitcodes.OK
    verdict, code = _verdict([_theorem("UNKNOWN", as_expected=False)], [_subject(0)])
    assert code == exitcodes.UNKNOWN and "timed out" in verdict


def test_a_theorem_not_as_expected_is_a_finding():
    verdict, code = _verdict([_theorem("REFUTED", as_expected=False)], [_subject(0)])
    assert code == exitcodes.FINDING and "NOT AS EXPECTED" in verdict
