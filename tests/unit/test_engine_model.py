"""Engine setups and programs (model/engine.py) and the seam's block-estimate
invariant, without vLLM."""

from __future__ import annotations

import attrs
import pytest

from kvspec.model.case import InvalidCase
from kvspec.model.domain import CoordinatorConfig, GroupKind, HashScheme, KVCacheGroup
from kvspec.model.engine import TOY_MODELS, EngineProgram, EngineSetup, derived_config
from kvspec.model.state import INVARIANTS, Allocation, ManagerState, Transition
from kvspec.model.capabilities import Capabilities, expected_regime


def test_unset_flags_are_left_to_the_release():
    setup = EngineSetup(model="toy-llama", num_gpu_blocks=30)
    assert setup.engine_args() == {"num_gpu_blocks_override": 30, "max_model_len": 256}
    assert "prefix_cache_retention_interval" not in setup.engine_args()
    flags = EngineSetup(model="toy-llama", num_gpu_blocks=30, retention_interval=0, async_scheduling=False)
    assert flags.cli_flags() == ("--num-gpu-blocks-override 30 --max-model-len 256 --prefix-cache-retention-interval 0 "
                                 "--no-async-scheduling")


@pytest.mark.parametrize("bad", [dict(model="no-such-model", num_gpu_blocks=10),
                                 dict(model="toy-llama", num_gpu_blocks=0),
                                 dict(model="toy-llama", num_gpu_blocks=10, async_scheduling="yes")])
def test_a_bad_setup_is_an_input_error(bad):
    with pytest.raises(InvalidCase):
        EngineSetup(**bad)


def test_a_program_round_trips_and_refuses_unknown_operations():
    program = EngineProgram(EngineSetup(model="toy-nemotron-h", num_gpu_blocks=40),
                            ({"do": "arrive", "id": "r0", "tokens": [1, 2, 3], "max_tokens": 2}, {"do": "step"}))
    assert EngineProgram.from_dict(program.as_dict()) == program
    assert "add_request r0 (3 prompt tokens" in program.describe()
    with pytest.raises(InvalidCase):
        program.with_ops([{"do": "explode"}])
    with pytest.raises(InvalidCase):
        EngineProgram.from_dict({"ops": []})


def test_the_derived_geometry_is_kvspecs_config():
    derived = {"groups": [{"kind": "mamba_align", "block_size": 64, "eagle": False},
                          {"kind": "full_attention", "block_size": 64, "eagle": False}],
               "scheduler_block_size": 64, "hash_block_size": 64, "enable_caching": True,
               "num_hash_lookahead_tokens": 0}
    config = derived_config(derived)
    assert config.groups[0].kind is GroupKind.MAMBA_ALIGN and config.hash_scheme is HashScheme.LEGACY
    with pytest.raises(InvalidCase):
        derived_config({**derived, "groups": [{"kind": "mla_sparse", "block_size": 64, "eagle": False}]})


def _transition(allocations, kinds=(GroupKind.FULL_ATTENTION,)):
    config = CoordinatorConfig(tuple(KVCacheGroup(k, 4) for k in kinds), 4, 4)
    state = ManagerState(null_block=0, num_free=3, free_queue=(1, 2, 3), blocks=(), hash_map=(), tables=())
    return Transition(op="schedule", request=None, before=state, after=state, config=config,
                      regime=expected_regime(config, Capabilities()), capabilities=Capabilities(), running={},
                      allocations=tuple(allocations))


def test_block_estimate_flags_an_allocation_that_took_more_than_estimated():
    rule = next(i for i in INVARIANTS if i.name == "block_estimate")
    assert rule.check(_transition([Allocation("r0", (1, 1), 10, 8)])) == []
    assert rule.check(_transition([Allocation("r0", (1, None), 10, 9)])) == []
    assert rule.check(_transition([Allocation("r0", (1, 1), 10, None)])) == []  # raised: the crash is the finding
    broken = rule.check(_transition([Allocation("r0", (1, 0), 10, 8)]))
    assert broken and "took 2 free blocks; the groups estimated 1" in broken[0].message


def test_block_estimate_names_the_groups_that_took_more_than_they_estimated():
    """A broken estimate is known by which group kinds broke it (the driver
    counts each group's takes from the pool), not by its numbers."""
    rule = next(i for i in INVARIANTS if i.name == "block_estimate")
    kinds = (GroupKind.MAMBA_ALIGN, GroupKind.FULL_ATTENTION)
    (broken,) = rule.check(_transition([Allocation("r0", (1, 1), 10, 7, taken=(2, 1))], kinds))
    assert broken.message.endswith("; group 0 (mamba_align) took 2 against its estimate 1")
    assert broken.group_kinds == (GroupKind.MAMBA_ALIGN,)
    (broken,) = rule.check(_transition([Allocation("r0", (1, 1), 10, 7, taken=(1, 2))], kinds))
    assert broken.message.endswith("; group 1 (full_attention) took 2 against its estimate 1")
    assert broken.group_kinds == (GroupKind.FULL_ATTENTION,)
    (unattributed,) = rule.check(_transition([Allocation("r0", (1, 1), 10, 7)], kinds))
    assert unattributed.message.endswith("the groups estimated 2 (1, 1)") and unattributed.group_kinds == ()


