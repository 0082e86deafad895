"""The upstream script of an engine finding of any kind an engine test is
written for (``kvspec report --upstream``), without vLLM: written around the
same rendered check the finding's engine test makes (one rendering,
``kvspec.emit.engine_test.rule_check``), saying the rule broken (Expected)
and what vLLM did (Actual), exiting 1 then and 0 when the rule holds; judged
reproduced only on the rule's own assertion."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import attrs
import pytest

from tests.support import assert_ruff_clean_as_vllm_lints, engine_findings_of_every_kind
from kvspec.emit.engine_test import engine_test_code, rule_check
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding
from kvspec.model.outcome import Outcome
from kvspec.report.upstream import render_upstream
from kvspec.subjects import upstream_repro
from kvspec.subjects.upstream_repro import UPSTREAM_KINDS, ReproRun, Unscriptable, repro_script, run_repro

FIXTURES = Path(__file__).parent.parent / "fixtures"
HIT_GROUPS = FIXTURES / "finding_engine_second_full_attention_group_eagle_0.27.1.json"
RULE_KINDS = [(kind, finding) for kind, finding in engine_findings_of_every_kind() if finding.category not in UPSTREAM_KINDS]


def _rule_script(finding: Finding, version: str = "0.34.0"):
    program = EngineProgram.from_dict(finding.inputs["engine_program"])
    settings = finding.run["engine_settings"]
    rule = rule_check(program, settings, finding.category, finding.detail)
    return rule, repro_script(program, settings, finding.category, version, rule)


@pytest.mark.parametrize("kind, finding", RULE_KINDS, ids=[kind for kind, _ in RULE_KINDS])
def test_the_script_makes_the_engine_tests_own_check(kind, finding):
    """One rendering of the rule's check: the script and the engine test hold
    the same functions and drive the inputs under them by the same lines."""
    rule, script = _rule_script(finding)
    test = engine_test_code(finding, "0.34.0")
    assert rule.rule and rule.code in script.code and rule.code in test
    assert f"def check_rule(scheduler):\n{_docstring_of(script.code)}{rule.body}\n" in script.code
    assert f"def {rule.name}(tmp_path):\n    scheduler = make_scheduler(str(tmp_path))\n{rule.body}\n" in test
    assert script.rule == rule.rule and script.marker == "Actual: " and script.kind is finding.category
    assert f"Expected: {rule.rule[:40]}" in " ".join(script.code.split('"""')[1].split())  # said at the top
    assert "kvspec" not in script.code.split('"""', 2)[2]


def _docstring_of(code: str) -> str:
    start = code.index("def check_rule(scheduler):\n") + len("def check_rule(scheduler):\n")
    return code[start:code.index('"""\n', code.index('"""', start) + 3) + 4]


@pytest.mark.parametrize("kind, finding", RULE_KINDS, ids=[kind for kind, _ in RULE_KINDS])
def test_every_rule_script_passes_ruff_check_and_format_under_vllms_configuration(tmp_path, kind, finding):
    code = _rule_script(finding)[1].code
    compile(code, "repro.py", "exec")
    assert_ruff_clean_as_vllm_lints(code, tmp_path, "repro.py")


def test_the_hit_groups_script_says_the_rule_in_vllms_words():
    finding = Finding.from_dict(json.loads(HIT_GROUPS.read_text()))
    rule, script = _rule_script(finding, "0.27.1")
    assert rule.rule == "each KV cache group must hold cdiv(num_computed_tokens, block_size) hit blocks"
    assert f'EXPECTED = (\n    "{rule.rule}"\n)' in script.code
    assert "    watch_lookups(scheduler)\n    drive(scheduler, OPS)\n" in script.code
    assert "pip install vllm==0.27.1 && python repro.py" in script.code


def test_a_rule_script_is_written_only_around_its_own_kinds_check():
    finding = attrs.evolve(Finding.from_dict(json.loads(HIT_GROUPS.read_text())), category=Category.STATE_HASH_MAP)
    program = EngineProgram.from_dict(finding.inputs["engine_program"])
    settings = finding.run["engine_settings"]
    leak = rule_check(program, settings, Category.STATE_LEAK)
    with pytest.raises(Unscriptable, match="no upstream reproduction script is available for state_hash_map"):
        repro_script(program, settings, Category.STATE_HASH_MAP, "0.27.1", leak)


