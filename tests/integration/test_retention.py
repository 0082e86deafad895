"""Retention as vLLM's engine runs it: the hits a resend and siblings get
through vLLM 0.34.0's real Scheduler (the release's defaults: sparse
retention 0), and model.retention's owed hits against them.

The expected hits are vLLM's behaviour, measured through the scheduler and
checked against a reading of its code (``replay_boundaries``, the sliding
window's and Mamba's ``reachable_block_mask``, the junction the lookup pins):
a resend hits the replay boundary; a sibling sharing less than it misses
under sparse retention, pins the junction, and the next sibling hits it; a
positive interval keeps its boundaries on a sliding window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.diff_tests.engine import replay_engine_program
from kvspec.model.domain import GroupKind, KVCacheGroup
from kvspec.model.engine import EngineProgram, EngineSetup
from kvspec.model.retention import RetentionLayout, owed_hit
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import release

BASE = list(range(1000, 1150))


def _other(k: int, n: int) -> list[int]:
    return [2000 + 7 * k + i for i in range(n)]


# r0 computed; r1 its resend; r2, r3 siblings sharing 70 (100) tokens; r4
# extends r0; on the window, r5 a block-aligned prompt of its own and r6 its resend.
CASES = {
    # toy-gpt-oss, block 16, window 32: the resend's 99 tokens floor to 96; r6
    # resends a 96-token prompt, looked up to 95 tokens: 80, not 96.
    ("toy-gpt-oss", 16, None): ([BASE[:100], BASE[:100], BASE[:70] + _other(1, 30), BASE[:70] + _other(2, 30),
                                 BASE[:100] + _other(3, 20), _other(4, 96), _other(4, 96)], [0, 96, 0, 64, 96, 0, 80]),
    # every 64 tokens kept: the first sibling and r5 already hit 64.
    ("toy-gpt-oss", 16, 64): (None, [0, 96, 64, 64, 96, 0, 80]),
    # toy-nemotron-h (Mamba2 hybrid, block 64 on 0.34.0): 149 tokens floor to 128.
    ("toy-nemotron-h", None, None): ([BASE[:150], BASE[:150], BASE[:100] + _other(1, 40),
                                      BASE[:100] + _other(2, 40), BASE[:150] + _other(3, 30)], [0, 128, 0, 64, 128]),
}


def _layout(model: str, interval: int | None) -> RetentionLayout:
    if model == "toy-gpt-oss":
        groups = (KVCacheGroup(GroupKind.SLIDING_WINDOW, 16, sliding_window=32), KVCacheGroup(GroupKind.FULL_ATTENTION, 16))
        return RetentionLayout(groups, (16, 16), 16, 0 if interval is None else interval)
    groups = (KVCacheGroup(GroupKind.MAMBA_ALIGN, 64), KVCacheGroup(GroupKind.MAMBA_ALIGN, 64),
              KVCacheGroup(GroupKind.FULL_ATTENTION, 64))
    return RetentionLayout(groups, (64, 64, 64), 64, 0 if interval is None else interval)


@pytest.fixture(scope="module")
def proc():
    with SubjectProcess(release("0.34.0")) as p:
        yield p


@pytest.mark.parametrize("model,block,interval", list(CASES))
def test_resend_and_sibling_hits_through_the_scheduler(proc, model, block, interval):
    prompts, expected = CASES[(model, block, interval)]
    prompts = prompts or CASES[(model, block, None)][0]
    ops = []
    for i, prompt in enumerate(prompts):  # each request runs to its end before the next arrives
        ops += [{"do": "arrive", "id": f"r{i}", "tokens": prompt, "max_tokens": 1}] + [{"do": "step"}] * 4
    setup = EngineSetup(model=model, num_gpu_blocks=200, block_size=block, retention_interval=interval)
    found, reply = replay_engine_program(proc, EngineProgram(setup, ops))
    assert not found, [f.detail for f in found]  # retention_hit among the invariants held
    lookups = [lk for a in reply["answers"] for part in (a.get("scheduled"), a)
               for lk in (part or {}).get("result", {}).get("lookups", ())]
    assert [lk["request"] for lk in lookups] == [f"r{i}" for i in range(len(prompts))]
    assert [lk["hit"] for lk in lookups] == expected  # vLLM's behaviour
    # The model owes exactly what vLLM gave here (a lower bound in general).
    layout = _layout(model, interval)
    junctions = [lk.get("junction", 0) for lk in lookups]
    assert junctions[2] == (0 if expected[2] else 64)  # the first sibling pins the junction where it missed
    owed = [owed_hit(layout, p, list(zip(prompts[:i], junctions[:i])))[0] for i, p in enumerate(prompts)]
    assert owed == expected


def test_blocks_of_several_earlier_requests_combine(proc):
    """vLLM keys a block by the tokens up to its end, so a lookup reads
    whichever request registered it: r0 (65 tokens) keeps the window's run
    ending at 64 (blocks 2-3), r1 (97 tokens, hitting 64) the run ending at 96
    (blocks 4-5); r2's 90 tokens share only block 4 of r1's run, and the
    window's run ending at 80 is r0's block 3 with r1's block 4.  Measured
    through 0.34.0's scheduler: 80 (one request alone owes 64)."""
    prompts = [BASE[:65], BASE[:97], BASE[:90]]
    ops = []
    for i, prompt in enumerate(prompts):
        ops += [{"do": "arrive", "id": f"r{i}", "tokens": prompt, "max_tokens": 1}] + [{"do": "step"}] * 4
    found, reply = replay_engine_program(proc, EngineProgram(EngineSetup(model="toy-gpt-oss", num_gpu_blocks=200,
                                                                         block_size=16), ops))
    assert not found, [f.detail for f in found]
    lookups = [lk for a in reply["answers"] for part in (a.get("scheduled"), a)
               for lk in (part or {}).get("result", {}).get("lookups", ())]
    assert [lk["hit"] for lk in lookups] == [0, 64, 80]  # vLLM's behaviour
    layout = _layout("toy-gpt-oss", None)
    owed = owed_hit(layout, prompts[2], [(p, lk.get("junction", 0)) for p, lk in zip(prompts[:2], lookups)])
    assert owed == (80, ((0, 1), (0, 1)))  # the run's blocks from both; full attention's too
    assert [owed_hit(layout, prompts[2], [(p, 0)])[0] for p in prompts[:2]] == [64, 0]