def test_speculative_decoding_needs_the_toys_drafter():
    setup = EngineSetup(model="toy-llama", num_gpu_blocks=30, num_speculative_tokens=2, legacy_hashes=True)
    assert setup.engine_args()["speculative_config"] == {"method": "eagle3", "num_speculative_tokens": 2,
                                                         "disable_lookahead_block_hashes": True}
    assert setup.message()["drafter"]["hf_config"]["architectures"] == ["LlamaForCausalLMEagle3"]
    with pytest.raises(InvalidCase):
        EngineSetup(model="toy-nemotron-h", num_gpu_blocks=30, num_speculative_tokens=2)
    with pytest.raises(InvalidCase):
        EngineSetup(model="toy-llama", num_gpu_blocks=30, legacy_hashes=True)


def test_the_eagle_drop_is_in_the_hit_length_rule_only_under_legacy_hashes():
    """One EAGLE group: under lookahead hashes (0.33+'s default) nothing is
    dropped, so a hit of every registered block is right; under legacy hashes
    the last one is recomputed."""
    from kvspec.model.state import Lookup

    rule = next(i for i in INVARIANTS if i.name == "hit_length")
    lookup = Lookup("r1", 64, ((1,),), 128, mapped=(True, False))
    for scheme, right in ((HashScheme.LOOKAHEAD, 64), (HashScheme.LEGACY, 0)):
        config = CoordinatorConfig((KVCacheGroup(GroupKind.FULL_ATTENTION, 64, eagle=True),), 64, 64,
                                   num_prefill_lookahead=1, hash_scheme=scheme)
        state = ManagerState(null_block=0, num_free=0, free_queue=(), blocks=(), hash_map=(), tables=())
        t = Transition(op="schedule", request=None, before=state, after=state, config=config,
                       regime=expected_regime(config, Capabilities()), capabilities=Capabilities(), running={},
                       lookups=(attrs.evolve(lookup, hit=right),))
        assert rule.check(t) == [], scheme
        wrong = attrs.evolve(t, lookups=(attrs.evolve(lookup, hit=64 - right),))
        assert rule.check(wrong), scheme


def test_kvspecs_connector_is_passed_by_its_module_path_and_its_plans_are_checked():
    setup = EngineSetup(model="toy-llama", num_gpu_blocks=30, kv_connector="KvspecConnector",
                        kv_load_failure_policy="recompute")
    assert setup.engine_args()["kv_transfer_config"] == {
        "kv_connector": "KvspecConnector", "kv_role": "kv_both",
        "kv_connector_module_path": "kvspec.subjects.vllm_side.connector", "kv_load_failure_policy": "recompute"}
    with pytest.raises(InvalidCase):  # the policy is drawn for kvspec's connector only
        EngineSetup(model="toy-llama", num_gpu_blocks=30, kv_connector="DecodeBenchConnector",
                    kv_load_failure_policy="fail")
    plan = {"offer": 20, "async": True, "delay": 2, "fail": None}
    program = EngineProgram(setup, [{"do": "arrive", "id": "a", "tokens": [1, 2, 3], "load": plan}])
    assert EngineProgram.from_dict(program.as_dict()) == program  # the plan is recorded, so replay reproduces it
    assert "offers 20 prompt tokens loaded asynchronously" in program.describe()
    for bad in ({"offer": -1, "async": False, "delay": 0, "fail": None}, {"offer": 1, "async": "no", "delay": 0},
                {"offer": 1, "async": False, "delay": 0, "fail": None, "extra": 1}, [1, 2]):
        with pytest.raises(InvalidCase):
            EngineProgram(setup, [{"do": "arrive", "id": "a", "tokens": [1], "load": bad}])


def test_no_retention_interval_is_drawn_where_the_release_takes_none():
    """Before 0.29 EngineArgs has no prefix_cache_retention_interval: every
    setup drawn with one would be refused, so none is drawn there."""
    from hypothesis import HealthCheck, given, settings

    from kvspec.diff_tests.engine import engine_setups

    seen = []

    @settings(max_examples=200, database=None, suppress_health_check=list(HealthCheck))
    @given(engine_setups(leaving_out={"retention": "no such flag"}), engine_setups())
    def draw(without, with_retention):
        assert without.retention_interval is None
        seen.append(with_retention.retention_interval)

    draw()
    assert any(v is not None for v in seen)  # drawn by default