def _fake_run(monkeypatch, tmp_path, returncode: int, stdout: str, stderr: str) -> None:
    import kvspec.subjects.provision as provision

    monkeypatch.setattr(provision, "ensure_runtime", lambda: tmp_path / "runtime" / "bin" / "python")
    monkeypatch.setattr(provision, "ensure_release", lambda version: tmp_path / "release")
    monkeypatch.setattr(upstream_repro.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a[0], returncode, stdout, stderr))


def test_a_rule_script_reproduces_only_on_its_rules_assertion(monkeypatch, tmp_path):
    """Reproduced: exit 1, the rule's own assertion, Actual said last.  vLLM's
    own bare assert, or an exit 0 that ran the inputs to their end, is not."""
    finding = Finding.from_dict(json.loads(HIT_GROUPS.read_text()))
    rule, script = _rule_script(finding, "0.27.1")
    failed = (f"Traceback (most recent call last):\nAssertionError: {rule.rule}: request r2: group 4 returned 2 "
              f"blocks for a hit of 0 tokens\nExpected: {rule.rule}\nActual: request r2: group 4 returned 2 blocks "
              "for a hit of 0 tokens\n")
    _fake_run(monkeypatch, tmp_path, 1, "", failed)
    run = run_repro(script, None)
    assert run.reproduced and not run.ran_clean and run.tail.endswith("for a hit of 0 tokens")
    for other in ("Traceback (most recent call last):\nAssertionError\n",
                  f"AssertionError\nExpected: {rule.rule}\nActual: AssertionError\n"):
        _fake_run(monkeypatch, tmp_path, 1, "", other)  # vLLM's own bare assert is not the rule's
        assert not run_repro(script, None).reproduced
    assert "if not str(error).startswith(EXPECTED):\n            raise" in script.code
    noisy = f"{tmp_path / 'runtime'}/lib/python3.11/site-packages/requests/__init__.py:92: Warning\n"
    _fake_run(monkeypatch, tmp_path, 0, "no failure: the finding did not reproduce\n", noisy)
    clean = run_repro(script, None)
    assert clean.ran_clean and not clean.reproduced and clean.returncode == 0
    assert str(tmp_path) not in clean.tail  # no machine-local path, the runtime's neither
    _fake_run(monkeypatch, tmp_path, 0, "", "")
    assert not run_repro(script, None).ran_clean  # exit 0 without running to its end is not clean


def test_the_report_shows_the_rule_and_both_sides():
    from kvspec.model.known import known_bugs

    finding = Finding.from_dict(json.loads(HIT_GROUPS.read_text()))
    (bug,) = [b for b in known_bugs("0.27.1", finding.category, finding.detail)
              if b.name == "second_full_attention_group_untrimmed"]
    script = _rule_script(finding, "0.27.1")[1]
    run = ReproRun(True, 1, f"Expected: {script.rule}\nActual: request r2: group 4 returned 2 blocks", 50.0,
                   "python repro.py in a fresh process on vLLM 0.27.1")
    fixed = ReproRun(False, 0, "no failure: the finding did not reproduce", 50.0,
                     "python repro.py in a fresh process on vLLM 0.29.0", True)
    text = render_upstream(finding, known=bug, script=script, run=run, fixed_run=fixed)
    assert "**reproduced**, exit status 1" in text and "```python" in text
    assert "On vLLM 0.29.0, the first release without the bug, kvspec ran the same script" in text
    assert "**ran clean**, exit status 0" in text
    assert "- Expected: Each KV cache group must hold cdiv(num_computed_tokens, block_size) hit blocks." in text
    unclean = attrs.evolve(fixed, returncode=1, ran_clean=False)
    assert "**did not run clean**, exit status 1" in render_upstream(finding, known=bug, script=script, run=run,
                                                                     fixed_run=unclean)


def test_a_finding_whose_engine_test_is_not_written_has_no_script_exit_2(tmp_path, capsys):
    """hit_length's test is written for one full-attention group: on the
    hybrid layout the CLI says why in one line, before anything runs."""
    from kvspec.cli import main

    doc = json.loads(HIT_GROUPS.read_text())
    doc["category"] = Category.STATE_HIT_LENGTH.value
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    assert main(["report", "--upstream", str(path), "--output", str(tmp_path / "r.md")]) == Outcome.USAGE.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no upstream reproduction script, as no engine test is written" in err[0], err
    assert not (tmp_path / "r.md").exists()
