"""Each stateful finding is looked for through vLLM's engine
(``diff_tests/reproduce.py``): a mutant's finding the real Scheduler reaches
says so with its settings and carries an engine program that replays on the
mutant (and passes on the release); one on a geometry no engine builds is
hand-built only, says the budget and what was searched, and exits HARDENING."""

from __future__ import annotations

import json

import pytest

from kvspec.cli import main
from kvspec.diff_tests.engine import replay_engine_program
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category
from kvspec.model.outcome import Outcome
from kvspec.model.program import Program
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import mutant_subject, release

pytestmark = pytest.mark.vllm

NEWEST = "0.34.0"


def _fuzz(tmp_path, mutant: str, examples: int, seed: int, differential: str = "--stateful") -> tuple[int, dict, str]:
    findings = tmp_path / "findings"
    code = main(["fuzz", "--vllm", NEWEST, "--mutant", mutant, differential, "--max-examples", str(examples),
                 "--seed", str(seed), "--database", str(tmp_path / "db"), "--json", str(tmp_path / "fuzz.json"),
                 "--markdown", str(tmp_path / "fuzz.md"), "--findings-dir", str(findings)])
    (stored,) = findings.glob("*.json")
    return code, json.loads(stored.read_text()), (tmp_path / "fuzz.md").read_text()


def test_a_mutants_stateful_finding_is_reachable_through_the_scheduler_with_its_settings(tmp_path):
    code, finding, markdown = _fuzz(tmp_path, "window_frees_early", 200, 0)
    assert code == Outcome.FINDING.exit_code
    reproduction = finding["inputs"]["engine_reproduction"]
    assert reproduction["status"] == "reproduced", reproduction["summary"]
    assert reproduction["target"] == {"category": "state_window", "kind": "sliding_window", "exception": None}
    flags = reproduction["cli_flags"]
    assert reproduction["summary"].startswith(f"reachable through vLLM's scheduler with settings `{flags}` on "
                                              "toy-gpt-oss")
    assert finding["reach"]["hardening"] is False and finding["reach"]["summary"] == reproduction["summary"]
    assert "reproduced through vLLM's engine" in finding["compared"]["configuration"]
    assert "reachable through vLLM's scheduler with settings" in markdown
    # The engine program breaks the same rule through the real Scheduler on
    # the mutant, and holds on the release it was made from: no false alarm.
    program = EngineProgram.from_dict(reproduction["engine_program"])
    with SubjectProcess(mutant_subject(NEWEST, "window_frees_early")) as proc:
        found, _ = replay_engine_program(proc, program)
    assert found and found[0].category is Category.STATE_WINDOW
    with SubjectProcess(release(NEWEST)) as proc:
        assert replay_engine_program(proc, program)[0] == []
    # vLLM's own tests were asked first, as for a registration finding: one
    # fails on the mutant and passes on 0.34.0, so kvspec proposes no test of its own.
    catcher = "tests/v1/core/test_single_type_kv_cache_manager.py::test_sliding_window_remove_skipped_blocks"
    assert finding["vllm_tests"]["caught_by"] == [catcher], finding["vllm_tests"]["caught_by"]
    assert not (finding["regression_test"] or {}).get("proposed") and "```python" not in markdown
    assert f"Already caught by {catcher}: it fails on the subject and passes on the release" in markdown


def test_a_finding_no_engine_configuration_reproduces_is_hand_built_only_and_exits_hardening(tmp_path):
    # hit_alignment_removed no longer rounds a full-attention hit down to the
    # alignment: its lookup finding (0.34.0, seed 0) is on two full-attention
    # groups of blocks 1 and 2 under S=4.  The nearest engines (toy-llama; the
    # toy Qwen3-Next with its EAGLE3 drafter, whose group is half the target's
    # block) never show a hit off the scheduler block within the budget.
    # (trim_first_group_only, once this test's stateful example, is reachable
    # on that toy: a second full-attention group of another block is built.)
    code, finding, markdown = _fuzz(tmp_path, "hit_alignment_removed", 200, 0, "--lookup")
    assert code == Outcome.HARDENING.exit_code == 6
    assert finding["category"] == Category.LOOKUP_CONTRACT.value
    reproduction = finding["inputs"]["engine_reproduction"]
    assert reproduction["status"] == "not reproduced" and reproduction["engine_program"] is None
    assert reproduction["target"]["category"] == Category.LOOKUP_CONTRACT.value
    # Scoped and honest: the budget and every configuration searched are said.
    assert reproduction["search"] == {"examples": 40, "seed": 0, "steps": 40, "ran": True}
    assert "a targeted engine search of 40 programs (seed 0" in reproduction["budget"]
    assert reproduction["configurations"] and all(c in reproduction["summary"] for c in reproduction["configurations"])
    assert any(c.startswith("toy-qwen3-next-eagle3 ") for c in reproduction["configurations"])
    assert reproduction["summary"].startswith("hand-built only: not reproduced through the engine in ")
    # No deployment profile is driven for a lookup finding: the engine decides, hand-built only.
    assert finding["reach"]["hardening"] is True
    assert "Hardening, not a regression: hand-built only: not reproduced through the engine" in markdown
    assert "not reproduced through vLLM's engine in the search the impact line states" in markdown
    document = json.loads((tmp_path / "fuzz.json").read_text())
    assert document["outcome"] == "HARDENING"
    assert finding["regression_test"]["proposed"] is True, finding["regression_test"]["why_not_proposed"]


