"""The KV connector an upstream script (and an engine test) writes for a
finding found with kvspec's own connector (``CONNECTOR_CODE``:
``ExternalStoreConnector``, against vLLM's public ``KVConnectorBase_V1``),
without vLLM: it compiles, the script carries each request's load plan and
imports nothing of kvspec, a malformed plan is refused in one line, and the
connector answers the scheduler as ``KvspecConnector`` does and its worker
side reports what kvspec's engine driver reports (vLLM's base classes
stubbed: only the calls both make are stood in for).  On real vLLM the two
are compared call by call by ``tests/integration/test_script_fidelity.py``."""

from __future__ import annotations

import enum
import importlib
import json
import sys
import types
from pathlib import Path

import pytest

from tests.support import assert_ruff_clean_as_vllm_lints
from kvspec.model.case import InvalidCase
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding
from kvspec.subjects.upstream_repro import CONNECTOR_CODE, SCRIPT_CONNECTOR, Unscriptable, engine_values, repro_script

FIXTURE = Path(__file__).parent.parent / "fixtures" / "finding_engine_mamba_estimate_0.34.0.json"
PLAN = {"offer": 100, "async": False, "delay": 0, "fail": 1}


def _own_doc(plan: dict | None = None) -> dict:
    """The fixture's finding as one found with kvspec's connector: its first
    arrival carries a load plan."""
    doc = json.loads(FIXTURE.read_text())
    doc["inputs"]["engine_program"]["engine"]["kv_connector"] = "KvspecConnector"
    doc["run"]["engine_settings"]["kv_connector"] = "KvspecConnector"
    arrive = next(op for op in doc["inputs"]["engine_program"]["ops"] if op["do"] == "arrive")
    arrive["load"] = dict(plan or PLAN)
    doc["inputs"]["engine_program"]["ops"].append({"do": "arrive", "id": "r9", "tokens": [1, 2], "max_tokens": 1})
    return doc


def _values(ops: tuple, connector: str = "KvspecConnector") -> dict:
    """The script writer's values for ``ops`` on the fixture's setup and
    settings (with ``connector``), however the program was made: the
    writer validates what it writes on its own."""
    doc = _own_doc()
    setup = EngineProgram.from_dict(doc["inputs"]["engine_program"]).setup
    settings = {**doc["run"]["engine_settings"], "kv_connector": connector}
    return engine_values(types.SimpleNamespace(setup=setup, ops=ops), settings, "0.34.0", True)


def _code(doc: dict, category: Category = Category.STATE_BLOCK_ESTIMATE) -> str:
    finding = Finding.from_dict(doc)
    program = EngineProgram.from_dict(finding.inputs["engine_program"])
    return repro_script(program, finding.run["engine_settings"], category, "0.34.0").code


def test_the_script_writes_the_connector_and_carries_the_load_plans():
    code = _code(_own_doc())
    compile(code, "repro.py", "exec")
    assert "kvspec" not in code.split('"""', 2)[2]  # nothing of kvspec's below the docstring, the flags included
    assert "class ExternalStoreConnector(KVConnectorBase_V1, SupportsHMA):" in code
    assert 'KV_CONNECTOR = "ExternalStoreConnector"\nKV_LOAD_FAILURE_POLICY = "fail"\n' in code
    assert "kv_connector_module_path=__name__," in code  # vLLM imports it from the script itself
    assert '        {"offer": 100, "async": False, "delay": 0, "fail": 1},\n' in code
    # An arrival without a plan says so; the driver hands the worker side's output on.
    assert '    # add_request: 2 prompt tokens, max_tokens 1\n    ("arrive", "r9", [1, 2], 1, None),\n' in code
    assert "loads = kv_connector_output(worker, output)" in code and "kv_connector_output=loads," in code
    assert '"kv_connector": "ExternalStoreConnector"' in code.replace("\n#  ", " ")
    # A finding without kvspec's connector keeps the engine code as it was: no connector written.
    plain = json.loads(FIXTURE.read_text())
    assert "ExternalStoreConnector" not in _code(plain) and "KVConnectorRole" not in _code(plain)


def test_the_script_passes_ruff_check_and_format_under_vllms_configuration(tmp_path):
    assert_ruff_clean_as_vllm_lints(_code(_own_doc()), tmp_path, "repro.py")


