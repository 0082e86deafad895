"""The worker's requests, typed (``model.requests``) and parsed once on the
worker's side (``model.wire.parse_request``, stdlib only), without vLLM:
every request survives the wire, the wire form is the one the worker has
always read, and a line that is not a request is kvspec's one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import attrs
import pytest

from kvspec.model.case import Case, LookupProbe, prefill
from kvspec.model.corpus import case as corpus_case
from kvspec.model.replies import ErrorKind, Reply
from kvspec.model.requests import (EngineOps, MachineOps, MachineTrace, MalformedRequest, MambaLayerCheckpointFields,
                                   OpenEngine, OpenMachine, OpenSession, PrefillChunks, Quit, Request, Run,
                                   SessionActions, Stats, Stream, case_message, request_of)
from kvspec.model.wire import OPS, parse_request
from kvspec.subjects import worker
from kvspec.subjects.vllm_side import loop

SEED = corpus_case("seed_52419").config
CASE = Case(SEED, 22, (prefill(22),), LookupProbe(9, 2))
CLASSES = (Run, Stream, OpenSession, SessionActions, PrefillChunks, MambaLayerCheckpointFields, OpenMachine,
           MachineOps, MachineTrace, OpenEngine, EngineOps, Stats, Quit)
EXAMPLES = [
    Run.of(CASE),
    Stream.of([CASE, Case(SEED, 3, (prefill(3),))]),
    OpenSession({"groups": [], "num_blocks": 16}),
    SessionActions([{"do": "start", "id": "r0", "tokens": [1, 2]}, {"do": "free", "id": "r0"}]),
    PrefillChunks(case_message(CASE), [1, 2, 3]),
    MambaLayerCheckpointFields(),
    OpenMachine({"groups": [], "retention_interval": None}),
    MachineOps([{"do": "schedule"}, {"do": "finish", "id": "r0"}], observe=False),
    MachineTrace(),
    OpenEngine({"model": "toy", "engine_args": {"block_size": 16}}),
    EngineOps([{"do": "step"}]),
    Stats(),
    Quit(),
]


def test_each_op_has_one_class_with_the_wires_fields_and_one_handler():
    assert {cls.op for cls in CLASSES} == set(OPS) and len(CLASSES) == len(OPS)
    for cls in CLASSES:
        assert [f.name for f in attrs.fields(cls)] == [f.name for f in OPS[cls.op]], cls
    assert set(loop.HANDLERS) == set(OPS) - {"quit"}
    assert {type(r) for r in EXAMPLES} == set(CLASSES)


@pytest.mark.parametrize("request_", EXAMPLES, ids=lambda r: r.op)
def test_a_request_survives_the_wire_and_the_workers_parse(request_: Request):
    line = json.dumps(request_.to_wire())
    assert request_of(json.loads(line)) == request_
    # The worker reads the very fields sent.
    parsed = parse_request(json.loads(line))
    assert parsed.op == request_.op
    assert {"op": parsed.op, **parsed._asdict()} == json.loads(line)


def test_the_wire_form_is_the_one_the_worker_has_always_read():
    assert Run.of(CASE).to_wire() == {"op": "run", "case": case_message(CASE)}
    assert case_message(CASE)["probe"] == {"shared": 9, "extra": 2}
    assert Stream.of([CASE]).to_wire() == {"op": "stream", "cases": [case_message(CASE)]}
    assert MachineOps([{"do": "schedule"}], observe=False).to_wire() == {
        "op": "machine_ops", "ops": [{"do": "schedule"}], "observe": False}
    assert OpenEngine({"model": "toy"}).to_wire() == {"op": "open_engine", "setup": {"model": "toy"}}
    assert PrefillChunks({"groups": []}, (4, 8)).to_wire() == {"op": "prefill_chunks", "case": {"groups": []},
                                                              "prompts": [4, 8]}
    assert MachineTrace().to_wire() == {"op": "machine_trace"} and Quit().to_wire() == {"op": "quit"}
    # An optional field left out takes its default, as the worker always did.
    assert parse_request({"op": "engine_ops", "ops": []}).observe is True


def test_what_opens_and_what_needs_an_open_machine_engine_or_replay():
    assert {cls.op for cls in CLASSES if cls.opens} == {"open_machine", "open_engine", "open_session"}
    assert {cls.op: cls.needs for cls in CLASSES if cls.needs} == {
        "machine_ops": "machine", "machine_trace": "machine", "engine_ops": "engine", "session_actions": "replay"}


@pytest.mark.parametrize("record, says", [
    ([], "a request is a JSON object, not list"),
    ({"ops": []}, "unknown request None"),
    ({"op": "run_many", "cases": []}, "unknown request 'run_many'"),
    ({"op": "run"}, "a run request needs its case"),
    ({"op": "stats", "verbose": True}, "a stats request has no field verbose"),
    ({"op": "machine_ops", "ops": {"do": "schedule"}}, "machine_ops request's ops is an array of objects, not"),
    ({"op": "engine_ops", "ops": [{"do": "step"}, "step"]}, "engine_ops request's ops is an array of objects"),
    ({"op": "machine_ops", "ops": [], "observe": "yes"}, "observe is true or false, not 'yes'"),
    ({"op": "machine_ops", "ops": [], "observe": 1}, "observe is true or false, not 1"),
    ({"op": "prefill_chunks", "case": {}, "prompts": [4, True]}, "prompts is an array of integers"),
    ({"op": "open_engine", "setup": None}, "open_engine request's setup is an object, not None"),
])
def test_a_request_the_protocol_does_not_allow_is_refused_in_one_line(record, says):
    with pytest.raises(MalformedRequest, match=says) as refused:
        parse_request(record)
    assert "\n" not in str(refused.value)
    with pytest.raises(MalformedRequest, match=says):  # the parent's parse is the same one
        request_of(record)


@pytest.mark.parametrize("make, says", [
    (lambda: MachineOps([{"do": "schedule"}, "step"]), "ops is an array of objects"),
    (lambda: MachineOps([], observe=1), "observe is true or false"),
    (lambda: PrefillChunks({}, [4, 4.5]), "prompts is an array of integers"),
    (lambda: Run(None), "case is an object"),
])
def test_a_request_the_worker_would_refuse_cannot_be_made(make, says):
    with pytest.raises(MalformedRequest, match=says):
        make()


class _Driver:
    capabilities = {"vllm_version": "0.0"}
    serial, managers_built, reuse_managers = 3, 1, True


def test_the_worker_answers_a_malformed_line_with_kvspecs_error_and_goes_on(monkeypatch):
    monkeypatch.setattr(loop, "Driver", _Driver)
    sent: list = []
    lines = ["{not json\n", json.dumps({"op": "machine_ops", "ops": "all"}) + "\n",
             json.dumps({"op": "teleport"}) + "\n", json.dumps(Stats().to_wire()) + "\n",
             json.dumps(Quit().to_wire()) + "\n", json.dumps(Stats().to_wire()) + "\n"]
    assert loop.serve(lines, sent.append) == 0
    hello, *replies = [Reply.parse(r) for r in sent]
    assert hello.ok and len(replies) == 4  # nothing after quit is answered
    assert [r.error.kind for r in replies[:3]] == [ErrorKind.KVSPEC] * 3
    assert "one JSON object per line" in replies[0].error.message
    assert "ops is an array of objects" in replies[1].error.message
    assert replies[2].error.message == "unknown request 'teleport'"
    assert replies[3].ok and replies[3]["cases"] == 3


def test_the_handlers_read_the_parsed_request():
    seen = []

    class Machine:
        def apply(self, op, observe):
            seen.append((op, observe))
            return {"result": op["do"]}

    driver = types.SimpleNamespace(machine=Machine())
    request = parse_request(MachineOps([{"do": "schedule"}, {"do": "step"}], observe=False).to_wire())
    reply = Reply.parse(loop._machine_op(driver, request))
    assert reply["answers"] == [{"result": "schedule"}, {"result": "step"}]
    assert seen == [({"do": "schedule"}, False), ({"do": "step"}, False)]


def test_the_worker_side_imports_no_attrs_z3_or_hypothesis():
    # The runtime need not have them: imports of them fail here, as they would there.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('attr', 'attrs', 'z3', 'hypothesis'):\n"
        "            raise ImportError('not in the runtime: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.path.insert(0, {os.path.dirname(worker.__file__)!r})\n"
        "import worker\n"
        "worker.load_kvspec_namespace()\n"
        "from kvspec.subjects.vllm_side import loop\n"
        "print(loop.parse_request({'op': 'stats'}).op)\n")
    run = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "stats", run.stderr[-2000:]


@pytest.mark.parametrize("request_", [Stream([]), Quit()], ids=lambda r: r.op)
def test_a_session_exchange_is_one_request_and_one_reply(request_):
    from kvspec.subjects.process import SubjectProcess

    idle = object.__new__(SubjectProcess)  # no worker: refused before anything is sent
    with pytest.raises(TypeError, match="not one exchange"):
        idle.session(request_)