def test_the_toy_qwen3_next_drafts_with_its_own_mtp_module():
    """MTP speculative decoding is vLLM's method "mtp" on the target itself:
    no drafter config.json, one draft attention layer per MTP module."""
    setup = EngineSetup(model="toy-qwen3-next", num_gpu_blocks=40, num_speculative_tokens=2, legacy_hashes=True,
                        prefix_match_unit=16)
    assert setup.engine_args()["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2,
                                                         "disable_lookahead_block_hashes": True}
    assert setup.engine_args()["prefix_match_unit"] == 16
    message = setup.message()
    assert message["drafter"] == {"hf_config": None, "draft_layers": 1}
    # The EAGLE3 variant's drafter has twice the target's KV heads: its own geometry goes to the worker.
    eagle = EngineSetup(model="toy-qwen3-next-eagle3", num_gpu_blocks=40, num_speculative_tokens=1).message()
    assert (eagle["drafter"]["num_kv_heads"], eagle["drafter"]["head_dim"]) == (4, 16)
    assert eagle["hf_config"] == message["hf_config"]
    assert message["layers"] == ["mamba", "mamba", "mamba", "full"] and message["mixer"] == "gdn"
    assert EngineSetup(model="toy-llama", num_gpu_blocks=40, num_speculative_tokens=1).message()["drafter"][
        "hf_config"]["architectures"] == ["LlamaForCausalLMEagle3"]
    with pytest.raises(InvalidCase):
        EngineSetup(model="toy-nemotron-h", num_gpu_blocks=40, num_speculative_tokens=1)


def test_what_a_release_does_not_take_is_not_drawn():
    """Legacy hashes, --prefix-match-unit and a toy model are each left out of
    the draw where the release's engine refused them or built a layout kvspec
    cannot model (asked once: diff_tests.engine.not_drawn)."""
    from hypothesis import HealthCheck, given, settings

    from kvspec.diff_tests.engine import engine_setups

    seen = []

    left_out = ["legacy_hashes", "match_unit"] + [m.name for m in TOY_MODELS
                                                  if m.name not in ("toy-llama", "toy-gpt-oss")]

    @settings(max_examples=300, database=None, suppress_health_check=list(HealthCheck))
    @given(engine_setups(leaving_out=left_out), engine_setups())
    def draw(without, with_all):
        assert without.model in ("toy-llama", "toy-gpt-oss") and not without.legacy_hashes
        assert without.prefix_match_unit is None
        seen.append(with_all)

    draw()
    mtp = [s for s in seen if s.model.startswith("toy-qwen3-next") and s.num_speculative_tokens]
    assert mtp and any(s.legacy_hashes for s in mtp) and any(s.prefix_match_unit for s in mtp)
    assert any(s.model == "toy-nemotron-h" for s in seen)  # drawn by default


def test_a_release_whose_hybrid_default_is_unmodelled_runs_its_hybrids_aligned():
    """Before 0.28 a hybrid's Mamba groups cache nothing by default (mamba_none,
    which kvspec's state model does not know): not_drawn then says
    "mamba_default" and every hybrid toy gets --mamba-cache-mode align
    --enable-prefix-caching (flags, not draws: the draw is unchanged elsewhere)."""
    from hypothesis import HealthCheck, given, settings

    from kvspec.diff_tests.engine import engine_setups

    @settings(max_examples=150, database=None, suppress_health_check=list(HealthCheck))
    @given(engine_setups(leaving_out={"mamba_default": "mamba_none"}), engine_setups())
    def draw(aligned, default):
        if aligned.toy.hybrid:
            assert aligned.mamba_cache_mode == "align" and aligned.prefix_caching is True
            assert "--enable-prefix-caching" in aligned.describe()
            assert "--mamba-cache-mode align" in aligned.describe()
        else:
            assert aligned.mamba_cache_mode is None
        assert default.mamba_cache_mode is None and "mamba_cache_mode" not in default.as_dict()

    draw()
    with pytest.raises(InvalidCase):
        EngineSetup(model="toy-llama", num_gpu_blocks=40, mamba_cache_mode="align")
    with pytest.raises(InvalidCase):
        EngineSetup(model="toy-nemotron-h", num_gpu_blocks=40, mamba_cache_mode="all")
    with pytest.raises(InvalidCase):  # an untrusted stored setup: a clear error, not attrs' ValueError
        EngineSetup.from_dict({"model": "toy-llama", "num_gpu_blocks": 40, "kv_connector": "Nope"})
    stored = EngineSetup(model="toy-nemotron-h", num_gpu_blocks=40, mamba_cache_mode="align").as_dict()
    assert EngineSetup.from_dict(stored).engine_args()["mamba_cache_mode"] == "align"


