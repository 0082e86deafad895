"""The engine differential on real releases: vLLM's own Scheduler, built by
the release's configuration code, drives the manager; no false alarm on a
correct release, and a state mutant is caught through the engine."""

from __future__ import annotations

import pytest

from kvspec.diff_tests.engine import fuzz_engine, replay_engine_program
from kvspec.model.engine import EngineProgram, EngineSetup
from kvspec.model.finding import Category
from kvspec.model.requests import OpenEngine
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import mutant_subject, release


@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_no_invariant_broken_through_the_scheduler(version):
    with SubjectProcess(release(version)) as proc:
        result = fuzz_engine(proc, max_examples=60, seed=3)
    assert result.failure is None and result.stopped is None, result.verdict
    assert result.verdict.startswith("no invariant broken through vLLM's scheduler")
    # The one known vLLM bug of these releases may be met: recognised by its mechanism, never a finding.
    assert set(result.known_met) <= {"mamba_estimate_below_allocation_after_connector_load"}
    assert result.tally.programs >= 40 and result.tally.lookups > 0 and result.tally.nonzero_hits > 0
    # What the engine built and ran is read back from vLLM, not assumed: the
    # release's defaults (async scheduling, sparse retention 0) are among the draws.
    assert "AsyncScheduler" in result.settings["scheduler_class"]
    assert "0" in result.settings["retention_interval"]
    assert any(layout.startswith("mamba_align") for layout in result.settings["groups"])
    assert "AsyncScheduler" in result.scope() and "Modelled" in result.scope()
    # Every cache_blocks call on a hybrid layout was held to the registration bound, and the scope says how many.
    assert result.bound_programs > 0 and result.bound_calls > result.bound_programs
    assert f"held to it, {result.bound_calls} calls" in result.scope()
    assert result.as_dict()["registration_bound"]["calls"] == result.bound_calls


def test_a_state_mutant_is_caught_through_the_scheduler():
    """``new_block_double_ref`` (the pool's new blocks get two references) is
    invisible per request; through the engine the reference counts break."""
    with SubjectProcess(mutant_subject("0.34.0", "new_block_double_ref")) as proc:
        result = fuzz_engine(proc, max_examples=60, seed=0)
        assert result.failure is not None, result.verdict
        program = result.failure.case
        assert isinstance(program, EngineProgram)
        # The shrunk program replays: the finding is the engine's, reproducibly.
        found, _ = replay_engine_program(proc, program)
    assert found and found[0].category is result.failure.category
    assert result.failure.category in (Category.STATE_REF_COUNT, Category.STATE_FREE_BLOCKS, Category.STATE_LEAK)


def test_the_known_connector_bug_is_met_through_the_scheduler_and_recognised():
    """vLLM's own DecodeBenchConnector on the Mamba hybrid: the engine meets
    the estimate below the allocation (the known bug) and goes on searching;
    with the bug not recognised (kvspec history's way) it is the finding."""
    with SubjectProcess(release("0.34.0")) as proc:
        met = fuzz_engine(proc, max_examples=150, seed=3)
        found = fuzz_engine(proc, max_examples=150, seed=3, include_known=True)
    assert met.failure is None and met.known_met.get("mamba_estimate_below_allocation_after_connector_load", 0) > 0
    assert "met and recognised" in met.verdict and "mamba_estimate_below_allocation" in met.scope()
    assert found.failure is not None and found.failure.category is Category.STATE_BLOCK_ESTIMATE
    assert found.failure.case.setup.kv_connector == "DecodeBenchConnector"


def test_the_engine_default_is_read_back_not_assumed():
    """A setup that leaves every flag to the release runs 0.34.0's defaults:
    async scheduling and sparse retention (interval 0)."""
    program = EngineProgram(EngineSetup(model="toy-llama", num_gpu_blocks=20),
                            ({"do": "arrive", "id": "a", "tokens": list(range(40)), "max_tokens": 2},
                             {"do": "step"}, {"do": "step"}, {"do": "step"}, {"do": "step"}))
    with SubjectProcess(release("0.34.0")) as proc:
        opened = proc.session(OpenEngine(program.setup.message()))
        found, _ = replay_engine_program(proc, program)
    assert opened["ok"] and not found
    derived = opened.payload.derived
    assert derived["scheduler_class"] == "AsyncScheduler" and derived["async_scheduling"]
    assert derived["retention_interval"] == 0 and derived["scheduler_block_size"] == 64


