"""``kvspec report --upstream``'s rendering and its script generator, without
vLLM: untrusted text stays text, the script is written from validated fields
only, and a finding kvspec has no script for is one clear line (exit 2)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import attrs
import pytest

from tests.support import assert_ruff_clean_as_vllm_lints
from kvspec.model.case import InvalidCase
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding
from kvspec.model.known import known_bugs
from kvspec.model.outcome import Outcome
from kvspec.report.upstream import render_upstream
from kvspec.subjects.upstream_repro import ReproRun, Unscriptable, repro_script

FIXTURES = Path(__file__).parent.parent / "fixtures"
FIXTURE = FIXTURES / "finding_engine_mamba_estimate_0.34.0.json"
HOSTILE = "<img src=x onerror=alert(1)> [click](https://evil.example) ``` `x` \x1b[31m| ![i](j)"


def _doc() -> dict:
    return json.loads(FIXTURE.read_text())


def _finding(doc: dict | None = None) -> Finding:
    return Finding.from_dict(doc or _doc())


def _script(finding: Finding):
    program = EngineProgram.from_dict(finding.inputs["engine_program"])
    return repro_script(program, finding.run["engine_settings"], finding.category, "0.34.0")


def test_the_script_carries_the_findings_settings_and_inputs_and_nothing_of_kvspec():
    finding = _finding()
    script = _script(finding)
    compile(script.code, "repro.py", "exec")
    assert "kvspec" not in script.code.split('"""', 2)[2]  # the docstring may say who wrote it; the code imports none
    assert "NUM_BLOCKS = 22" in script.code and "ASYNC_SCHEDULING = True" in script.code
    # Each Mamba group with the prefill checkpoint vLLM's Mamba2 layer gave its spec.
    assert script.code.count('("mamba_align", 64, 0, 1, 1, 1)') == 2
    assert '("full_attention", 64, 0, 1, 0, None)' in script.code
    assert '    # add_request: 65 prompt tokens, max_tokens 1\n    ("arrive", "r0", list(range(0, 65)), 1),' \
        in script.code
    assert '    # one engine step, as EngineCore.step / step_with_batch_queue\n    ("step",),' in script.code
    assert "# The engine flags: vllm serve MODEL --num-gpu-blocks-override 22 --max-model-len 256" \
        in script.code
    assert "pip install vllm==0.34.0 && python repro.py" in script.code
    assert "engine's KV-cache planning" in script.code  # the hand-built KVCacheConfig is said


def test_a_crash_script_lets_schedules_exception_end_it():
    finding = attrs.evolve(_finding(), category=Category.SUBJECT_CRASH)
    script = _script(finding)
    assert "CHECK_ESTIMATE = False" in script.code and "What vLLM 0.34.0 derived" in script.code
    assert _script(_finding()).code.count("CHECK_ESTIMATE = True") == 1


def test_no_string_of_the_file_reaches_the_script():
    doc = _doc()
    doc["detail"] = HOSTILE
    doc["inputs"]["how_a_user_reaches_it"] = HOSTILE
    doc["run"]["engine_settings"]["scheduler_class"] = HOSTILE
    assert "onerror" not in _script(_finding(doc)).code
    for field, value in [("kind", "full_attention'); import os; os.system('x"), ("block_size", "64"),
                         ("layers", True)]:
        bad = _doc()
        bad["run"]["engine_settings"]["groups"][0][field] = value
        with pytest.raises(Unscriptable):
            _script(_finding(bad))
    bad = _doc()
    bad["inputs"]["engine_program"]["ops"][0]["id"] = "r0'); import os; ('"
    with pytest.raises(InvalidCase, match="plain name"):  # the engine program's own validation
        _script(_finding(bad))
    bad = _doc()
    bad["run"]["engine_settings"]["kv_connector"] = "Evil"
    with pytest.raises(Unscriptable):
        _script(_finding(bad))


