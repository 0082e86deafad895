"""A worker's replies, parsed once into typed values (``model.replies``), and
the error kinds each side names (no vLLM needed): every error reply the
worker's code makes parses to the kind it means, and a reply the protocol
does not allow is kvspec's one-line error, never a vLLM finding."""

from __future__ import annotations

import json
import types

import pytest

from kvspec.model.errors import InfrastructureError
from kvspec.model.replies import (AllocationSeen, EngineOpened, ErrorKind, LookupSeen, MachineOpened, MalformedReply,
                                  ObservedRegime, OpAnswer, OpResult, PrefillChunking, Reply, Started, Stepped,
                                  record_of)
from kvspec.model.requests import EngineOps, MachineOps, MachineTrace
from kvspec.model.wire import parse_request
from kvspec.subjects import process
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import current_environment
from kvspec.subjects.vllm_side import errors, loop
from kvspec.subjects.vllm_side.errors import BadOperation, Rejected, Unsupported

REGIME = {"coordinator": "HybridKVCacheCoordinator", "partial_hash_hits": True, "use_eagle": [True, False],
          "block_sizes": [2, 8], "num_reprefillable_tokens": 0}


def test_an_ok_case_reply_carries_its_regime_typed_and_its_record_whole():
    record = {"ok": True, "calls": [], "regime": REGIME, "seconds": 0.1}
    reply = Reply.parse(record)
    assert reply.ok and reply.error is None
    assert reply.regime == ObservedRegime("HybridKVCacheCoordinator", True, (True, False), (2, 8), 0)
    assert reply["calls"] == [] and reply.get("probe") is None and dict(reply) == record
    assert record_of(reply) == record and json.loads(json.dumps(record_of(reply))) == record


def test_an_error_reply_is_one_typed_error():
    reply = Reply.parse({"ok": False, "error_kind": "drive", "error": "AssertionError: boom", "index": 3,
                         "traceback": "Traceback ...", "origin": "vllm", "where": "kv_cache_manager.py:9 in f",
                         "answers": [{}, {}, {}]})
    assert not reply.ok and reply.failed_as(ErrorKind.DRIVE) and not reply.failed_as(ErrorKind.KVSPEC)
    assert reply.error.message == "AssertionError: boom" and reply.error.index == 3
    assert not reply.error.in_kvspecs_code and reply["answers"] == [{}, {}, {}]


@pytest.mark.parametrize("record, says", [
    ([], "a reply is a JSON object"),
    ({"ok": "yes"}, "says ok true or false"),
    ({"ok": True, "error_kind": "drive"}, "an ok reply carries no error_kind"),
    ({"ok": False, "unsupported": True, "error": "old style"}, "names one of the error kinds"),
    ({"ok": False, "error_kind": "boom", "error": "x"}, "names one of the error kinds"),
    ({"ok": False, "error_kind": "drive"}, "says its error in words"),
    ({"ok": False, "error_kind": "drive", "error": "x", "index": -1}, "index is an operation's position"),
    ({"ok": False, "error_kind": "drive", "error": "x", "traceback": 7}, "traceback is text"),
    ({"ok": True, "regime": {"partial_hash_hits": True}}, "regime names the coordinator"),
    ({"ok": True, "regime": {**REGIME, "use_eagle": [1, 0]}}, "regime has a value of the wrong type"),
])
def test_a_reply_the_protocol_does_not_allow_is_refused_in_one_line(record, says):
    with pytest.raises(MalformedReply, match=says) as refused:
        Reply.parse(record)
    assert "\n" not in str(refused.value)


OPENED = {"ok": True, "state": {"free": 7}, "groups": 2, "operations": {"evict": True, "reset": False},
          "retention_interval": None}


def test_a_payload_read_by_key_is_parsed_once_by_the_op_it_answers():
    opened = Reply.parse(OPENED, "open_machine")
    assert opened.payload == MachineOpened({"free": 7}, 2, can_evict=True, can_reset=False, retention_interval=None)
    chunks = Reply.parse({"ok": True, "results": [{"prompt": 4, "chunks": [4], "stalled_at": None},
                                                  {"prompt": 9, "chunks": [8], "stalled_at": 8}]}, "prefill_chunks")
    assert chunks.payload == (PrefillChunking(4, (4,)), PrefillChunking(9, (8,), 8))
    replay = Reply.parse({"ok": True, "answers": [{}, {"hit": 16, "tokens": 40},
                                                  {"computed": 40, "num_tokens": [32, None]}]}, "session_actions")
    assert replay.payload == (None, Started(16, 40), Stepped(40, (32, None)))
    engine = Reply.parse({"ok": True, "derived": {"groups": []}, "state": {"free": 3}}, "open_engine")
    assert engine.payload == EngineOpened({"groups": []}, {"free": 3})
    # The same record as a case's reply, or an error reply, has none.
    assert Reply.parse(OPENED).payload is None
    assert Reply.parse({"ok": False, "error_kind": "construct", "error": "x"}, "open_machine").payload is None


