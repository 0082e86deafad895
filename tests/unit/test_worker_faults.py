"""The worker's word on whose code raised, without vLLM: an exception from
kvspec's own worker frames is never passed off as vLLM's."""

from __future__ import annotations

import json
import sys
import types

import attrs
import pytest

from kvspec.model.wire import parse_request
from kvspec.subjects.vllm_side import errors, loop, state_machine


def _raised(source: str, filename: str) -> BaseException:
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    try:
        namespace["call"]()
    except Exception as exc:  # noqa: BLE001 - the test wants whatever the code raised
        return exc
    raise AssertionError("the stand-in did not raise")


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    package = tmp_path / "vllm"
    package.mkdir()
    module = types.ModuleType("vllm")
    module.__path__ = [str(package)]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return package


def test_an_exception_raised_in_vllms_frames_is_vllms(fake_vllm):
    exc = _raised("def call():\n    return None.apply\n", str(fake_vllm / "core.py"))
    assert errors.exception_origin(exc) == {"origin": "vllm", "where": "core.py:2 in call"}


def test_an_exception_raised_in_the_workers_own_frames_is_kvspecs(fake_vllm):
    def through_the_worker():
        return loop._machine_op(types.SimpleNamespace(machine=None),
                                parse_request({"op": "machine_ops", "ops": [{}]}))

    # The fresh worker's refusal is kvspec's error, never an exception.
    assert through_the_worker() == {"ok": False, "error_kind": "kvspec", "error": "no machine is open on this worker"}
    try:
        state_machine.Machine.apply(None, {"do": "finish"})
    except Exception as exc:  # noqa: BLE001
        origin = errors.exception_origin(exc)
    else:
        raise AssertionError("apply on nothing did not raise")
    assert origin["origin"] == "kvspec" and origin["where"].startswith("state_machine.py:")


def test_library_frames_under_vllm_are_passed_over(fake_vllm, tmp_path):
    library = _raised("def call():\n    raise ValueError('deep')\n", str(tmp_path / "torch_like.py"))
    namespace: dict = {"inner": lambda: (_ for _ in ()).throw(library)}
    exec(compile("def call():\n    inner()\n", str(fake_vllm / "manager.py"), "exec"), namespace)
    try:
        namespace["call"]()
    except ValueError as exc:
        assert errors.exception_origin(exc)["origin"] == "vllm"
    else:
        raise AssertionError("the stand-in did not raise")


def test_a_crash_that_does_not_recur_on_replay_is_not_headlined_as_vllms():
    from kvspec.model.finding import Blame, Category, Finding
    from kvspec.findings.stateful import unconfirmed_crash

    from tests.support import FIXTURES

    data = json.loads((FIXTURES / "finding_refloor_50062.json").read_text())
    finding = attrs.evolve(Finding.from_dict(data), category=Category.SUBJECT_CRASH)
    unconfirmed = unconfirmed_crash(finding)
    assert unconfirmed.verdict.startswith("UNCONFIRMED: ") and "not reported as a vLLM crash" in unconfirmed.verdict
    assert unconfirmed.ledger.blame is Blame.UNDETERMINED
