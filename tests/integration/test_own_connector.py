"""kvspec's own KV connector (``subjects/vllm_side/connector.py``, written
against vLLM's public ``KVConnectorBase_V1``) through vLLM's real Scheduler:
vLLM imports it from ``kv_connector_module_path`` as it would a user's; its
drawn loads run synchronously and asynchronously, fail, and vLLM's own
recovery (``_handle_invalid_blocks`` -> ``evict_blocks``) runs and is held to
``evicted_unfindable``; a mutant whose ``evict_blocks`` leaves held blocks
cached is caught through the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.diff_tests.engine import drive_engine_program, replay_engine_program
from kvspec.model.engine import EngineProgram, EngineSetup
from kvspec.model.finding import Category
from kvspec.model.requests import OpenEngine
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import mutant_subject, release

PROMPT = list(range(1, 150))  # 149 tokens: 9 whole blocks of 16 and 5 more


def _program(policy: str | None, load_async: bool, fail: int | None) -> EngineProgram:
    setup = EngineSetup(model="toy-llama", num_gpu_blocks=40, block_size=16, async_scheduling=False,
                        kv_connector="KvspecConnector", kv_load_failure_policy=policy)
    load = {"offer": 100, "async": load_async, "delay": 1, "fail": fail}
    ops = ([{"do": "arrive", "id": "a", "tokens": PROMPT, "max_tokens": 3, "load": load}]
           + [{"do": "step"}] * 5
           # A resend after the load: its hit may use only what loaded.
           + [{"do": "arrive", "id": "b", "tokens": PROMPT, "max_tokens": 2}] + [{"do": "step"}] * 4)
    return EngineProgram(setup, ops)


def _run(version: str, program: EngineProgram):
    with SubjectProcess(release(version)) as proc:
        opened = proc.session(OpenEngine(program.setup.message()))
        records = list(drive_engine_program(proc, program))
    found = [d for r in records for d in r.found]
    return opened, found, {"answers": [r.record for r in records if r.op["do"] != "open"]}


def _lookups(reply, request):
    return [lk for a in reply["answers"] for part in (a.get("scheduled") or {}, a)
            for lk in part.get("result", {}).get("lookups", ()) if lk["request"] == request]


@pytest.mark.parametrize("version", ["0.34.0", "0.28.0"])
def test_a_failed_synchronous_load_is_evicted_and_not_hit_again(version):
    opened, found, reply = _run(version, _program(None, load_async=False, fail=1))
    assert opened["ok"] and opened["derived"]["kv_connector"] == "KvspecConnector"
    assert opened["derived"]["kv_load_failure_policy"] == "fail"  # the release's default, read back
    assert found == [], [d.summary() for d in found]
    evicted = [a["result"]["evicted"] for a in reply["answers"] if a["result"].get("evicted")]
    # The second loaded block (block ids 1.. from the pool) failed: it and every block after it evicted.
    assert len(evicted) == 1 and len(evicted[0]) >= 5
    finished = [r for a in reply["answers"] for r in a["result"].get("finished", ())]
    assert "a" in finished  # failed by the policy
    # The resend hits at most the block before the failed one.
    (hit,) = [lk["hit"] for lk in _lookups(reply, "b")]
    assert hit <= 16


def test_asynchronous_loads_wait_for_the_worker_and_recompute_after_a_failure():
    opened, found, reply = _run("0.34.0", _program("recompute", load_async=True, fail=2))
    assert opened["ok"] and opened["derived"]["kv_load_failure_policy"] == "recompute"
    assert found == [], [d.summary() for d in found]
    # The request waits (not running) until the driver reports finished_recving, then runs to its end.
    assert reply["answers"][1]["waiting"] == ["a"] and reply["answers"][1]["running"] == {}
    assert not any(a["result"].get("evicted") for a in reply["answers"])  # recompute: nothing evicted
    assert any("a" in a["result"].get("finished", ()) for a in reply["answers"])


def test_a_mutant_whose_evict_blocks_keeps_held_blocks_cached_is_caught_through_the_engine():
    program = _program(None, load_async=False, fail=1)
    with SubjectProcess(mutant_subject("0.34.0", "evict_skips_held_blocks")) as proc:
        found, _ = replay_engine_program(proc, program)
    assert found and found[0].category is Category.STATE_EVICTED_FINDABLE, [d.summary() for d in found]


FIXTURE = Path(__file__).parent.parent / "fixtures" / "finding_engine_evicted_findable_0.34.0.json"


def test_the_evicted_block_finding_gets_a_test_that_fails_on_the_mutant_and_passes_on_the_release(tmp_path):
    """The mutant's evicted_findable finding on ``_program(None, False, 1)``
    (the fixture: toy-llama, kvspec's connector's synchronous load failing
    from its second block): its engine test writes the connector into itself
    (``ExternalStoreConnector``, vLLM's public KVConnectorBase_V1), lints
    clean under the release's configuration, fails on the mutant on its own
    assertion and passes on unmutated 0.34.0."""
    from kvspec.findings.engine import with_engine_test
    from kvspec.model.finding import Finding

    finding = Finding.from_dict(json.loads(FIXTURE.read_text()))
    assert EngineProgram.from_dict(finding.inputs["engine_program"]) == _program(None, load_async=False, fail=1)
    finding = with_engine_test(finding, tmp_path / FIXTURE.name, mutant_subject("0.34.0", "evict_skips_held_blocks"))
    test = finding.regression_test
    assert test["test_name"] == "test_evicted_blocks_are_no_longer_cached" and test["proposed"], test
    assert test["lint"]["outcome"] == "passed", test["lint"]["output"]
    assert "kvspec" not in test["code"] and "class ExternalStoreConnector(KVConnectorBase_V1, SupportsHMA)" \
        in test["code"]
    mutant, unmutated = test["verified"]
    assert mutant["outcome"] == "failed" and mutant["failure"] == "the test's assertion", mutant
    assert "evict_blocks" in mutant["output"]
    assert unmutated["outcome"] == "passed" and unmutated["against"] == "unmutated vllm 0.34.0", unmutated