@pytest.mark.parametrize("record, op, says", [
    ({"ok": True, "state": {}}, "open_machine", "open_machine reply carries the state"),
    ({**OPENED, "operations": {"evict": "yes", "reset": False}}, "open_machine", "wrong type"),
    ({**OPENED, "retention_interval": -1}, "open_machine", "wrong type"),
    ({"ok": True, "results": [{"prompt": 4, "chunks": [4]}]}, "prefill_chunks", "each prompt's chunks"),
    ({"ok": True, "state": {}}, "open_engine", "open_engine reply carries what vLLM derived"),
    ({"ok": True}, "session_actions", "session_actions reply carries its answers"),
    ({"ok": True, "answers": [{"hit": 3}]}, "session_actions", "answers each action with nothing, a hit"),
    ({"ok": True, "answers": [{"computed": 4, "num_tokens": [True]}]}, "session_actions", "answers each action"),
    ({"ok": True, "results": [{"prompt": 4, "chunks": [True], "stalled_at": None}]}, "prefill_chunks",
     "wrong type"),
])
def test_a_payload_the_protocol_does_not_allow_is_refused_in_one_line(record, op, says):
    with pytest.raises(MalformedReply, match=says) as refused:
        Reply.parse(record, op)
    assert "\n" not in str(refused.value)


# One operation's answer of each shape the worker sends (subjects/vllm_side/
# state_machine.py's Machine.apply, engine.py's EngineMachine._answer and apply).
LOOKUP = {"request": "r1", "hit": 16, "num_tokens": 40, "group_blocks": [[3, 4], [0, 7]], "before": [11, 5, 2],
          "after": [11, 5, 2], "mapped": [True, False], "external": 8, "junction": 16}
ALLOCATION = {"request": "r1", "estimates": [2, None], "taken": [2, 0], "free_before": 9, "free_after": 7,
              "allocated": True}
REGISTRATION = {"request": "r1", "n": 32, "hashed_tokens": 32, "num_tokens": [32, 16], "registered_blocks": [[3], []]}
MACHINE_SCHEDULE = {"result": {"scheduled": {"r1": 24}, "preempted": ["r0"], "lookups": [LOOKUP]},
                    "handed_for_zeroing": [5, 6], "running": {"r1": 40}, "waiting": ["r0"],
                    "state": {"num_free": 3, "same": ["hash_map"]}}
MACHINE_OTHERS = [{"result": {}, "handed_for_zeroing": [], "running": {}, "waiting": ["r2"], "state": {"num_free": 3}},
                  {"result": {"reset": False}, "handed_for_zeroing": [], "running": {}, "waiting": [], "state": None},
                  {"result": {"evicted": [3, 4]}, "handed_for_zeroing": [], "running": {"r1": 16}, "waiting": [],
                   "state": {}}]
ENGINE_STEP = {"result": {"finished": ["r0"], "lookups": [], "allocations": [], "registrations": [], "freed": ["r0"],
                          "loading": []},
               "handed_for_zeroing": [], "running": {"r1": 41}, "waiting": [], "state": {"held_elsewhere": []},
               "scheduled": {"result": {"scheduled": {"r1": 1}, "preempted": [], "lookups": [LOOKUP],
                                        "allocations": [ALLOCATION], "registrations": [REGISTRATION],
                                        "evicted": [9], "freed": [], "loading": ["r2"]},
                             "handed_for_zeroing": [7], "running": {"r1": 40}, "waiting": ["r2"],
                             "state": {"num_free": 2}}}
ENGINE_UNOBSERVED = {"result": {}, "running": {"r1": 3}, "waiting": [], "state": None}


