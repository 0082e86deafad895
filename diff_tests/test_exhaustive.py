"""Bounded-exhaustive conformance on real vLLM: the whole declared scope."""

from __future__ import annotations

import json

from kvspec import exitcodes
from kvspec.cli import main
from kvspec.mutants_command import mutant_tree
from oracles.mutants import mutant


def test_the_whole_scope_conforms_on_the_newest_release(tmp_path):
    out = tmp_path / "exhaust.json"
    assert main(["exhaust", "--vllm", "0.33.0", "--json", str(out)]) == exitcodes.OK
    result = json.loads(out.read_text())
    assert result["cases"] == result["total_cases"] > 5000
    assert result["failing_cases"] == 0 and result["calls"] > 100_000


def test_the_scope_catches_the_50062_mutant(tmp_path, capsys):
    tree = mutant_tree("0.33.0", mutant("refloor_50062"))
    out = tmp_path / "exhaust.json"
    code = main(["exhaust", "--vllm-src", str(tree), "--max-groups", "2", "--json", str(out)])
    assert code == exitcodes.FINDING
    result = json.loads(out.read_text())
    assert result["failing_cases"] > 0
    assert all("under_registration" in d["found"][0] for d in result["discrepancies"])