# free_keeps_cached_count's minimal program as the stateful differential
# shrank it (0.34.0, seed 3): one request, scheduled, preempted, scheduled.
_PREEMPTED = {"config": {"allow_partial_hash_hits": True, "dcp_world_size": 1, "enable_caching": True,
                         "groups": [{"block_size": 1, "eagle": False, "kind": "full_attention", "sliding_window": 0},
                                    {"block_size": 1, "eagle": False, "kind": "mamba_align", "sliding_window": 0}],
                         "hash_block_size": 1, "num_prefill_lookahead": 0, "scheduler_block_size": 1},
              "max_model_len": 128, "num_blocks": 258, "num_hash_lookahead_tokens": 0,
              "ops": [{"do": "arrive", "id": "r0", "tokens": [0]}, {"do": "schedule"}, {"do": "preempt", "id": "r0"},
                      {"do": "schedule"}],
              "reserve_full_sequence": True, "retention_interval": None}


def test_a_preemption_is_made_by_pool_pressure_and_the_finding_is_reachable():
    # The engine never takes a "preempt": kvspec makes vLLM's scheduler
    # preempt the request by pool pressure, and the mutant's stale cached-block
    # count then trips vLLM's own assertion when the request resumes on a hit.
    from kvspec.diff_tests.reproduce import reproduce_through_engine
    from kvspec.diff_tests.stateful import replay_program

    program = Program.from_dict(_PREEMPTED)
    with SubjectProcess(mutant_subject(NEWEST, "free_keeps_cached_count")) as proc:
        found, reply = replay_program(proc, program)
        assert found and found[0].category is Category.SUBJECT_CRASH
        reproduction = reproduce_through_engine(proc, program, found[0], reply)
        assert reproduction.status == "reproduced" and reproduction.how == "pressure", reproduction.summary
        assert "its preemption made by pool pressure" in reproduction.summary
        engine = reproduction.program
        ops = [op["do"] for op in engine.ops]
        assert ops[0] == "arrive" and engine.ops[0]["id"] == "pressure" and "abort" in ops
        # Through the real Scheduler the request was preempted (not told to be), and vLLM raised.
        found, answer = replay_engine_program(proc, engine)
        assert found and found[0].category is Category.SUBJECT_CRASH and "AssertionError" in found[0].detail
    with SubjectProcess(release(NEWEST)) as proc:
        assert replay_engine_program(proc, engine)[0] == []  # the release holds: no false alarm


_EVICTED = {"config": {"groups": [{"kind": "full_attention", "block_size": 1}, {"kind": "mamba_align", "block_size": 1}],
                       "scheduler_block_size": 1, "hash_block_size": 1},
            "max_model_len": 128, "num_blocks": 258, "num_hash_lookahead_tokens": 0,
            "ops": [{"do": "arrive", "id": "r0", "tokens": [0]}, {"do": "schedule"},
                    {"do": "evict", "id": "r0", "from_block": 0}],
            "reserve_full_sequence": True, "retention_interval": None}


def test_an_eviction_is_a_failed_load_under_the_policy_that_evicts_and_the_finding_is_reachable():
    """The stateful machine's evict (a failed KV load's evict_blocks) becomes
    a load kvspec's connector fails, under vLLM's default policy: the only one
    under which the scheduler calls evict_blocks (under 'recompute' nothing
    is evicted and the finding was hand-built only)."""
    from kvspec.diff_tests.reproduce import reproduce_through_engine
    from kvspec.diff_tests.stateful import replay_program

    program = Program.from_dict(_EVICTED)
    with SubjectProcess(mutant_subject(NEWEST, "evict_skips_held_blocks")) as proc:
        found, reply = replay_program(proc, program)
        assert found and found[0].category is Category.STATE_EVICTED_FINDABLE, [d.summary() for d in found]
        reproduction = reproduce_through_engine(proc, program, found[0], reply)
        assert reproduction.status == "reproduced", reproduction.summary
        engine = reproduction.program
        assert engine.setup.model == "toy-llama" and engine.setup.kv_load_failure_policy is None
        assert engine.ops[0]["load"]["fail"] == 0
    with SubjectProcess(release(NEWEST)) as proc:
        assert replay_engine_program(proc, engine)[0] == []  # the release holds: no false alarm