def test_the_recorded_failure_policy_is_the_scripts():
    doc = _own_doc()
    doc["run"]["engine_settings"]["kv_load_failure_policy"] = "recompute"
    assert 'KV_LOAD_FAILURE_POLICY = "recompute"' in _code(doc)
    for bad in (None, "recompute'); import os; ('"):
        doc["run"]["engine_settings"]["kv_load_failure_policy"] = bad
        with pytest.raises(Unscriptable, match="kv_load_failure_policy"):
            _code(doc)


@pytest.mark.parametrize("plan, field", [
    ({"offer": "100; import os", "async": False, "delay": 0, "fail": None}, "offer"),
    ({"offer": 100, "async": "yes", "delay": 0, "fail": None}, "async"),
    ({"offer": 100, "async": False, "delay": -1, "fail": None}, "delay"),
    ({"offer": True, "async": False, "delay": 0, "fail": None}, "offer"),
    ({"offer": 100, "async": False, "delay": 0, "fail": 2.5}, "fail"),
    ({"offer": 100, "async": False, "delay": 0, "fail": None, "code": "x"}, "offer, async, delay, fail"),
    ("offer 100", "offer, async, delay, fail"),
])
def test_a_malformed_plan_is_refused_in_one_line(plan, field):
    # The finding file's plan is refused by the engine program's own validation ...
    with pytest.raises(InvalidCase):
        _code(_own_doc(plan) if isinstance(plan, dict) else {**_own_doc(), "inputs": {
            **_own_doc()["inputs"], "engine_program": {**_own_doc()["inputs"]["engine_program"], "ops": [
                {"do": "arrive", "id": "r0", "tokens": [1, 2], "load": plan}]}}})
    # ... and again by the script's writer, however the program was made.
    with pytest.raises(Unscriptable) as refused:
        _values(({"do": "arrive", "id": "r0", "tokens": [1, 2], "load": plan},))
    message = str(refused.value)
    assert "\n" not in message and field in message and "no upstream script" in message


def test_a_plan_without_its_connector_is_refused():
    doc = _own_doc()
    doc["inputs"]["engine_program"]["engine"]["kv_connector"] = "DecodeBenchConnector"
    doc["run"]["engine_settings"]["kv_connector"] = "DecodeBenchConnector"
    with pytest.raises((Unscriptable, InvalidCase)):
        _code(doc)
    with pytest.raises(Unscriptable, match="kvspec's own KV connector, which its settings do not name"):
        _values(({"do": "arrive", "id": "r0", "tokens": [1, 2], "load": PLAN},), "DecodeBenchConnector")
    # A well-formed plan is written as given, an arrival without one as None.
    ops = _values(({"do": "arrive", "id": "r0", "tokens": [1, 2], "load": PLAN},
                   {"do": "arrive", "id": "r1", "tokens": [3]}, {"do": "step"}))["OPS"]
    assert ops == [("arrive", "r0", [1, 2], 16, PLAN), ("arrive", "r1", [3], 16, None), ("step",)]


# -- the connector's behaviour against kvspec's, vLLM's base classes stubbed ---


class _Base:
    def __init__(self, vllm_config, role, kv_cache_config=None):
        self._connector_metadata = None

    def bind_connector_metadata(self, metadata):
        self._connector_metadata = metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata


class _Output:
    def __init__(self, finished_recving=None, invalid_block_ids=None):
        self.finished_recving, self.invalid_block_ids = finished_recving, invalid_block_ids


@pytest.fixture
def stubbed(monkeypatch):
    """vLLM's connector base module stood in for; kvspec's connector module
    imported afresh over it, the script's connector code run over it."""
    base = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")
    base.KVConnectorBase_V1, base.KVConnectorMetadata = _Base, type("KVConnectorMetadata", (), {})
    base.SupportsHMA = type("SupportsHMA", (), {})
    base.KVConnectorRole = enum.Enum("KVConnectorRole", "SCHEDULER WORKER")
    parts = base.__name__.split(".")
    for i in range(1, len(parts)):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    monkeypatch.setitem(sys.modules, base.__name__, base)
    monkeypatch.delitem(sys.modules, "kvspec.subjects.vllm_side.connector", raising=False)
    kvspec_side = importlib.import_module("kvspec.subjects.vllm_side.connector")
    script = dict(vars(base), KVConnectorOutput=_Output)
    exec(compile(CONNECTOR_CODE, "repro.py", "exec"), script)
    yield kvspec_side, script
    monkeypatch.delitem(sys.modules, "kvspec.subjects.vllm_side.connector", raising=False)


