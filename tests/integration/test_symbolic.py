"""The symbolic leg: vLLM's own get_num_cacheable_tokens against the subject (CrossHair)."""

from __future__ import annotations

import json

import pytest

from kvspec.cli import main
from kvspec.model.outcome import Outcome
from kvspec.pytest_plugin import DEFAULT_RELEASES as SUPPORTED_IN_CI
from kvspec.subjects.subject import mutant_subject, release, source_tree
from kvspec.subjects.symbolic import SymbolicStatus, symbolic_check

from tests.support import mutant_tree

# 0.32+ keep the rule in get_num_cacheable_tokens, 0.28-0.31 inline in cache_blocks.
TARGETS = {"0.33.0": "HybridKVCacheCoordinator.get_num_cacheable_tokens",
           "0.28.0": "HybridKVCacheCoordinator.cache_blocks"}


@pytest.mark.parametrize("version", SUPPORTED_IN_CI)
def test_release_code_is_verified_against_the_spec(version):
    verdict = symbolic_check(release(version))
    assert verdict.status is SymbolicStatus.VERIFIED, verdict
    assert verdict.target == TARGETS[version]
    assert verdict.paths > 0 and verdict.abstracted  # what was abstracted is stated


@pytest.mark.parametrize("version", SUPPORTED_IN_CI)
def test_the_50062_mutant_is_refuted_and_the_counterexample_replays(version):
    verdict = symbolic_check(mutant_subject(version, "refloor_50062"))
    assert verdict.status is SymbolicStatus.REFUTED, verdict
    cx = verdict.counterexample
    assert cx["args"]["eagle"] is True and cx["args"]["partial"] is True
    # The real KVCacheManager, driven normally, shows the same loss.
    assert cx["replay"]["confirmed"] and "under_registration" in cx["replay"]["discrepancies"][0]


def test_prove_gains_the_real_code_rows_and_exit_codes(tmp_path, capsys):
    tree = mutant_tree("0.33.0", "refloor_50062")
    out = tmp_path / "prove.json"
    code = main(["prove", "--quiet", "--theorem", "lemma.div_bounds", "--vllm-src", str(tree),
                 "--json", str(out)])
    assert code == Outcome.FINDING.exit_code
    assert "REFUTED HybridKVCacheCoordinator.get_num_cacheable_tokens" in capsys.readouterr().out
    (row,) = json.loads(out.read_text())["real_code"]
    assert row["status"] == "REFUTED"


def test_a_coordinator_without_the_52419_shape_is_unsupported_with_the_reason(tmp_path, capsys):
    # A stand-in package (not vLLM's algorithm): a coordinator with none of the
    # code the harness drives must get "unsupported", never a verdict.
    core = tmp_path / "vllm" / "v1" / "core"
    core.mkdir(parents=True)
    for package in (tmp_path / "vllm", tmp_path / "vllm" / "v1", core):
        (package / "__init__.py").write_text("")
    (core / "kv_cache_coordinator.py").write_text("class HybridKVCacheCoordinator:\n    pass\n")
    verdict = symbolic_check(source_tree(str(tmp_path)))
    assert verdict.status is SymbolicStatus.UNSUPPORTED and "cache_blocks" in verdict.detail
    code = main(["prove", "--quiet", "--theorem", "lemma.div_bounds", "--vllm-src", str(tmp_path)])
    assert code == Outcome.USAGE.exit_code
    assert "UNSUPPORTED" in capsys.readouterr().out


def test_kill_matrix_columns_for_an_equivalent_and_an_out_of_scope_mutant():
    from kvspec.usecases.mutants import kill_matrix

    rows = {r.name: r.as_dict() for r in kill_matrix(
        "0.33.0", max_examples=300, seed=0,
        names=["clamp_as_conditional", "reprefillable_off_by_one"], symbolic=True)}
    # An equivalent rewrite: every technique agrees it is equivalent, none kills it.
    eq = rows["clamp_as_conditional"]
    assert (eq["model"], eq["status"], eq["exhaustive"], eq["symbolic"]) == (
        "equivalent", "equivalent", "equivalent", "verified-equivalent")
    # reprefillable_off_by_one rewrites __init__, which the symbolic harness
    # never runs: "verified" there would be for the wrong reason.
    out = rows["reprefillable_off_by_one"]
    assert out["status"] == "killed" and out["exhaustive"] == "killed"
    assert out["symbolic"] == "out of scope" and out["mutated_method"].endswith("__init__")


def test_the_ledgers_fourth_leg_locates_a_bug_outside_the_method(tmp_path):
    # Fuzzing finds the off-by-one in __init__; the symbolic leg verifies the
    # method itself, so the report can say the bug is in the code around it.
    from kvspec.diff_tests.fuzz import fuzz_subject
    from kvspec.findings.completion import complete_finding
    from kvspec.subjects.process import SubjectProcess

    with SubjectProcess(mutant_subject("0.33.0", "reprefillable_off_by_one")) as proc:
        result = fuzz_subject(proc, max_examples=300, seed=0)
        finding, _ = complete_finding(proc, result, tmp_path, {"kvspec": "test"}, verify=False)
    assert finding.ledger.blame.value == "implementation bug"
    assert finding.ledger.real_code["status"] == "VERIFIED"
    assert "the code around it" in finding.ledger.real_code_reading
