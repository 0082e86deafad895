"""`kvspec run`: one corpus case on real vLLM beside the spec, under the
release's default hash scheme or the one asked for."""

from __future__ import annotations

import json

from kvspec.cli import main
from kvspec.model.outcome import Outcome


def _run(args, tmp_path, capsys):
    out = tmp_path / "run.json"
    code = main(["run", *args, "--json", str(out)])
    return code, capsys.readouterr().out, json.loads(out.read_text())


def test_the_seed_case_on_033_and_its_50062_mutant(tmp_path, capsys):
    code, text, doc = _run(["--vllm", "0.33.0", "--case", "seed_52419"], tmp_path, capsys)
    assert code == Outcome.OK.exit_code
    assert "per-group tokens at the last call: spec [22, 22], vLLM [22, 22]" in text
    # 0.33's default: lookahead hashes, so the EAGLE branch does not run at all.
    assert doc["hash_scheme"] == "lookahead" and doc["eagle_branch_live"] is False
    assert "the EAGLE branch of the bound is NOT live" in text

    code, text, doc = _run(["--vllm", "0.33.0", "--case", "seed_52419", "--mutant", "refloor_50062",
                            "--hash-scheme", "legacy"], tmp_path, capsys)
    assert code == Outcome.FINDING.exit_code
    assert "per-group tokens at the last call: spec [22, 22], vLLM [18, 22]" in text
    assert doc["eagle_branch_live"] is True and doc["calls"][-1]["vllm_tokens"] == [18, 22]

    # Under the default scheme the mutant's re-floored branch never runs.
    code, text, _ = _run(["--vllm", "0.33.0", "--case", "seed_52419", "--mutant", "refloor_50062"],
                         tmp_path, capsys)
    assert code == Outcome.OK.exit_code and "vLLM [22, 22]" in text


def test_a_configuration_as_json_and_usage_errors(tmp_path, capsys):
    case = {"config": {"groups": [{"kind": "full_attention", "block_size": 2, "eagle": True},
                                  {"kind": "mamba_align", "block_size": 8}],
                       "scheduler_block_size": 8, "hash_block_size": 2},
            "prompt_len": 12, "steps": [{"kind": "prefill", "tokens": 12}, {"kind": "decode"}]}
    code, text, doc = _run(["--vllm", "0.28.0", "--config", json.dumps(case)], tmp_path, capsys)
    assert code == Outcome.OK.exit_code and doc["hash_scheme"] == "legacy" and len(doc["calls"]) == 2
    assert main(["run", "--vllm", "0.28.0", "--config", json.dumps(case), "--hash-scheme", "lookahead"]) \
        == Outcome.USAGE.exit_code
    assert main(["run", "--vllm", "0.33.0", "--case", "no_such_case"]) == Outcome.USAGE.exit_code


def test_deployment_profiles_derived_and_run(tmp_path, capsys):
    assert main(["run", "--vllm", "0.33.0", "--profiles"]) == Outcome.OK.exit_code
    text = capsys.readouterr().out
    assert text.count("called: engine_config, attention_block, layer_specs") >= 18
    assert "modelled: platform, layer_layout" in text
    code, text, doc = _run(["--vllm", "0.33.0", "--mutant", "refloor_50062", "--profile",
                            "qwen3-next+eagle3-kv8+pmu16", "--hash-scheme", "legacy"], tmp_path, capsys)
    assert code == Outcome.FINDING.exit_code and doc["profile"]["scheduler_block_size"] == 1120
    assert "manager" in doc["profile"]["called"] and doc["eagle_branch_live"] is True


def _engine_program(tokens: list[int]) -> dict:
    # A request, then a resend of its prompt, on the toy Llama with a failing
    # synchronous load from kvspec's own connector for the first.
    from kvspec.model.engine import EngineProgram, EngineSetup

    setup = EngineSetup("toy-llama", 40, block_size=16, kv_connector="KvspecConnector")
    load = {"offer": 60, "async": False, "delay": 0, "fail": 1}
    ops = ([{"do": "arrive", "id": "a", "tokens": tokens, "max_tokens": 3, "load": load}] + [{"do": "step"}] * 4
           + [{"do": "arrive", "id": "b", "tokens": tokens, "max_tokens": 2}] + [{"do": "step"}] * 3)
    return EngineProgram(setup, ops).as_dict()


def test_one_engine_program_through_the_scheduler(tmp_path, capsys):
    program = tmp_path / "program.json"
    program.write_text(json.dumps(_engine_program(list(range(100, 170)))))
    code, text, doc = _run(["--vllm", "0.34.0", "--engine-program", str(program)], tmp_path, capsys)
    assert code == Outcome.OK.exit_code, text
    # What vLLM built is read back, and each operation says what the scheduler did.
    assert "engine settings vLLM built and ran:" in text and "retention_interval: 0" in text
    assert "kv_connector: KvspecConnector" in text
    assert "  2. engine step; scheduled a: " in text and "lookups a hit 0" in text
    assert text.count("engine step") == 7 and "RESULT: no state invariant broken after any of the 9" in text
    assert doc["outcome"] == "OK" and len(doc["operations"]) == 9
    assert doc["engine_settings"]["retention_interval"] == 0  # 0.34.0's default: sparse

    # The same program on a mutant whose evict_blocks keeps a failed load's held blocks cached.
    code, text, doc = _run(["--vllm", "0.34.0", "--mutant", "evict_skips_held_blocks",
                            "--engine-program", str(program)], tmp_path, capsys)
    assert code == Outcome.FINDING.exit_code, text
    assert "BROKEN state_evicted_findable" in text and "RESULT: DISCREPANCY at operation" in text

    # A stored engine finding is read as its program; a broken one is a usage error.
    finding = tmp_path / "finding.json"
    finding.write_text(json.dumps({"inputs": {"engine_program": {"setup": {"model": "toy-llama"}}}}))
    assert main(["run", "--vllm", "0.34.0", "--engine-program", str(finding)]) == Outcome.USAGE.exit_code
    assert "not a valid engine program" in capsys.readouterr().err