def test_each_operations_answer_is_parsed_once_typed_with_its_record_as_sent():
    machine = Reply.parse({"ok": True, "answers": [MACHINE_SCHEDULE, *MACHINE_OTHERS]}, "machine_ops")
    schedule, arrive, reset, evict = machine.payload.answers
    assert schedule.result == OpResult(scheduled={"r1": 24}, preempted=("r0",), lookups=(
        LookupSeen("r1", 16, 40, ((3, 4), (0, 7)), (11, 5, 2), (11, 5, 2), 8, (True, False), 16),))
    assert (schedule.running, schedule.waiting, schedule.handed_for_zeroing) == ({"r1": 40}, ("r0",), (5, 6))
    assert arrive.result == OpResult() and reset.result.reset is False and reset.state is None
    assert evict.result.evicted == (3, 4) and schedule.scheduled is None and schedule.parts() == (schedule,)
    assert [record_of(a) for a in machine.payload.answers] == [MACHINE_SCHEDULE, *MACHINE_OTHERS]
    engine = Reply.parse({"ok": True, "answers": [ENGINE_STEP, ENGINE_UNOBSERVED]}, "engine_ops")
    step, unobserved = engine.payload.answers
    assert step.scheduled is not None and step.parts() == (step.scheduled, step)
    assert step.scheduled.result.allocations == (AllocationSeen("r1", (2, None), 9, 7, (2, 0), True),)
    assert step.scheduled.result.registrations == (REGISTRATION,)  # read as the registration differential's calls
    assert (step.scheduled.result.loading, step.result.freed, step.result.finished) == (("r2",), ("r0",), ("r0",))
    assert unobserved.handed_for_zeroing == () and unobserved.state is None
    assert record_of(step) == ENGINE_STEP
    # An engine crash: the answers before it, and the failing operation's allocations.
    crashed = Reply.parse({"ok": False, "error_kind": "drive", "error": "ValueError: no blocks", "index": 1,
                           "origin": "vllm", "answers": [ENGINE_UNOBSERVED],
                           "allocations": [{**{k: v for k, v in ALLOCATION.items() if k != "allocated"},
                                            "free_after": None}]}, "engine_ops")  # raised: not yet "allocated"
    assert len(crashed.payload.answers) == 1 and crashed.payload.allocations[0].free_after is None
    # An error before any answer (nothing open, a worker that died) carries none.
    assert Reply.parse({"ok": False, "error_kind": "crashed", "error": "x"}, "machine_ops").payload.answers == ()


def test_an_answer_made_whole_is_a_new_answer_the_record_sent_unchanged():
    sent = {"ok": True, "answers": [MACHINE_SCHEDULE]}
    reply = Reply.parse(json.loads(json.dumps(sent)), "machine_ops")
    (answer,) = reply.payload.answers
    whole = answer.with_state({"num_free": 3, "hash_map": []})
    kept = reply.with_answers([whole])
    assert record_of(kept)["answers"][0]["state"] == {"num_free": 3, "hash_map": []}
    assert kept.payload.answers == (whole,) and record_of(reply) == sent and record_of(answer) == MACHINE_SCHEDULE
    step = OpAnswer.parse(ENGINE_STEP)
    assert step.scheduled is not None
    made = step.with_scheduled(step.scheduled.with_state({"num_free": 2, "blocks": []}))
    assert record_of(made)["scheduled"]["state"] == {"num_free": 2, "blocks": []} and record_of(step) == ENGINE_STEP


@pytest.mark.parametrize("record, says", [
    ({"ok": True}, "operations reply carries its answers"),
    ({"ok": True, "answers": [{**MACHINE_SCHEDULE, "running": ["r1"]}]}, r"wrong type \(running\)"),
    ({"ok": True, "answers": [{k: v for k, v in MACHINE_SCHEDULE.items() if k != "waiting"}]}, "lacks waiting"),
    ({"ok": True, "answers": [{**MACHINE_SCHEDULE, "result": {"rest": True}}]}, "result holds .* has rest"),
    ({"ok": True, "answers": [{**MACHINE_SCHEDULE, "result": {"lookups": [{**LOOKUP, "hit": -1}]}}]},
     r"lookup names its request.*wrong type \(hit\)"),
    ({"ok": True, "answers": [{**ENGINE_UNOBSERVED, "result": {"allocations": [{"request": "r1"}]}}]},
     "allocation names its request.*lacks estimates, free_before, free_after"),
    ({"ok": True, "answers": [{**ENGINE_UNOBSERVED, "scheduled": {"result": {}}}]}, "answer carries its result"),
    ({"ok": False, "error_kind": "drive", "error": "x", "answers": [], "allocations": {}}, "allocations are a list"),
    ({"ok": True, "answers": ["done"]}, "answer carries its result"),
])
def test_an_operations_answer_the_protocol_does_not_allow_is_refused_in_one_line(record, says):
    for op in ("machine_ops", "engine_ops"):
        with pytest.raises(MalformedReply, match=says) as refused:
            Reply.parse(record, op)
        assert "\n" not in str(refused.value)