@pytest.mark.parametrize("category", [Category.HIT_MISMATCH, Category.LOOKUP_CONTRACT, Category.STATE_HASH_MAP])
def test_another_kind_has_no_script_yet(category):
    """A kind no engine test is written for has no script; one that has
    (hash_map) gets its script only around its test's check (RuleCheck)."""
    finding = attrs.evolve(_finding(), category=category)
    with pytest.raises(Unscriptable, match=f"no upstream reproduction script is available for {category.value}"):
        _script(finding)


def test_the_cli_says_so_in_one_line_with_exit_2(tmp_path, capsys):
    from kvspec.cli import main

    doc = _doc()
    doc["category"] = Category.HIT_MISMATCH.value
    doc["detail"] = "hit_mismatch: " + doc["detail"]
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    assert main(["report", "--upstream", str(path), "--output", str(tmp_path / "r.md")]) == Outcome.USAGE.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no upstream reproduction script is available for hit_mismatch" in err[0]
    assert not (tmp_path / "r.md").exists()


def test_the_mamba_spec_is_built_with_the_prefill_checkpoint_vllm_built():
    """The scheduler splits a Mamba prefill at block boundaries unless the
    layer's spec declares prefill checkpoint blocks (MambaMixer2 does from
    0.32): a spec built without them scheduled mamba_state_slot_nulled's
    finding otherwise than the engine did (its test passed on the mutant)."""
    code = _script(_finding()).code
    assert "num_prefill_checkpoint_blocks=checkpoint_blocks," in code
    assert "prefill_checkpoint_alignment=checkpoint_alignment," in code
    assert "spec(kind, block, window, *checkpoint)" in code
    doc = _doc()
    for group in doc["run"]["engine_settings"]["groups"][:2]:
        group.update(prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)
    assert _script(_finding(doc)).code.count('("mamba_align", 64, 0, 1, 0, None)') == 2


@pytest.mark.parametrize("field, value", [("prefill_checkpoint_blocks", None), ("prefill_checkpoint_blocks", "1"),
                                          ("prefill_checkpoint_alignment", 0), ("prefill_checkpoint_alignment", True)])
def test_a_mamba_groups_checkpoint_is_a_validated_number(field, value):
    doc = _doc()
    doc["run"]["engine_settings"]["groups"][0][field] = value
    with pytest.raises(Unscriptable, match=field):
        _script(_finding(doc))


def test_a_mamba_group_without_its_recorded_checkpoint_gets_no_script():
    """Settings recorded before the checkpoint was: guessing it would make the
    script schedule otherwise than the engine, silently."""
    doc = _doc()
    del doc["run"]["engine_settings"]["groups"][1]["prefill_checkpoint_blocks"]
    with pytest.raises(Unscriptable, match="prefill checkpoint .* rerun `kvspec fuzz --engine`"):
        _script(_finding(doc))
    attention_only = _doc()
    settings = attention_only["run"]["engine_settings"]
    settings.update(groups=settings["groups"][2:], mamba_cache_mode=None)
    assert '("full_attention", 64, 0, 1, 0, None)' in _script(_finding(attention_only)).code


def test_a_finding_without_engine_settings_says_how_to_get_them():
    doc = _doc()
    doc["run"]["engine_settings"] = None
    with pytest.raises(Unscriptable, match="records no engine settings"):
        _script(_finding(doc))


def _run(reproduced: bool, tail: str = "AssertionError: block estimate below allocation: ...") -> ReproRun:
    return ReproRun(reproduced, 1 if reproduced else 0, tail, 20.0, "python repro.py in a fresh process")


