"""The symbolic leg: vLLM's own get_num_cacheable_tokens against the spec (CrossHair)."""

from __future__ import annotations

import json

from kvspec import exitcodes
from kvspec.cli import main
from kvspec.mutants_command import mutant_tree
from oracles.mutants import mutant
from oracles.subject import release, source_tree
from oracles.symbolic import SymbolicStatus, symbolic_check


def test_release_code_is_verified_against_the_spec():
    verdict = symbolic_check(release("0.33.0"))
    assert verdict.status is SymbolicStatus.VERIFIED, verdict
    assert verdict.paths > 0 and verdict.abstracted  # what was abstracted is stated


def test_the_50062_mutant_is_refuted_and_the_counterexample_replays():
    tree = mutant_tree("0.33.0", mutant("refloor_50062"))
    verdict = symbolic_check(source_tree(str(tree)))
    assert verdict.status is SymbolicStatus.REFUTED, verdict
    cx = verdict.counterexample
    assert cx["args"]["eagle"] is True and cx["args"]["partial"] is True
    # The real KVCacheManager, driven normally, shows the same loss.
    assert cx["replay"]["confirmed"] and "under_registration" in cx["replay"]["discrepancies"][0]


def test_prove_gains_the_real_code_rows_and_exit_codes(tmp_path, capsys):
    tree = mutant_tree("0.33.0", mutant("refloor_50062"))
    out = tmp_path / "prove.json"
    code = main(["prove", "--quiet", "--theorem", "lemma.div_bounds", "--vllm-src", str(tree),
                 "--json", str(out)])
    assert code == exitcodes.FINDING
    assert "REFUTED HybridKVCacheCoordinator.get_num_cacheable_tokens" in capsys.readouterr().out
    (row,) = json.loads(out.read_text())["real_code"]
    assert row["status"] == "REFUTED"


def test_a_release_without_the_method_is_unsupported_with_the_reason(capsys):
    code = main(["prove", "--quiet", "--theorem", "lemma.div_bounds", "--vllm", "0.28.0"])
    assert code == exitcodes.USAGE
    assert "UNSUPPORTED" in capsys.readouterr().out
