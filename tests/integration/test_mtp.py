"""`kvspec mtp` on real releases: the multi-module MTP verdict and its evidence.

The model says a hit keeps stale draft KV iff EAGLE and L > drop tail, which
the guard S >= L does not exclude.  On real vLLM (0.28.0 and 0.33.0 with the
legacy hashes and the EAGLE drop) such hits must be found, only in
configurations the model allows, and 0.33.0's lookahead block hashes must
find none.
"""

from __future__ import annotations

import json

from kvspec.model.outcome import Outcome
from kvspec.cli import main

LEGACY, LOOKAHEAD = "legacy hashes + EAGLE drop", "lookahead block hashes"


def test_stale_draft_reuse_on_the_ci_releases(tmp_path, capsys):
    out, md = tmp_path / "mtp.json", tmp_path / "mtp.md"
    code = main(["mtp", "--vllm", "0.28.0", "--vllm", "0.33.0", "--json", str(out),
                 "--markdown", str(md)])
    assert code == Outcome.FINDING.exit_code
    doc = json.loads(out.read_text())
    assert doc["schema"] == "kvspec.mtp/1" and doc["verdict"].startswith("COUNTEREXAMPLE")
    assert all(t["as_expected"] for t in doc["theorems"])
    by_version = {s["vllm_version"]: s["schemes"] for s in doc["subjects"]}
    assert set(by_version["0.28.0"]) == {LEGACY}  # no lookahead hashes before 0.33
    assert set(by_version["0.33.0"]) == {LEGACY, LOOKAHEAD}
    for version in ("0.28.0", "0.33.0"):
        legacy = by_version[version][LEGACY]
        assert legacy["error_count"] == 0
        assert legacy["witnesses"] > 0 and legacy["model_necessary"], version
        smallest = legacy["smallest"]
        assert smallest["shared"] <= smallest["read_up_to"] < smallest["writer_tokens"]
        # stale under partial hash hits too: the case #52419's comment gets wrong
        assert any(r["vllm_stale"] for r in legacy["per_config"] if r["partial_hash_hits"]), version
    lookahead = by_version["0.33.0"][LOOKAHEAD]
    assert lookahead["error_count"] == 0 and lookahead["cases"] > 1000
    assert lookahead["witnesses"] == 0
    assert "Suggested fix" in md.read_text()
    assert "VERDICT: COUNTEREXAMPLE" in capsys.readouterr().out
