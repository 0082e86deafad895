"""`kvspec fuzz` on real and broken subjects: verdicts, exit codes, JSON."""

from __future__ import annotations

import json
import shutil

import pytest

from kvspec.cli import main
from kvspec.model.outcome import Outcome
from kvspec.subjects.provision import ensure_release

from tests.support import assert_no_discrepancy_but_known, planted_tree

REGIME_LINE = "        self.enable_partial_hash_hits = (\n"


def test_silently_disabled_partial_hits_is_a_regime_mismatch(tmp_path):
    # vLLM's derivation is short-circuited to False: the model still derives True.
    tree = tmp_path / "regime"
    shutil.copytree(ensure_release("0.33.0"), tree)
    target = tree / "vllm" / "v1" / "core" / "kv_cache_coordinator.py"
    text = target.read_text()
    assert text.count(REGIME_LINE) == 1
    target.write_text(text.replace(REGIME_LINE, "        self.enable_partial_hash_hits = False and (\n"))
    code, doc = run(["--vllm-src", str(tree), "--max-examples", "300"], tmp_path)
    assert code == Outcome.FINDING.exit_code
    finding = doc["subjects"][0]["finding"]
    assert finding["category"] == "regime_mismatch"
    assert "vLLM chose False" in finding["detail"]
    assert finding["ledger"]["blame"] == "undetermined"


def run(args, tmp_path):
    out = tmp_path / "fuzz.json"
    # Each test its own example database: a failure saved by one must not
    # decide what another reports first.
    code = main(["fuzz", "--seed", "1", "--findings-dir", str(tmp_path / "findings"),
                 "--database", str(tmp_path / "examples"), "--json", str(out), *args])
    return code, json.loads(out.read_text())


def test_clean_release_json(tmp_path):
    code, doc = run(["--vllm", "0.33.0", "--max-examples", "50"], tmp_path)
    assert code == Outcome.OK.exit_code
    assert doc["schema"] == "kvspec.fuzz/4" and doc["status"] == "COMPLETE"
    (subject,) = doc["subjects"]
    assert_no_discrepancy_but_known(subject)
    assert subject["cases"] >= 50
    assert subject["capabilities"]["partial_hash_hits"] is True


def test_vllm_exception_is_a_finding_with_traceback(tmp_path):
    tree = planted_tree(tmp_path, "if num_computed_tokens > 5: raise RuntimeError('planted')")
    code, doc = run(["--vllm-src", str(tree), "--max-examples", "200"], tmp_path)
    assert code == Outcome.FINDING.exit_code
    finding = doc["subjects"][0]["finding"]
    assert finding["category"] == "subject_crash"
    assert "RuntimeError: planted" in finding["traceback"]
    assert list((tmp_path / "findings").glob("finding-*.json"))


def test_worker_death_is_a_finding_and_other_subjects_still_run(tmp_path):
    tree = planted_tree(tmp_path, "import os; os._exit(3)")
    code, doc = run(["--vllm-src", str(tree), "--vllm", "0.33.0", "--max-examples", "30"], tmp_path)
    assert code == Outcome.FINDING.exit_code
    by_kind = {s["subject"]["kind"]: s for s in doc["subjects"]}
    dead, alive = by_kind["source"], by_kind["release"]
    assert dead["finding"]["category"] == "subject_crash"
    assert "worker exited (exit 3) during the case, again on a fresh worker" in dead["finding"]["detail"]
    assert_no_discrepancy_but_known(alive)


def test_broken_checkout_is_a_setup_error(tmp_path, capsys):
    broken = tmp_path / "checkout"
    (broken / "vllm").mkdir(parents=True)
    (broken / "vllm" / "__init__.py").write_text("raise ImportError('half-built checkout')\n")
    code, doc = run(["--vllm-src", str(broken)], tmp_path)
    assert code == Outcome.USAGE.exit_code
    assert "half-built checkout" in doc["errors"][0]["error"]
    assert "cannot import" in capsys.readouterr().out


def test_release_before_023_is_unsupported(tmp_path, capsys):
    code, doc = run(["--vllm", "0.22.0", "--max-examples", "5"], tmp_path)
    assert code == Outcome.USAGE.exit_code
    assert "unsupported, because KVCacheManager takes no scheduler_block_size" in doc["errors"][0]["error"]


@pytest.mark.parametrize("args, message", [
    ([], "name a subject"),
    (["--vllm-src", "/nonexistent"], "no vllm package under /nonexistent"),
    (["--vllm", "0.33.0", "--mutant", "no_such_rule"], "unknown mutation operator 'no_such_rule'"),
    (["--current", "--mutant", "refloor_50062"], "--mutant applies to a release: add --vllm VERSION"),
])
def test_usage_errors(args, message, capsys):
    assert main(["fuzz", *args]) == Outcome.USAGE.exit_code
    assert message in capsys.readouterr().err


