"""The upstream script and the engine test of a speculative-decoding engine
finding, without vLLM: vLLM's SpeculativeConfig built from the finding's
flags (an EAGLE3 drafter's config.json, or the model's own MTP modules), the
groups vLLM's planning flagged as the drafter's, each step's drafts proposed
and accepted; nothing vLLM derives (the lookahead, the block drop) is written
in; what is still not scriptable says why.  That the scheduler it builds and
the schedules it drives equal the engine worker's is
tests/integration/test_script_fidelity.py's."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from kvspec.emit.engine_test import emit_engine_test
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category
from kvspec.subjects.upstream_repro import Unscriptable, repro_script
from tests.support import assert_ruff_clean_as_vllm_lints

FIXTURES = Path(__file__).parent.parent / "fixtures"
# kvspec fuzz --vllm 0.34.0 --mutant hit_keeps_trimmed_blocks --engine --seed 1: toy Llama, EAGLE3 under legacy hashes.
EAGLE = FIXTURES / "finding_engine_hit_groups_eagle_0.34.0.json"
ESTIMATE = FIXTURES / "finding_engine_mamba_estimate_0.34.0.json"
DRAFT_STEPS = [{"do": "step", "drafts": 1, "accepted": 0}, {"do": "step", "drafts": 1, "accepted": 1},
               {"do": "step"}]

# What the engine worker recorded on 0.34.0 for toy-qwen3-next with two MTP
# modules, two speculative tokens and kvspec's connector (the fidelity test's case).
MTP_SETTINGS = {
    "vllm_version": "0.34.0", "scheduler_class": "Scheduler",
    "groups": [{"kind": "mamba_align", "block_size": 64, "eagle": False, "eagle_group": False, "sliding_window": 0,
                "alignment": 64, "layers": 3, "prefill_checkpoint_blocks": 0, "prefill_checkpoint_alignment": None,
                "speculative_blocks": 2},
               {"kind": "full_attention", "block_size": 64, "eagle": True, "eagle_group": True, "sliding_window": 0,
                "alignment": 64, "layers": 3}],
    "scheduler_block_size": 64, "hash_block_size": 64, "num_blocks": 40, "enable_caching": True,
    "partial_hash_hits": False, "num_prefill_lookahead": 2, "multi_module_mtp": True, "num_hash_lookahead_tokens": 0,
    "retention_interval": 0, "async_scheduling": False, "max_concurrent_batches": 1, "chunked_prefill": True,
    "max_num_batched_tokens": 2048, "max_num_seqs": 128, "reserve_full_isl": True, "max_model_len": 256,
    "speculative_method": "mtp", "num_speculative_tokens": 2, "use_eagle_block_drop": True,
    "mamba_cache_mode": "align", "kv_connector": "KvspecConnector", "kv_load_failure_policy": "fail"}
MTP_SETUP = {"model": "toy-qwen3-next", "num_gpu_blocks": 40, "max_model_len": 256, "async_scheduling": False,
             "num_speculative_tokens": 2, "num_nextn_predict_layers": 2, "kv_connector": "KvspecConnector"}


def _eagle() -> tuple[dict, dict]:
    doc = json.loads(EAGLE.read_text())
    program = doc["inputs"]["engine_program"]
    program["ops"] = [*program["ops"], *DRAFT_STEPS]
    return program, doc["run"]["engine_settings"]


def _mtp() -> tuple[dict, dict]:
    ops = [{"do": "arrive", "id": "a", "tokens": list(range(1, 150)), "max_tokens": 3,
            "load": {"offer": 128, "async": False, "delay": 0, "fail": None}}, *DRAFT_STEPS]
    return {"engine": dict(MTP_SETUP), "ops": ops}, copy.deepcopy(MTP_SETTINGS)


def _script(program: dict, settings: dict, kind: Category = Category.SUBJECT_CRASH) -> str:
    return repro_script(EngineProgram.from_dict(program), settings, kind, "0.34.0").code


def test_an_eagle_findings_script_builds_vllms_speculative_config_and_drives_the_drafts():
    code = _script(*_eagle())
    compile(code, "repro.py", "exec")
    assert not re.search(r"^\s*(import|from) kvspec", code, re.M)
    # The flags as the user gave them; the drafter's config.json is written beside the model's.
    assert 'SPECULATIVE_METHOD = "eagle3"' in code and "NUM_SPECULATIVE_TOKENS = 1" in code
    assert "DISABLE_LOOKAHEAD_BLOCK_HASHES = True" in code
    assert 'architectures=["LlamaForCausalLMEagle3"]' in code
    assert "return SpeculativeConfig(" in code and "speculative_config=speculative_config(" in code
    # The group vLLM's planning flagged as the drafter's; the lookahead is vLLM's, not written in.
    assert "EAGLE_GROUPS = [0]" in code and "is_eagle_group=len(groups) in EAGLE_GROUPS" in code
    assert "num_hash_lookahead_tokens" in code and not re.search(r"num_hash_lookahead_tokens\s*=", code)
    assert "num_prefill_lookahead" not in code
    # Each step's drafts: accepted in its output, then proposed as EngineCore does.
    assert '    # one engine step: up to 1 scheduled drafts accepted, then 1 proposed\n    ("step", 1, 1),' in code
    assert '    ("step", 0, 0),' in code and "scheduler.update_draft_token_ids(drafts)" in code
    assert "min(num_accepted + 1, allotted[rid])" in code
    assert "output.scheduled_spec_decode_tokens.get(rid, ())" in code


def test_a_multi_module_mtp_findings_script_carries_the_mamba_layers_speculative_blocks():
    code = _script(*_mtp())
    assert 'SPECULATIVE_METHOD = "mtp"' in code and "DRAFT_MODEL_CONFIG = None" in code
    assert "num_nextn_predict_layers=2," in code  # the model's own modules, in its config.json
    assert "MAMBA_SPECULATIVE_BLOCKS = 2" in code and "num_speculative_blocks=MAMBA_SPECULATIVE_BLOCKS," in code
    assert "EAGLE_GROUPS = [1]" in code and "DISABLE_LOOKAHEAD_BLOCK_HASHES = False" in code
    # kvspec's connector and the drafts, together.
    assert "class ExternalStoreConnector(KVConnectorBase_V1, SupportsHMA):" in code
    assert "execute(op[2], output, allotted, loads)" in code


def test_a_finding_without_speculative_decoding_gets_the_code_it_had():
    code = _script(json.loads(ESTIMATE.read_text())["inputs"]["engine_program"],
                   json.loads(ESTIMATE.read_text())["run"]["engine_settings"], Category.STATE_BLOCK_ESTIMATE)
    for word in ("SpeculativeConfig", "DraftTokenIds", "EAGLE_GROUPS", "num_accepted", "lookahead"):
        assert word not in code


@pytest.mark.parametrize("which", ["eagle", "mtp"])
def test_the_speculative_script_and_test_pass_ruff_under_vllms_configuration(tmp_path, which):
    program, settings = _eagle() if which == "eagle" else _mtp()
    code = _script(program, settings)
    assert_ruff_clean_as_vllm_lints(code, tmp_path, "repro.py")
    test = emit_engine_test(EngineProgram.from_dict(program), settings, Category.STATE_HIT_GROUPS, "0.34.0")
    assert "def test_every_group_trims_its_hit_blocks_to_the_common_hit(tmp_path):" in test
    assert "propose_drafts(scheduler, output, op[1])" in test
    assert_ruff_clean_as_vllm_lints(test, tmp_path, "test_every_group_trims_its_hit_blocks_to_the_common_hit.py")


def test_mamba_groups_without_their_recorded_speculative_blocks_get_no_script():
    program, settings = _mtp()
    del settings["groups"][0]["speculative_blocks"]
    with pytest.raises(Unscriptable, match=r"speculative state blocks .* rerun `kvspec fuzz --engine`"):
        _script(program, settings)


@pytest.mark.parametrize("change, words", [
    ({"num_speculative_tokens": 3}, "do not record the speculative decoding its engine flags set"),
    ({"speculative_method": "eagle3"}, "do not record the speculative decoding its engine flags set"),
    ({"num_speculative_tokens": "2"}, "no valid num_speculative_tokens"),
    ({"num_hash_lookahead_tokens": True}, "no valid num_hash_lookahead_tokens"),
])
def test_settings_that_do_not_match_the_flags_get_no_script(change, words):
    program, settings = _mtp()
    settings.update(change)
    with pytest.raises(Unscriptable, match=words):
        _script(program, settings)


def test_settings_of_speculative_decoding_the_flags_do_not_set_get_no_script():
    doc = json.loads(ESTIMATE.read_text())
    settings = doc["run"]["engine_settings"]
    settings.update(speculative_method="eagle3", num_speculative_tokens=1)
    with pytest.raises(Unscriptable, match="vLLM ran speculative decoding, which its engine flags do not set"):
        _script(doc["inputs"]["engine_program"], settings)


def test_a_groups_eagle_flag_is_a_validated_boolean():
    program, settings = _eagle()
    settings["groups"][0]["eagle_group"] = "yes"
    with pytest.raises(Unscriptable, match="no valid eagle_group"):
        _script(program, settings)
