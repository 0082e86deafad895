"""Each known vLLM bug (model/known.py) still reproduces on the releases it
names -- so a fix shows -- through its own reproduction, and what the draw
uses instead of one kept out does not crash."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import attrs
import pytest

from kvspec.diff_tests.stateful import replay_program
from kvspec.findings.stateful import with_regression_test
from kvspec.model.finding import Category, Finding
from kvspec.model.case import Case, prefill
from kvspec.model.domain import CoordinatorConfig, GroupKind, HashScheme, KVCacheGroup
from kvspec.model.known import KNOWN_BUGS, known_bugs, recognise
from kvspec.model.program import Program
from kvspec.oracles.lookup import check_case
from kvspec.model.requests import MachineTrace, Run
from kvspec.subjects import worker
from kvspec.subjects.provision import ensure_release, ensure_runtime

CRASH = CoordinatorConfig(
    groups=(KVCacheGroup(GroupKind.SLIDING_WINDOW, 2, eagle=True, sliding_window=1),
            KVCacheGroup(GroupKind.MAMBA_ALIGN, 2)),
    scheduler_block_size=4, hash_block_size=1, num_prefill_lookahead=2, hash_scheme="lookahead")


(BUG,) = [b for b in KNOWN_BUGS if b.name == "sliding_window_eagle_multi_module_lookahead_crash"]


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_sliding_window_lookahead_crash_still_reproduces(kvspec_release, version):
    assert BUG.carried_by(version)
    proc = kvspec_release(version)
    case = Case(CRASH, 9, (prefill(9),))
    reply = proc.run(Run.of(case))
    assert not reply["ok"] and BUG.signature in reply["error"]
    assert "find_longest_cache_hit" in reply["traceback"]
    # The differential's own words for it are the known bug's mechanism.
    assert recognise(known_bugs(version), check_case(case, proc.capabilities, reply)) is BUG
    legacy = attrs.evolve(case, config=attrs.evolve(CRASH, hash_scheme=HashScheme.LEGACY))
    assert check_case(legacy, proc.capabilities, proc.run(Run.of(legacy))) == []


PROGRAM = Path(__file__).parent.parent / "fixtures" / "program_connector_mamba_lookahead_crash.json"
REPRO = Path(__file__).parent.parent / "fixtures" / "repro_mamba_estimate_after_connector_load.py"
(CONNECTOR_BUG,) = [b for b in KNOWN_BUGS if b.name == "mamba_estimate_below_allocation_after_connector_load"]


@pytest.mark.parametrize("version, crashes", [("0.28.0", False), ("0.33.0", True), ("0.34.0", True)])
def test_a_connector_crash_is_the_known_mechanism_where_it_shows(kvspec_release, version, crashes):
    """The program kvspec check once found on 0.33.0 (a stateful run): its
    crash, where this pool makes one, is recognised as the one known bug
    (the estimate below the allocation); on 0.28.0 the same program fits
    the pool, though the mechanism is there too (the reproduction below)."""
    program = Program.from_dict(json.loads(PROGRAM.read_text()))
    assert program.reserve_full_sequence and any(op.get("external") for op in program.ops)
    found, _ = replay_program(kvspec_release(version), program)
    assert CONNECTOR_BUG.carried_by(version)
    if crashes:
        assert [d.category for d in found] == [Category.SUBJECT_CRASH]
        assert recognise(known_bugs(version), found) is CONNECTOR_BUG
    else:
        assert found == []


@pytest.mark.parametrize("version", ["0.23.0", "0.34.0"])
def test_the_standalone_reproduction_shows_the_mechanism_on_every_release_it_names(version):
    """The standalone script (vLLM's public classes only, a fresh process, no
    kvspec) on the first and the newest release the known bug names: the
    Mamba group estimates one block and takes two; with a tight pool,
    schedule() raises."""
    python, tree = ensure_runtime(), ensure_release(version)
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_LOGGING_LEVEL": "ERROR"}
    env.pop("VLLM_TARGET_DEVICE", None)
    mechanism = subprocess.run([str(python), "-B", str(REPRO)], capture_output=True, text=True, env=env, timeout=600)
    assert mechanism.returncode != 0
    assert "the Mamba group took 2 blocks after estimating 1" in mechanism.stderr, mechanism.stderr[-2000:]
    crash = subprocess.run([str(python), "-B", str(REPRO), "4"], capture_output=True, text=True, env=env, timeout=600)
    assert "ValueError: Cannot get 1 free blocks from the pool" in crash.stderr, crash.stderr[-2000:]
    assert CONNECTOR_BUG.carried_by(version) and CONNECTOR_BUG.reproduction.endswith(REPRO.name)


ZEROING = Path(__file__).parent.parent / "fixtures" / "program_sliding_window_not_zeroed.json"


@pytest.mark.parametrize("version, carried", [("0.25.0", True), ("0.27.1", True), ("0.28.0", False)])
def test_sliding_window_blocks_are_zeroed_from_0_28(kvspec_release, version, carried, tmp_path):
    """vLLM #51749 (fixed in 0.28.0), found by the stateful differential: a
    full-attention + sliding-window + Mamba model's first prefill step hands
    out the full-attention block for zeroing but not the sliding-window one.
    Where it shows, the finding's regression test is vLLM's idiom, ruff-clean
    under the release's configuration, fails there on its own assertion and
    passes on 0.28.0 (run with 0.28.0's own test helpers)."""
    (bug,) = [b for b in KNOWN_BUGS if b.name == "sliding_window_blocks_not_zeroed"]
    program = Program.from_dict(json.loads(ZEROING.read_text()))
    proc = kvspec_release(version)
    found, _ = replay_program(proc, program)
    assert bug.carried_by(version) is carried
    if not carried:
        assert found == []
        return
    assert [d.category for d in found] == [Category.STATE_ZEROING_MISSED] and bug.matches(found[0].summary())
    assert "sliding_window" in found[0].summary()
    trace = proc.session(MachineTrace())
    finding = Finding(source="fuzz", verdict="DISCREPANCY", category=Category.STATE_ZEROING_MISSED,
                      compared={"differential": "stateful", "capabilities": proc.capabilities.as_dict()},
                      inputs={"program": program.as_dict()}, detail=found[0].summary())
    test = with_regression_test(finding, tmp_path / "finding.json", trace.get("trace"), proc.capabilities,
                                proc.subject).regression_test
    assert test["test_name"] == "test_new_attention_blocks_are_handed_out_for_zeroing" and test["proposed"]
    code = test["code"]
    assert "make_kv_cache_manager(" in code and "make_request(" in code and "kvspec" not in code.lower()
    assert test["module"] == "tests/v1/core/test_prefix_caching.py"
    assert test["lint"]["outcome"] == "passed", test["lint"]["output"]
    subject, fixed = test["verified"]
    assert (subject["against"], subject["outcome"], subject["failure"]) == \
        (f"vllm {version}", "failed", "the test's assertion"), subject["output"]
    assert fixed["against"].startswith("vllm 0.28.0, the first release without")
    assert fixed["outcome"] == "passed" and fixed["as_expected"], fixed["output"]


ALIASED = Path(__file__).parent.parent / "fixtures" / "program_external_blocks_evict_a_later_groups_hit.json"


@pytest.mark.parametrize("version, carried", [("0.23.0", True), ("0.28.0", False)])
def test_a_later_groups_hit_is_taken_before_external_blocks_from_0_24(kvspec_release, version, carried):
    """vLLM issue #33775's shape (two-phase allocation from 0.24.0), found by
    the stateful differential on 0.23.0: with connector tokens, the first
    full-attention group's new blocks evict the second group's hit block,
    which then sits in both groups' tables."""
    (bug,) = [b for b in KNOWN_BUGS if b.name == "external_blocks_evict_a_later_groups_hit"]
    program = Program.from_dict(json.loads(ALIASED.read_text()))
    assert any(op.get("external") for op in program.ops)
    found, _ = replay_program(kvspec_release(version), program)
    assert bug.carried_by(version) is carried
    if carried:
        assert [d.category for d in found] == [Category.STATE_ONE_GROUP] and bug.matches(found[0].summary())
    else:
        assert found == []


def _probe(script: Path, version: str, *args: str) -> dict:
    """A standalone probe run on ``version`` in a fresh isolated process (vLLM's platform-free target, the
    kvspec namespace on this checkout: the package's parent, links not followed): its one JSON line."""
    python, tree = ensure_runtime(), ensure_release(version)
    env = {**os.environ, "KVSPEC_SUBJECT_TREE": str(tree), "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(worker.__file__)))
    run = subprocess.run([str(python), "-I", "-B", str(script), root, *args], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


ALIGNED = Path(__file__).parent.parent / "fixtures" / "repro_mamba_align_block_aligned_prompt.py"
(ALIGNED_BUG,) = [b for b in KNOWN_BUGS if b.name == "mamba_align_block_aligned_prompt_replay_state_missing"]


# Before 0.28.0 the engine defaults build no align group for the toy: the flags that do.
ALIGN = {"mamba_cache_mode": "align", "enable_prefix_caching": True}


@pytest.mark.parametrize("version, flags, lost", [("0.23.0", ALIGN, [32, 48]), ("0.31.0", {}, [32, 48]),
                                                  ("0.32.0", {}, [])])
def test_a_block_aligned_mamba_prompt_loses_its_replay_hit_until_0_32(version, flags, lost):
    """The probe through vLLM's Scheduler built the engine's way (toy
    Nemotron-H, block 16, the finding's flags; 0.32.0 refuses a 22-block pool
    at that length, so each gets 64): resends and siblings of the 32- and
    48-token prompts hit 0 on the first and last releases carrying the bug,
    and what they are owed once 0.32.0 stops the chunk at the replay boundary."""
    out = _probe(ALIGNED, version, json.dumps({"num_gpu_blocks_override": 64, **flags}))
    assert out["vllm"] == version and out["engine"]["scheduler_block_size"] == 16
    assert out["lost_at_prompt_lengths"] == lost
    if lost:
        assert all(out["hits"][str(n)]["resend"] == 0 for n in lost)
    assert ALIGNED_BUG.carried_by(version) == bool(lost) and ALIGNED_BUG.reproduction.endswith(ALIGNED.name)


TRUNCATE = Path(__file__).parent.parent / "fixtures" / "repro_truncate_mamba_behind_connector_hit.py"
(TRUNCATE_BUG,) = [b for b in KNOWN_BUGS if b.name == "truncate_asserts_mamba_group_covers_connector_hit"]


@pytest.mark.parametrize("version", ["0.27.1", "0.28.0"])
def test_a_connector_hit_past_a_mamba_groups_states_crashes_schedule_until_0_28(version):
    """The probe through vLLM's Scheduler built the engine's way (toy
    Qwen3-Next with its MTP module, --prefix-match-unit 16, a connector
    written against KVConnectorBase_V1 offering 128 tokens): schedule()
    raises in truncate_computed_blocks on 0.27.1 and schedules both requests
    on 0.28.0, which lets a Mamba group end before the truncation point."""
    out = _probe(TRUNCATE, version)
    assert out["vllm"] == version and out["engine"]["groups"] == ["mamba_align", "mamba_align", "full_attention"]
    assert out["engine"]["hash_block_size"] < out["engine"]["scheduler_block_size"]
    raised = out["schedule_raised"]
    if TRUNCATE_BUG.carried_by(version):
        assert raised["exception"] == "AssertionError" and raised["where"].endswith("in truncate_computed_blocks")
    else:
        assert raised is None and set(out["scheduled"]) == {"r6", "r7"}
    assert TRUNCATE_BUG.reproduction.endswith(TRUNCATE.name)


SHORT = Path(__file__).parent.parent / "fixtures" / "repro_full_attention_short_of_mamba_hit.py"
(LOOKUP_BUG,) = [b for b in KNOWN_BUGS if b.name == "hybrid_lookup_full_attention_short_of_mamba_hit"]
(DEEPEST_HIT_BUG,) = [b for b in KNOWN_BUGS if b.name == "connector_lookup_takes_deepest_group_hit"]


# Releases the suite provisions anyway: 0.25.0 carries both, 0.27.1 neither (the
# range records under docs/results/known-ranges/ date each release by release).
@pytest.mark.parametrize("version", ["0.25.0", "0.27.1"])
def test_a_hybrid_hit_counts_tokens_whose_full_attention_kv_is_not_cached(version):
    """The probe through vLLM's Scheduler built the engine's way (toy
    Qwen3-Next with its MTP module, chunks ending on the block boundaries):
    a resent prompt is scheduled with 64 computed tokens while full
    attention holds cached KV for 32, without a connector until 0.26.0 (the
    hybrid lookup) and with one until 0.27.0 (the connector's per-group
    lookup takes the deepest group's hit); 32 on a release with neither."""
    out = _probe(SHORT, version)
    assert out["vllm"] == version
    for mode, bug in (("without_connector", LOOKUP_BUG), ("with_connector", DEEPEST_HIT_BUG)):
        seen = out[mode]
        assert seen["engine"]["groups"] == ["mamba_align", "mamba_align", "full_attention"], seen
        assert seen["engine"]["use_eagle_block_drop"] and seen["engine"]["scheduler_block_size"] == 32
        assert len(seen["first_full_attention_blocks"]) == 3  # the first request ran its 81 tokens to the end
        if bug.carried_by(version):
            assert seen["second"]["num_computed_tokens"] == 64 and seen["computed_slots_without_cached_kv"] == [1]
        else:
            assert seen["second"]["num_computed_tokens"] == 32 and seen["computed_slots_without_cached_kv"] == []
        assert bug.reproduction.endswith(SHORT.name)
    # The connector's lookup is the per-group one where the release has it (its mechanism, not the first's).
    assert out["with_connector"]["lookup"] == [{"find_longest_cache_hit_per_group": [64, 64, 32]}]


PER_GROUP = Path(__file__).parent.parent / "fixtures" / "repro_per_group_lookup_cow.py"


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1"])
def test_the_per_group_lookups_deepest_hit_crashes_the_copy_on_write_under_partial_hits(version):
    """The same bug's crash form (the probe through vLLM's Scheduler built the
    engine's way: the toy Qwen3-Next with its EAGLE3 drafter,
    --prefix-match-unit 16, a connector against KVConnectorBase_V1 that
    offers nothing): a request resending a computed 160-token chunk makes
    0.26.0's schedule() raise in _apply_cow (the one release with both partial
    hash hits and that lookup: the suite provisions it for this); 0.27.1
    schedules it."""
    out = _probe(PER_GROUP, version)
    assert out["vllm"] == version and out["first"] == {"a": 160}
    assert out["engine"]["groups"][-2:] == [["full_attention", 64], ["full_attention", 32]]
    if DEEPEST_HIT_BUG.carried_by(version):
        assert out["schedule_raised"].endswith("in _apply_cow: assert block_idx < len(req_blocks)")
        crash = "subject_crash: vLLM raised during engine step: AssertionError (raised in _apply_cow, block_pool.py)"
        assert [b.name for b in known_bugs(version, Category.SUBJECT_CRASH, crash)] == [DEEPEST_HIT_BUG.name]
    else:
        assert out["schedule_raised"] is None and out["second"]["b"] > 0


# A bug, its example engine program, and the group kinds a setup must build to express it (None: the bug's own).
_ALIGNED = ("mamba_align_block_aligned_prompt_replay_state_missing", "program_engine_block_aligned_prompt.json",
            frozenset({"mamba_align"}))
_SECOND = ("second_full_attention_group_untrimmed", "program_engine_second_full_attention_group.json", None)


@pytest.mark.parametrize("bug_and_example, version, status", [(_ALIGNED, "0.32.0", "not shown"),
                                                             (_SECOND, "0.28.0", "shown")])
def test_a_known_bugs_range_comes_from_a_targeted_search_per_release(kvspec_release, bug_and_example, version,
                                                                      status):
    """A known bug asked of a release through vLLM's Scheduler
    (``diff_tests/ranges.py``): on 0.32.0, the first release without the
    block-aligned prompt's lost replay state, its example, the programs
    around it and the targeted search show nothing (no false alarm either:
    nothing else broke); the second full-attention group left untrimmed
    shows in its example on 0.28.0, the last release carrying it, on the toy
    Qwen3-Next with its EAGLE3 drafter (the engine builds two full-attention
    groups of different blocks there).  Every release's answer is in the
    records under docs/results/known-ranges/ (tests/unit/test_ranges.py)."""
    from kvspec.diff_tests.ranges import search_release
    from kvspec.model.engine import EngineProgram

    name, fixture, needs = bug_and_example
    bug = next(b for b in KNOWN_BUGS if b.name == name)
    example = EngineProgram.from_dict(json.loads((Path(__file__).parent.parent / "fixtures" / fixture).read_text()))
    row = search_release(kvspec_release(version), bug, example, needs)
    assert row["status"] == status, row
    if status == "shown":
        assert row["how"] == "the example as it is"
    else:
        assert row["replays"] == {"held": 20} and row["search_others"] == {}


@pytest.mark.parametrize("name, fixture, version, status", [
    ("sliding_window_blocks_not_zeroed", "program_sliding_window_not_zeroed.json", "0.28.0", "not shown"),
    ("sliding_window_partial_hit_assertion", "case_sliding_window_partial_hit_assertion.json", "0.26.0", "shown"),
    ("sliding_window_partial_hit_assertion", "case_sliding_window_partial_hit_assertion.json", "0.28.0",
     "not shown")])
def test_a_hand_built_layouts_range_comes_from_a_targeted_search_at_the_manager_level(kvspec_release, name, fixture,
                                                                                       version, status):
    """A known bug no engine toy reaches, asked of a release at the manager
    level (``diff_tests/ranges_manager.py``: kvspec built the KVCacheConfig,
    and the row says so): on 0.28.0, the first release that zeroes new
    sliding-window blocks, the stateful example, the 20 programs around it
    and the machine's targeted search show nothing and nothing else breaks;
    the partial-hit assertion's case shows as it is on 0.26.0, and on 0.28.0
    neither its variants nor 400 requests on its layout show it."""
    from kvspec.diff_tests.ranges import LENGTH_DELTAS, POOL_DELTAS, read_example
    from kvspec.diff_tests.ranges_manager import MANAGER_LEVEL, search_release_case, search_release_program

    bug = next(b for b in KNOWN_BUGS if b.name == name)
    example = read_example(Path(__file__).parent.parent / "fixtures" / fixture)
    proc = kvspec_release(version)
    row = (search_release_program(proc, bug, example, POOL_DELTAS, LENGTH_DELTAS) if isinstance(example, Program)
           else search_release_case(proc, bug, example, LENGTH_DELTAS))
    assert row["status"] == status and row["level"] == MANAGER_LEVEL, row
    assert bug.carried_by(version) is (status == "shown")
    if status == "shown":
        assert row["how"] == "the example as it is"
    else:
        assert set(row["replays"]) == {"held"} and row["search_others"] == {}