def test_mutant_option_finding_report_replay_and_regression_test(tmp_path, capsys):
    """The acceptance run: `kvspec fuzz --vllm 0.33.0 --mutant refloor_50062`
    fuzzes the release as the control (clean), then the #50062 mutant; the
    finding carries its explanation, ledger, plot and what vLLM's own tests
    say: 0.33.0's test of #50062 already fails on the mutant and passes on
    the release, so the report names it and proposes no test of its own; the
    test kvspec emitted (stored, in vLLM's idiom) still fails on the mutant
    (on its assertion), passes on the release and passes ruff with the
    release's configuration; the Markdown leads with the impact and shows no
    local path; replay tells them apart."""
    import re

    from kvspec.model.about import SCHEMAS
    from kvspec.emit.regression_test import ASSERT_MESSAGE

    markdown = tmp_path / "report.md"
    code, doc = run(["--vllm", "0.33.0", "--mutant", "refloor_50062", "--max-examples", "300",
                     "--markdown", str(markdown)], tmp_path)
    assert code == Outcome.FINDING.exit_code
    release_run, mutant_run = doc["subjects"]
    assert release_run["subject"]["label"] == "vllm 0.33.0"
    assert_no_discrepancy_but_known(release_run)
    assert mutant_run["subject"]["label"] == "vllm 0.33.0 + refloor_50062"
    finding = mutant_run["finding"]
    assert finding["schema"] == SCHEMAS["finding"]
    assert finding["compared"]["mutant"]["operator"] == "refloor_50062"
    assert finding["ledger"]["blame"] == "implementation bug"
    assert finding["explanation"]["diagnosis"] == "regression_50062"
    lost = [g for g in finding["groups"] if g["expected_tokens"] != g["observed_tokens"]]
    assert lost and all(g["eagle"] and g["observed_tokens"] < g["expected_tokens"] for g in lost)
    # The proved closed form predicts exactly the loss the real code showed.
    assert finding["explanation"]["loss_predicted"] == finding["explanation"]["loss_observed"] > 0
    assert {t["status"] for t in finding["explanation"]["theorems"]} == {"PROVED"}
    # Who is affected: the deployment profiles where the re-floor differs, each
    # derived by 0.33.0's own configuration code (kvspec.reach).
    reach = finding["reach"]
    assert reach["profiles"] and not reach["hardening"]
    assert {p["hash_scheme"] for p in reach["profiles"]} == {"legacy"}  # 0.33's default never runs it
    for profile in reach["profiles"]:
        assert {"groups", "block_sizes", "manager"} <= set(profile["derivation"]["called"])
        assert profile["impact"]["max_tokens_lost"] > 0
    assert reach["worst"]["hitrate"]["points"] < 0
    # Looked for through vLLM's engine as a stateful finding is: on the toy
    # Qwen3-Next with an EAGLE3 drafter (its group a block unlike the others)
    # vLLM's real Scheduler registers less than the bound, and the loss is
    # measured there: a resend hits less than on the unmutated release.
    engine = finding["inputs"]["engine_reproduction"]
    assert engine["status"] == "reproduced" and engine["target"]["category"] == "under_registration"
    assert engine["describe"].startswith("toy-qwen3-next-eagle3 ") and "--prefix-match-unit" in engine["describe"]
    assert reach["summary"].startswith("reachable through vLLM's scheduler with settings")
    impact = finding["impact"]
    assert impact["kind"] == "hit_lost" and impact["measured"] < impact["expected"], impact
    assert "toy-qwen3-next-eagle3" in impact["summary"] and "unmutated vllm 0.33.0" in impact["summary"]
    assert any(k.startswith("hash scheme: reached only with legacy") for k in finding["explanation"]["knobs"])
    assert doc["subjects"][1]["hash_schemes"]["fuzzed"] == ["legacy", "lookahead"]
    # The emitted test uses vLLM 0.33.0's own helpers, fails on the mutant on
    # its assertion, passes on 0.33.0, and passes ruff with 0.33.0's configuration.
    test = finding["regression_test"]
    assert test["idiom"]["helpers"] == "tests.v1.core.test_prefix_caching"
    # The licence header is the release's own, read from its test files (kvspec carries none).
    assert test["idiom"]["header"] and test["code"].startswith(test["idiom"]["header"][0] + "\n")
    assert "from tests.v1.core.test_prefix_caching import make_kv_cache_manager" in test["code"]
    assert not re.search(r"kvspec|refloor|mutant", test["code"], re.IGNORECASE)
    # vLLM's own tests were asked first: 0.33.0 already has #50062's test.
    asked = finding["vllm_tests"]
    catcher = ("tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py::"
               "test_eagle_group_registers_unaligned_tail_under_partial_hash_hits")
    assert asked["caught_by"][0] == catcher, asked["caught_by"]
    assert asked["baseline"]["outcome"] == "passed" and asked["subject"]["tests"] == asked["baseline"]["tests"]
    assert test["proposed"] is False and test["verified"] == [] and test["lint"] is None
    # The stored test is right all the same: it fails on the mutant on its
    # assertion, passes on 0.33.0 and passes ruff with 0.33.0's configuration.
    from kvspec.findings.completion import lint_test, verify_test
    from kvspec.emit.vllm_tests import tests_root_of
    from kvspec.subjects.subject import mutant_subject

    mutant = mutant_subject("0.33.0", "refloor_50062")
    checks = {c["must"]: c for c in verify_test(test["code"], test["file_name"], mutant, tests_root_of(mutant))}
    assert checks["failed"]["as_expected"] and checks["passed"]["as_expected"], checks
    assert f"AssertionError: {ASSERT_MESSAGE}" in checks["failed"]["output"]
    lint = lint_test(test["code"], test["file_name"], mutant, tests_root_of(mutant))
    assert lint["outcome"] == "passed", lint["output"]
    assert test["command"].startswith("pytest tests/v1/core/test_prefix_cache_registration.py::test_")
    text = markdown.read_text()
    # The impact sentence is the loss measured through the engine; who is
    # affected (the worst deployment profile) follows in the report.
    assert text.startswith("**Impact:** Measured at the finding's engine configuration (toy-qwen3-next-eagle3 ")
    assert "prompt tokens recomputed" in text.split("\n", 1)[0]
    assert "regression_50062 reaches 1 of 18 deployment profiles" in text
    assert "\n## kvspec fuzz: DISCREPANCY (implementation bug)" in text
    for expected in ("**Ledger verdict: implementation bug**", "(n-R) mod S - B",
                     "Reachability (PROVED)", "kvspec replay ", f"Already caught by {catcher}",
                     f"pytest '{catcher}'", "not proposed", "<summary>Glossary</summary>"):
        assert expected in text, expected
    # No duplicate offered: neither kvspec's test nor its pytest command.
    assert f"def {test['test_name']}" not in text and test["command"] not in text
    assert str(tmp_path) not in text and not re.findall(r"(?<![\w.:/<)-])(?:/|~/)[\w.-]+/\S*", text)
    stored = tmp_path / "findings"
    (finding_file,) = stored.glob("finding-*.json")
    (plot,) = stored.glob("finding-*.svg")
    (png,) = stored.glob("finding-*.png")
    assert f"]({png.name})" in text  # embedded by artifact name: the findings dir is not below the cwd
    assert "tokens registered" in plot.read_text() and png.read_bytes().startswith(b"\x89PNG")
    # The picture shows the loss: the sweep covers the finding's own length
    # (real sizes: S = 1,120 here) and lengths where tokens are lost.
    sweep = finding["sweep"]
    assert sweep["n"][0] <= finding["n"] <= sweep["n"][-1] and sweep["differing_n"], sweep["differing_n"]
    capsys.readouterr()
    assert main(["replay", str(finding_file)]) == Outcome.FINDING.exit_code
    assert "STILL FAILING" in capsys.readouterr().out
    # The release never had the mutation: "not affected", not "fixed".
    assert main(["replay", str(finding_file), "--vllm", "0.33.0"]) == Outcome.OK.exit_code
    out = capsys.readouterr().out
    assert "NOT AFFECTED" in out and "FIXED" not in out


def test_replay_rejects_other_files(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text('{"schema": "something/1"}')
    assert main(["replay", str(other)]) == Outcome.USAGE.exit_code
    assert "is not a kvspec finding or result" in capsys.readouterr().err
    empty = tmp_path / "prove.json"
    empty.write_text('{"schema": "kvspec.prove/1", "findings": []}')
    assert main(["replay", str(empty)]) == Outcome.USAGE.exit_code
    assert "holds no finding" in capsys.readouterr().err


def test_emitted_tests_run_outside_the_surrounding_project_config(tmp_path):
    """Findings are stored under the working directory by default, often a
    project whose pytest configuration the vLLM runtime cannot parse (kvspec's
    own adds --kvspec-profile): the regression-test check must not inherit it."""
    from kvspec.subjects.subject import release
    from kvspec.subjects.testrun import run_pytest

    project = tmp_path / "project"
    findings = project / ".kvspec" / "findings"
    findings.mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = ["--an-option-only-a-plugin-knows"]\n')
    test = findings / "test_vllm_imports.py"
    test.write_text("def test_vllm_imports():\n    import vllm.v1.core.kv_cache_manager\n")
    outcome = run_pytest(release("0.33.0"), str(test))
    assert outcome["outcome"] == "passed", outcome