def test_the_report_escapes_every_field_of_the_file():
    doc = _doc()
    doc["detail"] = "block_estimate: " + HOSTILE
    doc["compared"]["subject"]["version"] = "0.34.0"
    doc["run"]["engine_settings"]["kv_connector"] = HOSTILE
    finding = _finding(doc)
    text = render_upstream(finding, known=None, script=_script(_finding()), run=_run(True, tail=HOSTILE))
    assert "\x1b" not in text
    # The output tail sits in a fence no line of it can close (inside one, nothing is interpreted) ...
    assert "````\n<img src=x" in text and "| ![i](j)\n````" in text
    # ... and outside fences every field is inert text.
    prose = re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1$", "", text)
    assert "<img" not in prose and not re.search(r"(?<!\\)\]\(https://evil", prose)
    assert "&lt;img" in prose and "\\[click\\]" in prose


def test_the_report_follows_vllms_bug_form_and_names_the_known_bug():
    finding = _finding()
    (bug,) = known_bugs("0.34.0", finding.category, finding.detail)
    text = render_upstream(finding, known=bug, script=_script(finding), run=_run(True))
    sections = ["## Your current environment", "## 🐛 Describe the bug", "### Reproduction",
                "### Expected vs actual", "### Who is affected, with which settings", "### Suggested fix"]
    assert [text.index(s) for s in sections] == sorted(text.index(s) for s in sections)
    assert text.startswith("# [Bug]: Mamba group's block estimate")
    assert "`pip install vllm==0.34.0 && python repro.py`" in text
    assert "**reproduced**, exit status 1" in text and "```python" in text
    assert "PR #46892" in text and "mamba_estimate_below_allocation_after_connector_load" in text
    assert "`vllm serve MODEL --num-gpu-blocks-override 22 --max-model-len 256 --kv-transfer-config" in text
    assert "a toy model of the Nemotron-H (Mamba2 hybrid) family" in text


def test_a_script_that_did_not_reproduce_is_not_offered():
    finding = _finding()
    text = render_upstream(finding, known=None, script=_script(finding), run=_run(False, "no failure"))
    assert "did **not** reproduce, so it is not offered" in text and "```python" not in text
    assert "**did not reproduce**, exit status 0" in text
    assert "None suggested" in text


def test_the_fixture_is_a_small_engine_finding():
    doc = copy.deepcopy(_doc())
    assert doc["category"] == "state_block_estimate" and doc["run"]["engine_settings"]["vllm_version"] == "0.34.0"
    assert FIXTURE.stat().st_size < 16_000


@pytest.mark.parametrize("subject", [{"kind": "mutant", "version": "0.34.0", "mutant": "refloor_50062"},
                                     {"kind": "source", "version": "0.35.0.dev1", "path": "vllm"}])
def test_only_a_published_release_gets_an_upstream_report(tmp_path, capsys, subject):
    from kvspec.cli import main

    doc = _doc()
    doc["compared"]["subject"] = {**doc["compared"]["subject"], **subject}
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    assert main(["report", "--upstream", str(path)]) == Outcome.USAGE.exit_code
    assert "published release" in capsys.readouterr().err


@pytest.mark.parametrize("toy", ["toy-nemotron-h", "toy-qwen3-next-eagle3"])
@pytest.mark.parametrize("tokens", [list(range(0, 65)), [(i * 7919) % 1000 for i in range(60)], [5, 3]],
                         ids=["range", "long list", "short list"])
def test_the_script_passes_ruff_check_and_format_under_vllms_configuration(tmp_path, tokens, toy):
    """What ``kvspec report --upstream`` offers is clean and laid out as vLLM's
    own code is (ruff check and ruff format, vLLM's configuration), whatever
    the prompt's tokens and however long the toy model's family name."""
    doc = _doc()
    doc["inputs"]["engine_program"]["engine"]["model"] = toy
    ops = doc["inputs"]["engine_program"]["ops"]
    arrive = next(op for op in ops if op["do"] == "arrive")
    arrive["tokens"] = tokens
    ops.append({"do": "abort", "id": arrive["id"]})
    ops.append({"do": "reset"})
    code = _script(_finding(doc)).code
    compile(code, "repro.py", "exec")
    assert_ruff_clean_as_vllm_lints(code, tmp_path, "repro.py")

