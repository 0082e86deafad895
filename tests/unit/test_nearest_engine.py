"""A stateful program's nearest engine configurations and its operations as
engine inputs (``model/nearest_engine.py``): pure, no vLLM."""

from __future__ import annotations

from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
from kvspec.model.nearest_engine import (Target, group_kind, nearest_setups, reproduction_reach, scale_for,
                                         translate)
from kvspec.model.program import Program


def _program(groups, ops, S=2, **kw) -> Program:
    config = CoordinatorConfig(tuple(groups), scheduler_block_size=S, hash_block_size=min(g.block_size for g in groups))
    return Program(config, 130, 128, ops, **kw)


OPS = ({"do": "arrive", "id": "r0", "tokens": [1, 2, 3]}, {"do": "schedule", "budget": 16},
       {"do": "preempt", "id": "r0"}, {"do": "schedule"}, {"do": "evict", "id": "r0", "from_block": 0},
       {"do": "finish", "id": "r0"}, {"do": "reset"})


def test_the_model_is_the_toy_whose_layout_has_the_findings_group_kinds():
    window = KVCacheGroup(GroupKind.SLIDING_WINDOW, 2, sliding_window=2)
    mamba = KVCacheGroup(GroupKind.MAMBA_ALIGN, 2)
    full = KVCacheGroup(GroupKind.FULL_ATTENTION, 2)
    setups, notes = nearest_setups(_program([window, mamba], OPS))
    assert [s.model for s in setups][:1] == ["toy-nemotron-h"] and "toy-gpt-oss" in {s.model for s in setups}
    assert any("no toy model has both" in n for n in notes)
    setups, _ = nearest_setups(_program([full], OPS, retention_interval=4, reserve_full_sequence=False))
    assert {s.model for s in setups} == {"toy-llama"}
    nearest = setups[0]
    # Flags only where the program had the setting; the Llama toy takes no retention interval.
    assert nearest.reserve_full_isl is False and nearest.retention_interval is None and nearest.block_size == 16
    assert any(s.max_num_batched_tokens == 16 for s in setups)  # the step budget the program used
    eagle = KVCacheGroup(GroupKind.FULL_ATTENTION, 2, eagle=True)
    (first, *_), _ = nearest_setups(_program([eagle], OPS))
    assert first.num_speculative_tokens == 1 and first.legacy_hashes is True
    # Full-attention groups of two blocks: the engine that builds them (the toy
    # Qwen3-Next's EAGLE3 drafter gets half the target's block), with its
    # drafter and the release's own hashes, then the plain full-attention toy.
    setups, _ = nearest_setups(_program([full, KVCacheGroup(GroupKind.FULL_ATTENTION, 4)], OPS, S=4))
    assert [s.model for s in setups][0] == "toy-qwen3-next-eagle3" and "toy-llama" in {s.model for s in setups}
    assert setups[0].num_speculative_tokens == 1 and not setups[0].legacy_hashes


def test_a_prefill_lookahead_past_one_is_searched_as_multi_module_mtp():
    """A hand-built program with EAGLE over Mamba and a prefill lookahead L > 1
    (multi-module MTP's): the toy Qwen3-Next with L MTP modules and L drafts,
    at most the toy's three; lookahead 1 keeps the toy's one module."""
    def mtp_setup(lookahead):
        groups = (KVCacheGroup(GroupKind.MAMBA_ALIGN, 4), KVCacheGroup(GroupKind.FULL_ATTENTION, 4, eagle=True))
        config = CoordinatorConfig(groups, scheduler_block_size=4, hash_block_size=4, num_prefill_lookahead=lookahead)
        setups, notes = nearest_setups(Program(config, 130, 128, OPS))
        return next(s for s in setups if s.model == "toy-qwen3-next"), notes

    for lookahead, modules in ((2, 2), (3, 3)):
        setup, _ = mtp_setup(lookahead)
        assert (setup.num_nextn_predict_layers, setup.num_speculative_tokens) == (modules, modules)
        assert setup.message()["hf_config"]["num_nextn_predict_layers"] == modules
    setup, notes = mtp_setup(4)
    assert setup.num_nextn_predict_layers == 3 and any("prefill lookahead 4 becomes 3" in n for n in notes)
    setup, _ = mtp_setup(1)
    assert setup.num_nextn_predict_layers is None and setup.num_speculative_tokens == 1


