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
connectors answering the scheduler and reporting loads alike.  Under
speculative decoding (EAGLE3 with and without the block drop, EAGLE3's own
group, one MTP module, multi-module MTP with and without kvspec's connector)
they also schedule the same drafts for verification, sample the same tokens
per output and propose the same drafts; a script with its draft handling
dropped schedules otherwise, which this test sees.

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
    # The drafter's config.json directory (MTP: the target's), a temporary one on each side.
    r"speculative_config\.model": "the drafter's weights' path (the scheduler reads the configuration built from it)",
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


def _drafting(*steps: tuple[int, int]) -> tuple[dict, ...]:
    """Engine steps under speculative decoding, each (the drafts proposed after
    it, the drafts its output accepts)."""
    return tuple({"do": "step", "drafts": drafts, "accepted": accepted} for drafts, accepted in steps)


# Two requests sharing a prefix decode with drafts; a third arrives and one is
# aborted while drafts are in flight; a resend of the first prompt then hits.
_SPEC_PROGRAM = (
    {"do": "arrive", "id": "r0", "tokens": list(range(128)), "max_tokens": 7},
    {"do": "arrive", "id": "r1", "tokens": [*range(128), 697], "max_tokens": 6},
    *_drafting((2, 0), (3, 1), (3, 3), (1, 0), (2, 2)),
    {"do": "arrive", "id": "r2", "tokens": [*range(64), *range(500, 540)], "max_tokens": 5},
    {"do": "abort", "id": "r1"},
    *_drafting((3, 2), (2, 1), (0, 0), (3, 3), (2, 0), (1, 1)),
    {"do": "arrive", "id": "r3", "tokens": list(range(128)), "max_tokens": 3},
    *_drafting((2, 1), (2, 2), (1, 0), (2, 1), (2, 0)),
)
# kvspec's connector's loads under drafts: a synchronous load, an asynchronous
# one finishing a step later, a resend.
_SPEC_LOADING = (
    {"do": "arrive", "id": "a", "tokens": PROMPT, "max_tokens": 5,
     "load": {"offer": 128, "async": False, "delay": 0, "fail": None}},
    *_drafting((2, 0)),
    {"do": "arrive", "id": "c", "tokens": list(range(300, 390)), "max_tokens": 4,
     "load": {"offer": 64, "async": True, "delay": 1, "fail": None}},
    *_drafting((2, 1), (2, 2), (1, 1), (2, 0), (2, 2)),
    {"do": "arrive", "id": "b", "tokens": PROMPT, "max_tokens": 3},
    *_drafting((2, 1), (2, 2), (1, 0), (2, 1), (2, 0)),
)
# Speculative decoding as the engine draws it on 0.34.0: the script builds
# vLLM's SpeculativeConfig from the flags, flags the groups vLLM's planning
# flagged as the drafter's, reads the lookahead from the VllmConfig vLLM built,
# and proposes and accepts each step's drafts as the worker plays them.
SPECULATIVE_CASES = (
    # EAGLE3 on the toy Llama, legacy hashes: the EAGLE block drop is live (one group, the drafter's layer in it)
    (EngineSetup(model="toy-llama", num_gpu_blocks=40, block_size=16, async_scheduling=False,
                 num_speculative_tokens=3, legacy_hashes=True), _SPEC_PROGRAM),
    # ... under the release's lookahead block hashes and async scheduling (its drafts stay in the worker)
    (EngineSetup(model="toy-llama", num_gpu_blocks=40, block_size=16, num_speculative_tokens=2), _SPEC_PROGRAM),
    # the EAGLE3 drafter of twice the target's KV page: a group of its own, half the scheduler block
    (EngineSetup(model="toy-qwen3-next-eagle3", num_gpu_blocks=40, async_scheduling=False,
                 num_speculative_tokens=2, prefix_match_unit=16), _SPEC_PROGRAM),
    # the toy's one MTP module, partial hash hits, chunked prefills
    (EngineSetup(model="toy-qwen3-next", num_gpu_blocks=40, async_scheduling=False, num_speculative_tokens=1,
                 prefix_match_unit=16, max_num_batched_tokens=64), _SPEC_PROGRAM),
    # multi-module MTP: three modules, three drafts, lookahead block hashes of three tokens
    (EngineSetup(model="toy-qwen3-next", num_gpu_blocks=40, async_scheduling=False, num_speculative_tokens=3,
                 num_nextn_predict_layers=3), _SPEC_PROGRAM),
    # multi-module MTP, two modules, with kvspec's connector loading (it takes no lookahead hashes: the drop runs)
    (EngineSetup(model="toy-qwen3-next", num_gpu_blocks=40, async_scheduling=False, num_speculative_tokens=2,
                 num_nextn_predict_layers=2, kv_connector="KvspecConnector"), _SPEC_LOADING),
)
# What a script that ignored the drafts would do: propose none after a step,
# accept none in its output.
DROPPED_DRAFTS = (("propose_drafts(scheduler, output, op[1])", "pass"),
                  ("min(num_accepted + 1, allotted[rid])", "min(1, allotted[rid])"))
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
    programs += [EngineProgram(setup, ops) for setup, ops in CONNECTOR_CASES + SPECULATIVE_CASES]
    cases = tmp_path / "engine.json"
    cases.write_text(json.dumps([{"setup": p.setup.message(), "ops": list(p.ops)} for p in programs]))
    kvspec_dir = os.path.dirname(os.path.abspath(kvspec.__file__))
    engine = _run([python, "-B", str(HELPER), "engine", kvspec_dir, str(cases)], env)
    # Each script written from the settings its worker recorded, as a finding carries them.
    scripts = tmp_path / "script.json"
    codes = [repro_script(p, e["derived"], Category.SUBJECT_CRASH, VERSION).code for p, e in zip(programs, engine)]
    # ... and, for two speculative setups (EAGLE3 with the block drop live,
    # multi-module MTP), the script with its draft handling dropped.
    first = len(SETUPS) + len(CONNECTOR_CASES)
    dropped = [first, first + 4]
    for index in dropped:
        code = codes[index]
        for old, new in DROPPED_DRAFTS:
            assert code.count(old) == 1, old
            code = code.replace(old, new)
        codes.append(code)
    scripts.write_text(json.dumps([{"code": code} for code in codes]))
    script = _run([python, "-B", str(HELPER), "script", str(scripts)], env)
    script, without_drafts = script[:len(programs)], script[len(programs):]
    for program, ours, theirs in zip(programs, engine, script):
        setup = program.setup
        differing = _differing(ours["fingerprint"], theirs["fingerprint"])
        assert not differing, (setup.describe(), differing)
        # (a failed load ends its request: that program schedules less)
        assert sum(len(step) for step in ours["steps"]) >= (4 if program.ops == _PROGRAM else 3), setup.describe()
        assert ours["steps"] == theirs["steps"], setup.describe()
        # The connector's answers and the worker's reports, call by call.
        assert ours["connector"] == theirs["connector"], setup.describe()
        # The drafts each step scheduled, the tokens each output sampled, the drafts proposed.
        assert ours["speculation"] == theirs["speculation"], setup.describe()
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
    sync, later, failing, recompute, hybrid = (e["connector"] for e in engine[len(SETUPS):first])
    assert any(c[0] == "matched" and c[3][0] > 0 and c[3][1] is False for c in sync), sync
    assert any(c[0] == "matched" and c[3] == [100, True] for c in later), later
    assert any(c[0] == "output" and c[1] == ["a"] for c in later), later
    assert any(c[0] == "output" and c[2] for c in failing) and any(c[0] == "evict" and c[1] for c in failing)
    assert any(c[0] == "output" and c[2] for c in recompute) and not any(c[0] == "evict" for c in recompute)
    assert any(c[0] == "output" and c[1] == ["c"] for c in hybrid) and not any(c[0] == "evict" for c in hybrid)
    # The speculative cases ran what each is there for, as vLLM derived it:
    # drafts scheduled for verification and accepted; the EAGLE block drop
    # live under legacy hashes and off under lookahead hashes; the drafter's
    # own group at half the scheduler block; multi-module MTP's lookahead of
    # three tokens; kvspec's connector loading under drafts.
    eagle, eagle_async, eagle_group, mtp, mtp3, mtp_loading = engine[first:]
    for case in (eagle, eagle_group, mtp, mtp3, mtp_loading):
        assert any(c[0] == "schedule" and c[1] for c in case["speculation"]), case["speculation"]
        assert any(c[0] == "sampled" and max(c[1].values(), default=0) > 1 for c in case["speculation"])
        assert any(c[0] == "drafts" for c in case["speculation"])
    assert not any(c[0] == "drafts" for c in eagle_async["speculation"])  # async scheduling: none proposed
    assert eagle["derived"]["groups"][0]["eagle"] and eagle["fingerprint"]["manager.use_eagle"] is True
    assert eagle_async["derived"]["num_hash_lookahead_tokens"] == 1 and not eagle_async["derived"]["groups"][0]["eagle"]
    (drafter,) = [g for g in eagle_group["derived"]["groups"] if g["eagle_group"]]
    assert 2 * drafter["block_size"] == eagle_group["derived"]["scheduler_block_size"], eagle_group["derived"]
    assert mtp3["derived"]["multi_module_mtp"] is True
    assert mtp3["fingerprint"]["vllm_config.num_hash_lookahead_tokens"] == 3
    assert mtp3["fingerprint"]["scheduler.num_prefill_lookahead"] == 3
    assert any(c[0] == "matched" and c[3][0] > 0 for c in mtp_loading["connector"]), mtp_loading["connector"]
    assert any(c[0] == "output" and c[1] == ["c"] for c in mtp_loading["connector"]), mtp_loading["connector"]
    # The comparison sees the drafts: with them dropped, the script schedules otherwise.
    for index, dropped_run in zip(dropped, without_drafts):
        assert dropped_run["steps"] != engine[index]["steps"], programs[index].setup.describe()


@pytest.mark.parametrize("key, allowed", [("group1.spec.num_prefill_checkpoint_blocks", False),
                                          ("scheduler.mamba_prefill_checkpoint_alignment", False),
                                          ("group2.spec.head_size", True)])
def test_the_allowed_differences_leave_the_checkpoint_compared(key, allowed):
    assert _allowed(key) is allowed