def _config(groups: int, block_size: int = 16):
    spec = types.SimpleNamespace(kv_cache_spec=types.SimpleNamespace(block_size=block_size))
    return types.SimpleNamespace(kv_cache_groups=[spec] * groups)


def _request(rid: str, prompt: int, plan: dict | None, key: str, generated: int = 0):
    params = {key: dict(plan)} if plan is not None else None
    return types.SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, num_tokens=prompt + generated,
                                 kv_transfer_params=params)


class _Blocks:
    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (list(self.ids),)


PLANS = [{"offer": offer, "async": load_async, "delay": delay, "fail": fail}
         for offer in (0, 15, 16, 100, 149, 500) for load_async in (False, True)
         for delay in (0, 2) for fail in (None, 0, 1, 7)]


@pytest.mark.parametrize("groups", [1, 3])
def test_the_scripts_connector_answers_the_scheduler_as_kvspecs_does(stubbed, groups):
    kvspec_side, script = stubbed
    theirs = script[SCRIPT_CONNECTOR](None, script["KVConnectorRole"].SCHEDULER, _config(groups))
    ours = kvspec_side.KvspecConnector(None, "scheduler", _config(groups))
    for n, plan in enumerate(PLANS):
        for local in (0, 16, 96, 148):
            calls = []
            for connector, key in ((ours, kvspec_side.PLAN_KEY), (theirs, script["PLAN_KEY"])):
                request = _request(f"r{n}-{local}", 149, plan, key, generated=n % 2)
                matched = connector.get_num_new_matched_tokens(request, local)
                may = connector.may_load_async(request)
                if matched[0]:
                    connector.update_state_after_alloc(request, _Blocks(range(100, 110)), matched[0])
                connector.update_state_after_alloc(request, _Blocks(range(100, 110)), 0)
                loads = connector.build_connector_meta(None).loads
                finished = connector.request_finished(request, [])
                calls.append((matched, may, [{k: load[k] for k in ("request", "async", "delay", "failing")}
                                             for load in loads], finished))
            assert calls[0] == calls[1], (plan, local)
    no_plan = [c.get_num_new_matched_tokens(_request("x", 149, None, "k"), 0) for c in (ours, theirs)]
    assert no_plan == [(0, False), (0, False)]


def test_the_scripts_worker_side_reports_as_kvspecs_engine_driver_does(stubbed):
    """Per executed step: the loads its metadata started, asynchronous ones
    finishing ``delay`` steps later (finished_recving), failing blocks in
    invalid_block_ids -- what ``EngineMachine._transfers`` reports."""
    from kvspec.subjects.vllm_side.engine import EngineMachine

    kvspec_side, script = stubbed
    worker = script[SCRIPT_CONNECTOR](None, script["KVConnectorRole"].WORKER, _config(1))
    driver = types.SimpleNamespace(pending_loads=[])
    steps = [[{"request": "a", "async": True, "delay": 2, "failing": None},
              {"request": "b", "async": False, "delay": 0, "failing": 7}],
             [], [{"request": "c", "async": True, "delay": 0, "failing": 3}], [],
             [{"request": "d", "async": True, "delay": 1, "failing": 9}], [], []]
    reports = []
    for loads in steps:
        output = types.SimpleNamespace(kv_connector_metadata=kvspec_side.KvspecConnectorMetadata(loads))
        ours = EngineMachine._transfers(driver, output)
        output = types.SimpleNamespace(kv_connector_metadata=script["ExternalLoadMetadata"](loads))
        theirs = script["kv_connector_output"](worker, output)
        theirs = theirs and {"invalid_block_ids": theirs.invalid_block_ids,
                             "finished_recving": theirs.finished_recving}
        assert ours == theirs, loads
        reports.append(ours)
    assert reports == [{"invalid_block_ids": {7}, "finished_recving": set()}, None,
                       {"invalid_block_ids": {3}, "finished_recving": {"a", "c"}}, None, None,
                       {"invalid_block_ids": {9}, "finished_recving": {"d"}}, None]


def test_the_connector_code_is_within_vllms_line_length():
    assert max(len(line) for line in CONNECTOR_CODE.splitlines()) <= 88
    compile(CONNECTOR_CODE, "repro.py", "exec")
    assert "kvspec" not in CONNECTOR_CODE

