"""Bounded-exhaustive conformance on real vLLM: the whole declared scope."""

from __future__ import annotations

import json

from kvspec.model.outcome import Outcome
from kvspec.cli import main
from tests.support import mutant_tree


def test_the_whole_scope_conforms_on_the_newest_release(tmp_path):
    out = tmp_path / "exhaust.json"
    assert main(["exhaust", "--vllm", "0.33.0", "--json", str(out)]) == Outcome.OK.exit_code
    result = json.loads(out.read_text())
    assert result["cases"] == result["total_cases"] > 5000
    assert result["failing_cases"] == 0 and result["calls"] > 100_000


def test_the_scope_catches_the_50062_mutant(tmp_path, capsys):
    tree = mutant_tree("0.33.0", "refloor_50062")
    out = tmp_path / "exhaust.json"
    code = main(["exhaust", "--vllm-src", str(tree), "--max-groups", "2", "--json", str(out)])
    assert code == Outcome.FINDING.exit_code
    result = json.loads(out.read_text())
    assert result["failing_cases"] > 0
    assert all("under_registration" in d["found"][0] for d in result["discrepancies"])