def test_translation_keeps_prompts_and_says_what_it_drops():
    full = KVCacheGroup(GroupKind.FULL_ATTENTION, 2)
    program = _program([full], OPS)
    setup = nearest_setups(program)[0][0]
    engine, notes = translate(program, setup)
    kinds = [op["do"] for op in engine.ops]
    assert kinds == ["arrive", "step", "step", "abort", "reset", "step"]
    assert engine.ops[0]["tokens"] == [1, 2, 3] and engine.ops[0]["max_tokens"] >= 3  # alive until aborted
    assert any("preempt" in n for n in notes) and any("evict" in n for n in notes) and any("budget" in n for n in notes)
    scale = scale_for(program, setup)
    assert scale == 8  # the engine's block of 16 over the program's 2
    stretched, _ = translate(program, setup, scale)
    assert len(stretched.ops[0]["tokens"]) == 24 and len(set(stretched.ops[0]["tokens"])) == 24


def test_the_mechanism_and_the_reach():
    assert group_kind("window_held: request r0, group 1 (sliding window 2)", ["full_attention", "sliding_window"]) \
        == "sliding_window"
    assert group_kind("no group named", ["full_attention"]) is None
    assert Target("state_window", "sliding_window").describe() == "state_window in a sliding_window group"
    assert reproduction_reach({"status": "not reproduced", "summary": "hand-built only: ..."}).hardening is True
    assert reproduction_reach({"status": "reproduced", "summary": "reachable ..."}).hardening is False
    # A search that did not run to its end is not called hardening for want of a search.
    assert reproduction_reach({"status": "unknown", "summary": "unknown ..."}).hardening is False


def test_an_eviction_is_a_failed_connector_load_and_a_preemption_is_made_by_pool_pressure():
    from kvspec.model.engine import OWN_CONNECTOR
    from kvspec.model.nearest_engine import PRESSURE_ID, after_preemption, preempt_points, pressure_trial

    full = KVCacheGroup(GroupKind.FULL_ATTENTION, 2)
    program = _program([full], OPS)
    setups, _ = nearest_setups(program)
    # The program evicts: setups with kvspec's connector failing the load, first under vLLM's default
    # policy (the only one under which vLLM evicts), then recomputing from the failed block.
    failing, recomputing = [s for s in setups if s.kv_connector == OWN_CONNECTOR]
    assert failing.kv_load_failure_policy is None and recomputing.kv_load_failure_policy == "recompute"
    engine, notes = translate(program, failing)
    assert engine.ops[0]["load"] == {"offer": 2, "async": False, "delay": 0, "fail": 0}
    assert not any("evict" in n for n in notes) and any("preempt" in n for n in notes)
    # The preemption: after the arrival and the first step (two engine operations), of r0.
    assert preempt_points(program) == [(2, "r0")]
    plain, _ = translate(program, setups[0])
    trial, rest, victim = pressure_trial(program, plain, filler=5, steps=3)
    assert victim == "r0" and trial.ops[0]["id"] == PRESSURE_ID and len(trial.ops[0]["tokens"]) == 5
    assert [op["do"] for op in trial.ops] == ["arrive", "arrive", "step", "step", "step", "step"]
    assert trial.ops[1]["max_tokens"] == 256 - 3  # runs to the model length: it holds blocks until preempted
    assert rest == [dict(op) for op in plain.ops[2:]]
    cut = after_preemption(trial, 3, rest)
    assert [op["do"] for op in cut.ops[:5]] == ["arrive", "arrive", "step", "step", "abort"]
    assert cut.ops[4]["id"] == PRESSURE_ID and list(cut.ops[5:]) == rest
    assert pressure_trial(_program([full], OPS[:2]), plain, 5, 3) is None  # no preemption, no trial


def test_a_registration_case_is_a_program_and_its_mechanism_is_the_group_that_differs():
    from kvspec.model.case import Case, LookupProbe, decode, prefill
    from kvspec.model.finding import Category
    from kvspec.model.nearest_engine import mechanism_kind, program_of_case
    from kvspec.oracles.registration import Discrepancy

    mamba, full = KVCacheGroup(GroupKind.MAMBA_ALIGN, 8), KVCacheGroup(GroupKind.FULL_ATTENTION, 8)
    config = CoordinatorConfig((mamba, full), scheduler_block_size=8, hash_block_size=8)
    case = Case(config, 20, (prefill(16), prefill(4), decode(2, 1)), LookupProbe(12, 3))
    program = program_of_case(case)
    assert [op["do"] for op in program.ops] == ["arrive", "schedule", "schedule", "schedule", "arrive", "schedule"]
    assert program.ops[0]["tokens"] == list(range(1, 21)) and program.ops[1] == {"do": "schedule", "budget": 16}
    assert program.ops[3] == {"do": "schedule", "drafts": 2, "accepted": 1}
    assert program.ops[4]["tokens"][:12] == list(range(1, 13)) and len(program.ops[4]["tokens"]) == 15
    under = Discrepancy(Category.UNDER_REGISTRATION, 0, 20, (16, 16), (16, 8), (2, 2), (2, 1))
    assert mechanism_kind(under, ["mamba_align", "full_attention"]) == "full_attention"
    blocks = Discrepancy(Category.BLOCK_MISMATCH, 0, 20, (16, 16), (16, 16), (2, 2), (1, 2))
    assert mechanism_kind(blocks, ["mamba_align", "full_attention"]) == "mamba_align"