def test_a_state_mutants_finding_says_the_blocks_a_user_loses():
    """The impact of an engine finding is measured at its engine
    configuration: ``new_block_double_ref``'s program driven on until every
    request finished leaves blocks out of the free pool, which the unmutated
    release, on the same program, does not."""
    from kvspec.findings.impact import attach_engine_impact
    from kvspec.findings.engine import engine_finding
    from kvspec.report.finding import render_text

    with SubjectProcess(mutant_subject("0.34.0", "new_block_double_ref")) as proc:
        result = fuzz_engine(proc, max_examples=60, seed=0)
        assert result.failure is not None, result.verdict
        finding = attach_engine_impact(proc, engine_finding(result, {"kvspec": "0"}))
    impact = finding.impact
    assert impact.kind == "blocks_leaked" and impact.unit == "blocks", impact.summary
    assert impact.measured > 0 and impact.expected == 0 and impact.reference == "vllm 0.34.0"
    assert "stay out of the free pool once every request finished, the unmutated vllm 0.34.0 0" in impact.summary
    text = render_text(finding)
    assert text.startswith("IMPACT: Measured at the finding's engine configuration")
    assert "impact (blocks leaked): measured on vllm 0.34.0 + new_block_double_ref" in text


def test_replaying_the_open_mamba_estimate_bug_measures_the_crash_a_user_meets(capsys):
    """0.34.0's open Mamba estimate bug, replayed: at the finding's own pool
    nothing a user sees is lost, and with the pool tight (a request beside
    it, the pool one block short of what the allocation takes) schedule()
    raises: the impact line says both, as measured."""
    from pathlib import Path

    from kvspec.cli import main

    fixture = Path(__file__).parent.parent / "fixtures" / "finding_engine_mamba_estimate_0.34.0.json"
    assert main(["replay", str(fixture)]) == 1  # still failing
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  impact: ")]
    assert "with --num-gpu-blocks-override 12 instead and a 64-token request of its own running beside" in line
    assert ("schedule() raises ValueError: Cannot get 1 free blocks from the pool after 2 engine steps: the engine "
            "process dies (every request in flight fails)") in line
    assert "At the finding's own pool: a resend of r0's 65-token prompt still hits 64 of 65 tokens" in line


def test_the_50062_mutant_costs_a_resend_hit_through_the_scheduler_only_where_an_eagle_block_is_below_s():
    """#50062 (``refloor_50062``) on 0.33.0 through vLLM's real Scheduler on
    the toy Qwen3-Next with legacy hashes and --prefix-match-unit 16: with its
    own MTP module every group's block is the scheduler block, so the re-floor
    changes nothing (the resend hits the same); with an EAGLE3 drafter of
    twice its KV page (its group's block half of S) a resend of a 50-token
    prompt loses the hit the release gives."""
    from kvspec.diff_tests.engine import drive_engine_program

    def resend_hit(proc, model):
        setup = EngineSetup(model=model, num_gpu_blocks=80, num_speculative_tokens=1, legacy_hashes=True,
                            prefix_match_unit=16, async_scheduling=False)
        prompt = list(range(1000, 1050))
        ops = ([{"do": "arrive", "id": "a", "tokens": prompt, "max_tokens": 2}] + [{"do": "step"}] * 6
               + [{"do": "arrive", "id": "b", "tokens": prompt, "max_tokens": 2}, {"do": "step"}])
        records = list(drive_engine_program(proc, EngineProgram(setup, ops), through=True))
        return [lk.hit for r in records if r.answer is not None for part in r.answer.parts()
                for lk in part.result.lookups if lk.request == "b"]

    hits = {}
    for label, subject in (("release", release("0.33.0")), ("mutant", mutant_subject("0.33.0", "refloor_50062"))):
        with SubjectProcess(subject) as proc:
            hits[label] = {model: resend_hit(proc, model) for model in ("toy-qwen3-next", "toy-qwen3-next-eagle3")}
    assert hits["release"]["toy-qwen3-next"] == hits["mutant"]["toy-qwen3-next"] == [32]
    assert hits["release"]["toy-qwen3-next-eagle3"] == [32] and hits["mutant"]["toy-qwen3-next-eagle3"] == [0]