def _case_reproduced(proc, case, category: Category, kind: str):
    """The case's finding on ``proc`` (of ``category``), reproduced through
    the engine with the mechanism's group ``kind``."""
    from kvspec.diff_tests.reproduce import reproduce_case_through_engine
    from kvspec.model.requests import Run
    from kvspec.oracles.lookup import check_case

    (found, *_) = check_case(case, proc.capabilities, proc.run(Run.of(case)))
    assert found.category is category
    reproduction = reproduce_case_through_engine(proc, case, found)
    assert reproduction.status == "reproduced", reproduction.summary
    assert reproduction.target.category == category.value and reproduction.target.kind == kind
    return reproduction


def test_a_registration_finding_is_looked_for_through_the_engine_and_reachable():
    # eagle_rule_everywhere applies the EAGLE bound to every group: the
    # registration differential's minimal case (0.34.0, seed 0) registers a
    # whole prompt where the spec floors it to the scheduler block.  The same
    # reproduction as a stateful finding's, every cache_blocks call the real
    # Scheduler makes held to the registration bound.
    from kvspec.model.case import Case

    case = Case.from_dict({"config": {"groups": [
        {"block_size": 576, "eagle": False, "kind": "mamba_align", "sliding_window": 0},
        {"block_size": 576, "eagle": False, "kind": "full_attention", "sliding_window": 0}],
        "scheduler_block_size": 576, "hash_block_size": 576, "enable_caching": True, "num_prefill_lookahead": 0,
        "dcp_world_size": 1, "allow_partial_hash_hits": True},
        "prompt_len": 1578, "steps": [{"kind": "prefill", "tokens": 1578, "drafts": 0, "accepted": 0}]})
    with SubjectProcess(mutant_subject(NEWEST, "eagle_rule_everywhere")) as proc:
        reproduction = _case_reproduced(proc, case, Category.OVER_REGISTRATION, "mamba_align")
        assert reproduction.summary.startswith("reachable through vLLM's scheduler with settings")
        engine = reproduction.program
        assert engine.setup.model == "toy-nemotron-h" and engine.setup.max_model_len >= 1578 + 64
    # The engine program on the release: every cache_blocks call within the bound, no false alarm.
    from kvspec.diff_tests.engine import drive_engine_program
    from kvspec.diff_tests.reproduce import RegistrationBound

    with SubjectProcess(release(NEWEST)) as proc:
        bound = None
        for record in drive_engine_program(proc, engine):
            if record.op["do"] == "open":
                bound = RegistrationBound(record.reply.payload.derived, proc.capabilities)
                continue
            assert not record.found and bound(record.answer) == []
        assert sum(len(calls) for calls in bound.calls.values()) >= 2  # the bound was held on real calls


def test_a_lookup_finding_is_looked_for_through_the_engine_and_reachable():
    # eagle_drop_removed never drops the EAGLE tail from a full-attention
    # hit: the lookup differential's minimal case (0.34.0, seed 0) is a later
    # request's hit needing a block the writer never registered.  Looked for
    # as a registration finding is, its engine form is a lookup rule the real
    # Scheduler's lookups are held to (here hit_length: the leading run of
    # registered blocks less the one EAGLE recomputes).
    from kvspec.model.case import Case

    case = Case.from_dict({"config": {"groups": [
        {"block_size": 1, "eagle": False, "kind": "full_attention", "sliding_window": 0},
        {"block_size": 2, "eagle": True, "kind": "full_attention", "sliding_window": 0}],
        "scheduler_block_size": 2, "hash_block_size": 1, "enable_caching": True, "num_prefill_lookahead": 0,
        "dcp_world_size": 1, "allow_partial_hash_hits": True}, "prompt_len": 1,
        "steps": [{"kind": "prefill", "tokens": 1, "drafts": 0, "accepted": 0},
                  {"kind": "decode", "tokens": 0, "drafts": 0, "accepted": 0}],
        "probe": {"shared": 2, "extra": 1}})
    with SubjectProcess(mutant_subject(NEWEST, "eagle_drop_removed")) as proc:
        reproduction = _case_reproduced(proc, case, Category.LOOKUP_CONTRACT, "full_attention")
        assert "shown through the engine as state_hit_bounds or state_hit_groups or state_hit_length" \
            in reproduction.summary
        engine = reproduction.program
        assert engine.setup.model == "toy-llama" and engine.setup.legacy_hashes  # the EAGLE drop live
        found, _ = replay_engine_program(proc, engine)
        assert found and found[0].category.value.startswith("state_hit_")
    with SubjectProcess(release(NEWEST)) as proc:
        assert replay_engine_program(proc, engine)[0] == []  # the release holds: no false alarm
