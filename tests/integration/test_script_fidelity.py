"""The upstream script (and the engine test, which shares its engine code)
builds the scheduler kvspec's engine worker built and schedules as it did:
for engine setups of each scriptable kind on 0.34.0 (kvspec's own KV
connector's loads among them: synchronous, asynchronous, failing), the
worker's scheduler (``EngineArgs`` over the toy model, the release's own
layers and planning)
and the script's (vLLM's config classes, the KVCacheConfig from the settings
the worker recorded), each in a fresh process, hold the same values -- the
scheduler's, its configuration's, its manager's, coordinator's, each group
manager's and spec's -- but for the ones listed here, which no part of the
scheduler reads; and they schedule a program's steps alike, their KV
connectors answering the scheduler and reporting loads alike.

A spec field the worker's Mamba layer set and the script did not (the prefill
checkpoint, mamba_state_slot_nulled's finding) shows here as a difference."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import kvspec
from kvspec.model.engine import EngineProgram, EngineSetup
from kvspec.model.finding import Category
from kvspec.subjects.provision import ensure_release, ensure_runtime
from kvspec.subjects.upstream_repro import repro_script

HELPER = Path(__file__).with_name("scheduler_fidelity.py")
VERSION = "0.34.0"

# Values the two schedulers may hold differently, each with why no part of the
# scheduler reads it (vLLM 0.34.0's v1/core: the scheduler, the KV cache
# manager, its coordinator and group managers).
NOT_READ_BY_THE_SCHEDULER = {
    # The KV-cache planning's inputs: the script gives the KVCacheConfig the planning made.
    r"cache_config\.(num_gpu_blocks_override|prefix_cache_retention_interval|prefix_match_unit)": "planning input",
    r"scheduler_config\.disable_hybrid_kv_cache_manager": "planning input (the script's groups are the planning's)",
    r"cache_config\.user_specified_block_size": "the attention backend's selection",
    # The layers' memory layout (placeholders in the script, said in its docstring).
    r"cache_config\.(kv_cache_layout|mamba_page_size_padded)": "memory layout",
    r"kv_cache_config\.(kv_cache_tensors|cache_hit_alignment_tokens)": "the model runner's (the coordinator "
                                                                       "derives its own alignment)",
    r"group\d+\.spec\.(num_kv_heads|head_size|head_size_v|page_size_padded|block_stride_alignment|mamba_type)":
        "memory layout and the attention/Mamba kernel",
    # The device side.
    r"parallel_config\.(worker_cls|disable_custom_all_reduce)": "the GPU worker's",
    r"kv_transfer_config\.(engine_id|kv_buffer_device)": "the connector's worker side (engine_id is random)",
}

_PROGRAM = (
    {"do": "arrive", "id": "r0", "tokens": list(range(128)), "max_tokens": 3},
    {"do": "arrive", "id": "r1", "tokens": [*range(128), 697], "max_tokens": 2},
    *({"do": "step"},) * 6,
    {"do": "arrive", "id": "r2", "tokens": [*range(64), *range(500, 540)], "max_tokens": 2},
    {"do": "abort", "id": "r1"},
    *({"do": "step"},) * 5,
)
PROMPT = list(range(1, 150))  # 149 tokens: 9 whole blocks of 16 and 5 more


def _loading(sync: dict, later: dict) -> tuple[dict, ...]:
    """kvspec's connector's program: a request whose load plan is ``sync``, a
    second of another prompt planned ``later`` while the first is in flight,
    then a resend of the first prompt with no plan (its hit is what loaded)."""
    return (
        {"do": "arrive", "id": "a", "tokens": PROMPT, "max_tokens": 3, "load": sync},
        {"do": "step"},
        {"do": "arrive", "id": "c", "tokens": list(range(300, 390)), "max_tokens": 2, "load": later},
        *({"do": "step"},) * 5,
        {"do": "arrive", "id": "b", "tokens": PROMPT, "max_tokens": 2},
        *({"do": "step"},) * 5,
    )


_OWN = dict(model="toy-llama", num_gpu_blocks=40, block_size=16, kv_connector="KvspecConnector")
# kvspec's own connector, as the script writes it (ExternalStoreConnector):
# the same answers to the scheduler, the same worker reports.
CONNECTOR_CASES = (
    # a synchronous load (then one of all but the last token)
    (EngineSetup(**_OWN, async_scheduling=False),
     _loading({"offer": 100, "async": False, "delay": 0, "fail": None},
              {"offer": 200, "async": False, "delay": 0, "fail": None})),
    # asynchronous loads finishing 2 and 0 executed steps later, under async scheduling
    (EngineSetup(**_OWN, async_scheduling=True),
     _loading({"offer": 100, "async": True, "delay": 2, "fail": None},
              {"offer": 90, "async": True, "delay": 0, "fail": None})),
    # a failing synchronous load under 'fail': vLLM evicts from the failed block and fails the request
    (EngineSetup(**_OWN, async_scheduling=False, kv_load_failure_policy="fail"),
     _loading({"offer": 100, "async": False, "delay": 0, "fail": 1},
              {"offer": 64, "async": True, "delay": 1, "fail": 0})),
    # a failing asynchronous load under 'recompute'
    (EngineSetup(**_OWN, async_scheduling=False, kv_load_failure_policy="recompute"),
     _loading({"offer": 120, "async": True, "delay": 1, "fail": 2},
              {"offer": 50, "async": False, "delay": 0, "fail": 1})),
    # a Mamba hybrid, the release's defaults (async scheduling): loads succeed on two or more groups
    (EngineSetup(model="toy-nemotron-h", num_gpu_blocks=30, max_model_len=256, kv_connector="KvspecConnector"),
     _loading({"offer": 128, "async": False, "delay": 0, "fail": 1},
              {"offer": 90, "async": True, "delay": 1, "fail": None})),
)
SETUPS = (
    # mamba_state_slot_nulled's finding's setup: the release's defaults (async scheduling, the admission gate).
    EngineSetup(model="toy-nemotron-h", num_gpu_blocks=22, max_model_len=256),
    EngineSetup(model="toy-nemotron-h", num_gpu_blocks=30, max_model_len=256, kv_connector="DecodeBenchConnector",
                async_scheduling=False, retention_interval=64, max_num_batched_tokens=128),
    EngineSetup(model="toy-qwen3-next", num_gpu_blocks=40, max_model_len=256, prefix_match_unit=16,
                max_num_batched_tokens=64, reserve_full_isl=False),
    EngineSetup(model="toy-gpt-oss", num_gpu_blocks=40, max_model_len=256, block_size=16, max_num_seqs=4),
    EngineSetup(model="toy-llama", num_gpu_blocks=30, max_model_len=256, block_size=32, prefix_caching=False,
                max_num_batched_tokens=64),
)


def _run(args: list[str], env: dict[str, str]) -> list[dict]:
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _allowed(key: str) -> bool:
    return any(re.fullmatch(pattern, key) for pattern in NOT_READ_BY_THE_SCHEDULER)


# kvspec's connector and the script's are one connector under two names, each
# imported from its own module; nothing else of theirs may differ.
RENAMED = {"connector": ("KvspecConnector", "ExternalStoreConnector"),
           "kv_transfer_config.kv_connector": ("KvspecConnector", "ExternalStoreConnector"),
           "kv_transfer_config.kv_connector_module_path": ("kvspec.subjects.vllm_side.connector", "repro")}


def _differing(a: dict, b: dict) -> dict:
    return {k: (a.get(k, "<none>"), b.get(k, "<none>")) for k in sorted(set(a) | set(b))
            if a.get(k, "<none>") != b.get(k, "<none>") and not _allowed(k)
            and RENAMED.get(k) != (a.get(k), b.get(k))}


def test_the_script_builds_and_schedules_as_the_engine_worker(tmp_path):
    python, tree = str(ensure_runtime()), str(ensure_release(VERSION))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "KVSPEC_", "PYTHON"))}
    env["PYTHONPATH"] = tree
    programs = [EngineProgram(setup, _PROGRAM) for setup in SETUPS]
    programs += [EngineProgram(setup, ops) for setup, ops in CONNECTOR_CASES]
    cases = tmp_path / "engine.json"
    cases.write_text(json.dumps([{"setup": p.setup.message(), "ops": list(p.ops)} for p in programs]))
    kvspec_dir = os.path.dirname(os.path.abspath(kvspec.__file__))
    engine = _run([python, "-B", str(HELPER), "engine", kvspec_dir, str(cases)], env)
    # Each script written from the settings its worker recorded, as a finding carries them.
    scripts = tmp_path / "script.json"
    scripts.write_text(json.dumps([{"code": repro_script(p, e["derived"], Category.SUBJECT_CRASH, VERSION).code}
                                   for p, e in zip(programs, engine)]))
    script = _run([python, "-B", str(HELPER), "script", str(scripts)], env)
    for program, ours, theirs in zip(programs, engine, script):
        setup = program.setup
        differing = _differing(ours["fingerprint"], theirs["fingerprint"])
        assert not differing, (setup.describe(), differing)
        # (a failed load ends its request: that program schedules less)
        assert sum(len(step) for step in ours["steps"]) >= (4 if program.ops == _PROGRAM else 3), setup.describe()
        assert ours["steps"] == theirs["steps"], setup.describe()
        # The connector's answers and the worker's reports, call by call.
        assert ours["connector"] == theirs["connector"], setup.describe()
    # Not vacuous: the values compared are the scheduler's own, the Mamba
    # groups' checkpoint among them, and the finding's first step is compared.
    nemotron = engine[0]["fingerprint"]
    assert len(nemotron) > 150 and nemotron["scheduler.mamba_has_prefill_checkpoint_blocks"] is True
    assert nemotron["group0.spec.num_prefill_checkpoint_blocks"] == 1
    # A step schedules two requests' prefills at once (the finding's first step did).
    assert any(len(step) >= 2 for step in engine[0]["steps"]), engine[0]["steps"]
    # kvspec's connector's cases did what each is there for: external tokens
    # offered; a load reported in finished_recving; a failing load's block
    # in invalid_block_ids and evicted under 'fail', none evicted under 'recompute'.
    sync, later, failing, recompute, hybrid = (e["connector"] for e in engine[len(SETUPS):])
    assert any(c[0] == "matched" and c[3][0] > 0 and c[3][1] is False for c in sync), sync
    assert any(c[0] == "matched" and c[3] == [100, True] for c in later), later
    assert any(c[0] == "output" and c[1] == ["a"] for c in later), later
    assert any(c[0] == "output" and c[2] for c in failing) and any(c[0] == "evict" and c[1] for c in failing)
    assert any(c[0] == "output" and c[2] for c in recompute) and not any(c[0] == "evict" for c in recompute)
    assert any(c[0] == "output" and c[1] == ["c"] for c in hybrid) and not any(c[0] == "evict" for c in hybrid)


@pytest.mark.parametrize("key, allowed", [("group1.spec.num_prefill_checkpoint_blocks", False),
                                          ("scheduler.mamba_prefill_checkpoint_alignment", False),
                                          ("group2.spec.head_size", True)])
def test_the_allowed_differences_leave_the_checkpoint_compared(key, allowed):
    assert _allowed(key) is allowed