def test_the_plugins_engine_class_draws_only_what_the_release_takes():
    """The shipped pytest test's engine class (``engine_machine`` with no
    setups given) asks the release what its engine takes, as ``kvspec fuzz
    --engine`` does (``release_setups``, one source): 0.25.0's EngineArgs
    takes no retention interval, no --prefix-match-unit and no legacy-hash
    switch, and has no multi-module MTP, so none is drawn and no drawn setup
    is refused for one."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvspec.diff_tests.engine import engine_machine, release_setups
    from kvspec.model.known import known_bugs

    refusals, drawn = [], []

    def on_program(machine, refused=None) -> None:
        refusals.append(refused) if refused is not None else drawn.append(machine.program.setup)

    with SubjectProcess(release("0.25.0")) as proc:
        _, left_out = release_setups(proc)
        assert "prefix_cache_retention_interval" in left_out["retention"]
        # --prefix-match-unit is drawn on the Qwen3-Next toys only, which 0.25.0 does not build.
        assert "legacy_hashes" in left_out and ("match_unit" in left_out or "toy-qwen3-next" in left_out), left_out
        # No use_multi_module_mtp before 0.27: the toy's one MTP module only.
        assert "multi_module_mtp" in left_out or "toy-qwen3-next" in left_out, left_out
        machine = engine_machine(proc, on_program, lambda failure: None, tuple(known_bugs("0.25.0")))
        run_state_machine_as_test(machine, settings=settings(
            max_examples=12, stateful_step_count=2, database=None, deadline=None, derandomize=True,
            phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    assert len(drawn) >= 12 and not [r for r in refusals if "not expressible" in r], refusals
    assert not any(s.retention_interval is not None or s.prefix_match_unit or s.legacy_hashes
                   or s.num_nextn_predict_layers for s in drawn)
    assert not any(s.model in left_out for s in drawn)


def test_multi_module_mtp_runs_through_the_scheduler_with_the_lookahead_vllm_derives():
    """The toy Qwen3-Next with two MTP modules (num_nextn_predict_layers 2 in
    its config.json) and two speculative tokens: 0.34.0 builds multi-module
    MTP (use_multi_module_mtp, a prefill lookahead of 2, lookahead hashes over
    2 tokens, the draft layers grouped with the target's attention), a program
    with drafts runs through its Scheduler with every rule held, and a resend
    of a 129-token prompt hits one block where the toy's one module hits two:
    the second block's hash needs two tokens past it."""
    from kvspec.diff_tests.engine import drive_engine_program

    prompt = list(range(1000, 1129))
    ops = ([{"do": "arrive", "id": "a", "tokens": prompt, "max_tokens": 6}] + [{"do": "step"}] * 3
           + [{"do": "step", "drafts": 2, "accepted": 1}] * 3
           + [{"do": "arrive", "id": "b", "tokens": prompt, "max_tokens": 2}, {"do": "step"}])
    derived, resend = {}, {}
    with SubjectProcess(release("0.34.0")) as proc:
        for modules in (2, None):
            setup = EngineSetup(model="toy-qwen3-next", num_gpu_blocks=40, num_speculative_tokens=2,
                                num_nextn_predict_layers=modules, async_scheduling=False, max_num_batched_tokens=64)
            records = list(drive_engine_program(proc, EngineProgram(setup, ops)))
            assert len(records) == len(ops) + 1 and not any(r.found for r in records), records[-1].found
            derived[modules] = records[0].reply.payload.derived
            resend[modules] = [lk.hit for r in records[1:] for part in r.answer.parts()
                               for lk in part.result.lookups if lk.request == "b"]
    multi = derived[2]
    assert multi["multi_module_mtp"] is True and multi["num_prefill_lookahead"] == 2
    assert multi["num_hash_lookahead_tokens"] == 2
    assert [(g["kind"], g["layers"]) for g in multi["groups"]] == [("mamba_align", 3), ("full_attention", 3)]
    assert derived[None]["multi_module_mtp"] is False and derived[None]["num_prefill_lookahead"] == 1
    assert resend == {2: [64], None: [128]}


def test_a_cow_block_pinned_for_a_connectors_partial_tail_offload_is_a_held_block():
    """0.27.1-0.28 pin the copy-on-write block of a producer's partial prompt
    tail (a Mamba align group, a hash block finer than its block, a KV
    connector) off every block table until the request is freed
    (``KVCacheManager._partial_tail_pins``): a reference the state model
    counts as held, as the scheduler's deferred frees.  Unobserved, two MTP
    modules (the tail reached at prompt - 1) broke ref_counts on a 9-token
    prompt: a false alarm."""
    from kvspec.diff_tests.engine import drive_engine_program

    setup = EngineSetup(model="toy-qwen3-next", num_gpu_blocks=26, kv_connector="DecodeBenchConnector",
                        num_speculative_tokens=2, num_nextn_predict_layers=2, prefix_match_unit=8,
                        async_scheduling=False)
    ops = ({"do": "arrive", "id": "r0", "tokens": list(range(600, 609)), "max_tokens": 2}, {"do": "step"},
           {"do": "step"})
    with SubjectProcess(release("0.28.0")) as proc:
        records = list(drive_engine_program(proc, EngineProgram(setup, ops)))
    assert len(records) == len(ops) + 1 and not any(r.found for r in records), records[-1].found
    scheduled = records[-1].answer.parts()[0].state  # the last step's schedule(), before its output
    (pinned,) = scheduled["held_elsewhere"]
    assert pinned not in {b for _, _, blocks, _ in scheduled["tables"] for b in blocks}
    assert [ref for block, ref, _ in scheduled["blocks"] if block == pinned] == [1]


def test_the_per_group_lookup_of_a_connector_on_a_hybrid_is_observed():
    """0.24.0-0.26.0 with a KV connector on a Mamba hybrid look up each group
    apart (``coordinator.find_longest_cache_hit_per_group``), not through
    get_computed_blocks: the worker observes that lookup too.  Unobserved, r2's
    hit on r0's blocks went unchecked and its hit block looked freshly
    allocated: the zeroing_missed on a full-attention group of 0.24.0-0.25.1's
    engine column that the release history left unexplained (this program,
    recorded on 0.24.0, run on 0.25.0: a release the suite provisions anyway)."""
    import json
    from pathlib import Path

    from kvspec.diff_tests.engine import drive_engine_program

    fixture = Path(__file__).parent.parent / "fixtures" / "program_engine_connector_per_group_lookup_0.24.0.json"
    program = EngineProgram.from_dict(json.loads(fixture.read_text()))
    with SubjectProcess(release("0.25.0")) as proc:
        records = list(drive_engine_program(proc, program))
    assert len(records) == len(program.ops) + 1 and not any(r.found for r in records), records[-1].found
    lookups = [lk for r in records[1:] if r.answer is not None for part in r.answer.parts()
               for lk in part.result.lookups if lk.request == "r2"]
    assert lookups and lookups[0].hit > 0


def test_the_engine_holds_every_cache_blocks_call_to_the_registration_bound():
    """#50062 (``refloor_50062``) through the engine differential itself: the
    program ``kvspec fuzz --engine --vllm 0.33.0 --mutant refloor_50062 --seed
    1`` found and shrank (toy-qwen3-next-eagle3, legacy hashes,
    --prefix-match-unit 8: a 64-token prompt) is an under-registration of the
    drafter's group (block 32, half of S = 64) at its second cache_blocks call
    on the mutant, and holds every call to the bound on 0.33.0. The two
    workers start at once (10 s in all at a load of 1 on 2 cores, 15-43 s at
    loads of 4-6)."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from kvspec.diff_tests.engine import drive_engine_program

    fixture = Path(__file__).parent.parent / "fixtures" / "program_engine_refloor_50062_0.33.0.json"
    program = EngineProgram.from_dict(json.loads(fixture.read_text()))

    def run(subject):
        bounds = []
        with SubjectProcess(subject) as proc:
            records = list(drive_engine_program(proc, program, bound_out=bounds))
        return records, bounds[0]

    with ThreadPoolExecutor(max_workers=2) as pool:
        mutant, clean = pool.map(run, (mutant_subject("0.33.0", "refloor_50062"), release("0.33.0")))
    records, bound = mutant
    (found,) = records[-1].found
    assert found.category is Category.UNDER_REGISTRATION and found.call == 1 and found.n == 56
    assert found.expected_tokens == (56,) * 5 and found.observed_tokens == (56, 56, 56, 56, 32)
    assert "request r1's cache_blocks call 1 through the real Scheduler" in found.detail
    records, bound = clean
    assert len(records) == len(program.ops) + 1 and not any(r.found for r in records), records[-1].found
    assert bound.live and bound.checked >= 2  # held on real calls, not vacuously