EVICTED = Path(__file__).parent.parent / "fixtures" / "program_window_block_evicted_before_prompt_completes.json"


def test_a_window_block_evicted_before_the_prompt_completes_is_not_owed(proc):
    """The control run's false alarm (``kvspec fuzz --vllm 0.34.0 --engine
    --seed 0``, unmutated): r10's 129-token prompt registers its first 128
    tokens in one step (the window's blocks 1 and 3: junction 64, replay
    boundary 128); the step computing its last token frees the window's
    blocks 0-2 (remove_skipped_blocks) and r14's allocation, the 19-block
    pool empty, evicts block 1's key, so r15 (sharing 66 tokens) hits 0.
    vLLM's LRU, not a bug: the key left the map after r10 first ran, so
    retention owes r15 nothing from r10."""
    program = EngineProgram.from_dict(json.loads(EVICTED.read_text()))
    found, reply = replay_engine_program(proc, program)
    assert not found, [f.detail for f in found]
    answers = reply["answers"]
    lookups = {lk["request"]: lk for a in answers for part in (a.get("scheduled"), a)
               for lk in (part or {}).get("result", {}).get("lookups", ())}
    assert lookups["r10"]["junction"] == 64 and lookups["r14"]["hit"] == 64 and lookups["r15"]["hit"] == 0
    # The map after r10's first 128 tokens (op 27) and after the schedule() taking its last (op 28).
    registered = {tuple(e) for e in answers[26]["state"]["hash_map"]}
    last_token = {tuple(e) for e in answers[27]["scheduled"]["state"]["hash_map"]}
    assert registered - last_token  # keys left the map while r10's prompt was still being computed
    layout = RetentionLayout((KVCacheGroup(GroupKind.SLIDING_WINDOW, 32, sliding_window=32),
                              KVCacheGroup(GroupKind.FULL_ATTENTION, 32)), (32, 32), 32, 0)
    prompts = {op["id"]: op["tokens"] for op in program.as_dict()["ops"] if op["do"] == "arrive"}
    assert owed_hit(layout, prompts["r15"], [(prompts["r10"], 64)])[0] == 64  # had the block stayed