def test_a_registration_findings_reach_says_what_the_engine_showed():
    from kvspec.model.finding import Reach
    from kvspec.reach import with_engine_reach

    profiles = Reach("On vLLM 0.34.0, x reaches 1 of 18 deployment profiles", ({"profile": "p"},), None)
    shown = with_engine_reach(profiles, {"status": "reproduced", "summary": "reachable through vLLM's scheduler with "
                                                                           "settings `--block-size 16` on toy-gpt-oss"})
    assert shown.summary.startswith("reachable through vLLM's scheduler") and not shown.hardening
    assert "Deployment profiles: On vLLM 0.34.0" in shown.summary and shown.profiles == profiles.profiles
    missed = {"status": "not reproduced", "summary": "hand-built only: not reproduced through the engine in ..."}
    # Profiles vLLM's own code derived reach it: not hardening, the search said beside them.
    kept = with_engine_reach(profiles, missed)
    assert not kept.hardening and kept.summary.startswith("On vLLM 0.34.0")
    assert "through vLLM's engine: not reproduced through the engine in" in kept.summary
    nowhere = with_engine_reach(Reach("no known deployment reaches it", hardening=True), missed)
    assert nowhere.hardening and nowhere.summary.startswith("hand-built only: no known deployment")


def test_a_lookup_findings_mechanism_is_shown_through_the_engine_by_the_lookup_rules():
    from kvspec.model.domain import GroupKind
    from kvspec.model.finding import Category
    from kvspec.model.nearest_engine import ENGINE_FORMS, mechanism_kind
    from kvspec.oracles.registration import Discrepancy

    contract = Target("lookup_contract", "full_attention")
    assert contract.shown_by("lookup_contract") and contract.shown_by("state_hit_length")
    assert contract.shown_by("state_hit_bounds") and not contract.shown_by("state_retention_hit")
    assert Target("hit_mismatch").shown_by("state_retention_hit") and not Target("state_window").shown_by("state_hit_length")
    assert "shown through the engine as state_hit_bounds or state_hit_groups" in contract.describe()
    assert set(ENGINE_FORMS) == {Category.LOOKUP_CONTRACT.value, Category.HIT_MISMATCH.value}
    # A lookup discrepancy's tokens are one hit, not a group's: the group is the one its detail names.
    kinds = ["mamba_align", "full_attention"]
    missed = Discrepancy(Category.HIT_MISMATCH, None, None, (16,), (0,), detail="hit expected 16, observed 0")
    assert mechanism_kind(missed, kinds) is None
    needs = Discrepancy(Category.LOOKUP_CONTRACT, None, None, (), (2,),
                        detail="group 1 (full_attention(block 2, EAGLE)) needs 4 tokens for hit 2")
    assert mechanism_kind(needs, kinds) == "full_attention"
    # An engine rule that names its group's kind (model.state.Violation) is said by it.
    length = Discrepancy(Category.STATE_HIT_LENGTH, None, None, detail="request r3: a hit of 32 tokens",
                         group_kinds=(GroupKind.FULL_ATTENTION,))
    assert mechanism_kind(length, ["full_attention"]) == "full_attention"


def test_a_finding_neither_the_engine_nor_a_profile_reaches_is_hand_built_only():
    from kvspec.model.finding import Reach
    from kvspec.reach import with_engine_reach

    # A lookup finding: the profiles are not driven for it, so only the engine can say who reaches it.
    unassessed = Reach("Not assessed: no model variant explains this lookup-contract finding and the profiles are "
                       "not driven for this category")
    missed = {"status": "not reproduced", "summary": "hand-built only: not reproduced through the engine in ..."}
    hand_built = with_engine_reach(unassessed, missed)
    assert hand_built.hardening and hand_built.summary.startswith("hand-built only: not reproduced")
    assert "deployment profiles: Not assessed" in hand_built.summary
    unknown = with_engine_reach(unassessed, {"status": "unknown", "summary": "hand-built; reachability unknown"})
    assert not unknown.hardening  # never called hardening for want of a search that ran to its end