def test_the_worker_names_exactly_the_kinds_kvspec_parses():
    sent = {errors.UNSUPPORTED, errors.CONSTRUCT, errors.DRIVE, errors.KVSPEC, errors.ENVIRONMENT, errors.FATAL}
    # CRASHED is the parent's word: a worker that vLLM's code ended cannot say so.
    assert sent == {k.value for k in ErrorKind} - {ErrorKind.CRASHED.value}


class _Driver:
    """A driver whose case run raises what it is given."""

    machine = engine = None

    def __init__(self, raising):
        self.raising = raising

    def run(self, case):
        raise self.raising


@pytest.mark.parametrize("raising, kind", [
    (Unsupported("no num_prefill_lookahead"), ErrorKind.UNSUPPORTED),
    (Rejected("ValueError: block size"), ErrorKind.CONSTRUCT),
    (AssertionError("boom"), ErrorKind.DRIVE),
])
def test_each_failure_of_a_case_is_answered_with_its_kind(raising, kind):
    reply = Reply.parse(loop._run_one(_Driver(raising), {}))
    assert reply.failed_as(kind) and str(raising) in reply.error.message and "seconds" in reply


def test_a_message_for_nothing_open_is_kvspecs_error():
    driver = _Driver(None)
    sent = []
    for request in (MachineOps([{}]), MachineTrace(), EngineOps([])):
        parsed = parse_request(request.to_wire())
        loop.HANDLERS[parsed.op](driver, parsed, sent.append)
    assert [Reply.parse(r).error.kind for r in sent] == [ErrorKind.KVSPEC] * 3


def test_a_bad_operation_is_kvspecs_error_with_its_index():
    class Machine:
        def apply(self, op, observe):
            if op.get("id") == "gone":
                raise BadOperation("finish names request 'gone', which is not running")
            return {"result": {}}

    driver = types.SimpleNamespace(machine=Machine())
    reply = Reply.parse(loop._machine_op(driver, parse_request(MachineOps([{}, {"id": "gone"}]).to_wire())))
    assert reply.failed_as(ErrorKind.KVSPEC) and reply.error.index == 1 and reply["answers"] == [{"result": {}}]


def test_a_subject_that_cannot_be_imported_says_so_in_its_hello(monkeypatch):
    def no_vllm():
        raise ModuleNotFoundError("No module named 'vllm'")

    monkeypatch.setattr(loop, "Driver", no_vllm)
    sent = []
    assert loop.serve([], sent.append) == 1
    (hello,) = sent
    assert Reply.parse(hello).failed_as(ErrorKind.FATAL)


def test_a_malformed_reply_from_the_worker_is_kvspecs_error_in_one_line(tmp_path, monkeypatch):
    # A stand-in worker whose hello is one the protocol does not allow (an
    # error said the old way, without its kind).
    stand_in = tmp_path / "worker.py"
    stand_in.write_text("import json\nprint(json.dumps({'ok': False, 'fatal': True, 'error': 'no vllm'}))\n")
    monkeypatch.setattr(process, "WORKER", stand_in)
    with pytest.raises(InfrastructureError) as refused:
        SubjectProcess(current_environment(), timeout=30)
    message = str(refused.value)
    assert "\n" not in message and "reply is malformed" in message and "not a vLLM finding" in message
    assert "error kinds" in message


def test_a_connector_lookup_says_whether_its_groups_diverged():
    seen = {"request": "r1", "hit": 32, "num_tokens": 40, "group_blocks": [[3, 4], []]}
    assert LookupSeen.parse(seen).diverged is False
    assert LookupSeen.parse({**seen, "diverged": True}).diverged is True
    with pytest.raises(MalformedReply):
        LookupSeen.parse({**seen, "diverged": "yes"})


def test_a_negative_block_estimate_is_vllms_answer_and_parsed_as_it_is():
    """0.28's Mamba 'align' manager returns the blocks it needs minus those the
    request holds, negative when it holds more: the worker reports it, the
    model judges it; a non-integer estimate is still malformed."""
    from kvspec.model.replies import AllocationSeen, MalformedReply

    seen = AllocationSeen.parse({**ALLOCATION, "estimates": [-1, 0]})
    assert seen.estimates == (-1, 0)
    with pytest.raises(MalformedReply, match="estimates"):
        AllocationSeen.parse({**ALLOCATION, "estimates": [1.5, 0]})
