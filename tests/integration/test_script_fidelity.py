"""The upstream script (and the engine test, which shares its engine code)
builds the scheduler kvspec's engine worker built and schedules as it did:
for engine setups of each scriptable kind on 0.34.0, the worker's scheduler
(``EngineArgs`` over the toy model, the release's own layers and planning)
and the script's (vLLM's config classes, the KVCacheConfig from the settings
the worker recorded), each in a fresh process, hold the same values -- the
scheduler's, its configuration's, its manager's, coordinator's, each group
manager's and spec's -- but for the ones listed here, which no part of the
scheduler reads; and they schedule a program's steps alike.

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


def test_the_script_builds_and_schedules_as_the_engine_worker(tmp_path):
    python, tree = str(ensure_runtime()), str(ensure_release(VERSION))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "KVSPEC_", "PYTHON"))}
    env["PYTHONPATH"] = tree
    programs = [EngineProgram(setup, _PROGRAM) for setup in SETUPS]
    cases = tmp_path / "engine.json"
    cases.write_text(json.dumps([{"setup": p.setup.message(), "ops": list(p.ops)} for p in programs]))
    kvspec_dir = os.path.dirname(os.path.abspath(kvspec.__file__))
    engine = _run([python, "-B", str(HELPER), "engine", kvspec_dir, str(cases)], env)
    # Each script written from the settings its worker recorded, as a finding carries them.
    scripts = tmp_path / "script.json"
    scripts.write_text(json.dumps([{"code": repro_script(p, e["derived"], Category.SUBJECT_CRASH, VERSION).code}
                                   for p, e in zip(programs, engine)]))
    script = _run([python, "-B", str(HELPER), "script", str(scripts)], env)
    for setup, ours, theirs in zip(SETUPS, engine, script):
        a, b = ours["fingerprint"], theirs["fingerprint"]
        differing = {k: (a.get(k, "<none>"), b.get(k, "<none>")) for k in sorted(set(a) | set(b))
                     if a.get(k, "<none>") != b.get(k, "<none>") and not _allowed(k)}
        assert not differing, (setup.describe(), differing)
        assert sum(len(step) for step in ours["steps"]) >= 4, setup.describe()
        assert ours["steps"] == theirs["steps"], setup.describe()
    # Not vacuous: the values compared are the scheduler's own, the Mamba
    # groups' checkpoint among them, and the finding's first step is compared.
    nemotron = engine[0]["fingerprint"]
    assert len(nemotron) > 150 and nemotron["scheduler.mamba_has_prefill_checkpoint_blocks"] is True
    assert nemotron["group0.spec.num_prefill_checkpoint_blocks"] == 1
    # A step schedules two requests' prefills at once (the finding's first step did).
    assert any(len(step) >= 2 for step in engine[0]["steps"]), engine[0]["steps"]


@pytest.mark.parametrize("key, allowed", [("group1.spec.num_prefill_checkpoint_blocks", False),
                                          ("scheduler.mamba_prefill_checkpoint_alignment", False),
                                          ("group2.spec.head_size", True)])
def test_the_allowed_differences_leave_the_checkpoint_compared(key, allowed):
    assert _allowed(key) is allowed