def test_the_mtp_toys_modules_are_an_engine_setting_written_into_its_config_json():
    """num_nextn_predict_layers (the toy Qwen3-Next's own MTP modules) goes
    into the model's config.json and the worker's draft layers; unset, it is
    the toy's one and a stored setup reads as before (no key)."""
    setup = EngineSetup(model="toy-qwen3-next", num_gpu_blocks=40, num_speculative_tokens=2,
                        num_nextn_predict_layers=2)
    message = setup.message()
    assert message["hf_config"]["num_nextn_predict_layers"] == 2 and message["drafter"]["draft_layers"] == 2
    assert setup.hf_config["num_nextn_predict_layers"] == 2
    assert setup.toy.hf_config["num_nextn_predict_layers"] == 1  # the toy itself is untouched
    assert setup.engine_args()["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert "toy-qwen3-next (config.json num_nextn_predict_layers 2)" in setup.describe()
    assert setup.as_dict()["num_nextn_predict_layers"] == 2
    assert EngineProgram.from_dict(EngineProgram(setup).as_dict()).setup == setup
    single = EngineSetup(model="toy-qwen3-next", num_gpu_blocks=40, num_speculative_tokens=2)
    assert "num_nextn_predict_layers" not in single.as_dict()
    assert single.message()["hf_config"]["num_nextn_predict_layers"] == 1
    assert single.message()["drafter"]["draft_layers"] == 1
    assert "num_nextn_predict_layers" not in single.describe()


@pytest.mark.parametrize("bad", [
    dict(model="toy-qwen3-next", num_speculative_tokens=2, num_nextn_predict_layers=0),
    dict(model="toy-qwen3-next", num_speculative_tokens=2, num_nextn_predict_layers=4),
    dict(model="toy-qwen3-next", num_speculative_tokens=2, num_nextn_predict_layers="2"),
    dict(model="toy-qwen3-next", num_speculative_tokens=2, num_nextn_predict_layers=True),
    dict(model="toy-qwen3-next", num_nextn_predict_layers=2),  # no speculative decoding
    dict(model="toy-qwen3-next-eagle3", num_speculative_tokens=2, num_nextn_predict_layers=2),  # an EAGLE3 drafter
    dict(model="toy-llama", num_speculative_tokens=2, num_nextn_predict_layers=2)])
def test_mtp_modules_are_checked_as_untrusted_input(bad):
    with pytest.raises(InvalidCase):
        EngineSetup(num_gpu_blocks=40, **bad)
    with pytest.raises(InvalidCase):
        EngineSetup.from_dict({"num_gpu_blocks": 40, **bad})


def test_multi_module_mtp_is_drawn_where_the_release_has_it_and_said_in_the_scope():
    """The MTP toy draws 2 or 3 modules in some programs, with speculative
    tokens up to the modules; where not_drawn says the release has no
    multi-module MTP, none is drawn and the scope says why."""
    from hypothesis import HealthCheck, given, settings

    from kvspec.diff_tests.engine import EngineResult, engine_draw_scope, engine_setups

    seen, without = [], []

    @settings(max_examples=600, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(engine_setups(leaving_out={"multi_module_mtp": "no use_multi_module_mtp"}), engine_setups())
    def draw(left_out, drawn):
        without.append(left_out)
        seen.append(drawn)

    draw()
    assert all(s.num_nextn_predict_layers is None for s in without)
    assert any(s.model == "toy-qwen3-next" and s.num_speculative_tokens for s in without)
    multi = [s for s in seen if s.num_nextn_predict_layers is not None]
    assert multi and {s.num_nextn_predict_layers for s in multi} == {2, 3}
    assert all(s.model == "toy-qwen3-next" and 1 <= s.num_speculative_tokens <= s.num_nextn_predict_layers
               for s in multi)
    assert any(s.num_speculative_tokens >= 2 for s in multi)  # multi-module MTP proper
    assert any(s.model == "toy-qwen3-next" and s.num_speculative_tokens and s.num_nextn_predict_layers is None
               for s in seen)  # the toy's one module still drawn
    assert "num_nextn_predict_layers: the toy's 1, or 2 or 3 in two MTP programs in three" in engine_draw_scope()
    result = EngineResult(subject={"label": "vllm 0.26.0"}, capabilities=Capabilities(), seed=0,
                          not_drawn={"multi_module_mtp": "this release's SpeculativeConfig has no use_multi_module_mtp"})
    assert ("multi-module MTP (the toy Qwen3-Next with 2 or 3 MTP modules, num_nextn_predict_layers) not drawn on "
            "this release: this release's SpeculativeConfig has no use_multi_module_mtp") in result.scope()
