"""`kvspec history` on real releases: one row per release, capabilities by
introspection, the registration, lookup and stateful differentials, the real
code symbolically."""

from __future__ import annotations

import json

from kvspec.model.finding import Category
from kvspec.model.known import KNOWN_BUGS
from kvspec.model.outcome import Outcome
from kvspec.cli import main


def test_history_of_the_ci_releases(tmp_path, capsys):
    out = tmp_path / "history.json"
    code = main(["history", "--vllm", "0.28.0", "--vllm", "0.33.0", "--max-examples", "100", "--seed", "2",
                 "--symbolic", "--json", str(out)])
    # 0.28.0 trims only the first full-attention group's hit blocks (fixed in 0.29.0).
    # Measured with the draw of one-group sliding-window and Mamba models and
    # caching off: seed 2 reaches it after 23 programs, seeds 3-7 after 223-465,
    # seed 0 not in 400 examples (100 examples run about 150 programs).
    assert code == Outcome.FINDING.exit_code
    doc = json.loads(out.read_text())
    assert doc["schema"] == "kvspec.history/1"
    by_version = {r["version"]: r for r in doc["releases"]}
    assert set(by_version) == {"0.28.0", "0.33.0"}
    for version, row in by_version.items():
        assert row["cases"] >= 100 and row["symbolic"]["status"] == "VERIFIED"
        # Nothing is kept out of the registration draw: what it finds is a known bug the release carries
        # (0.33.0: the sliding-window EAGLE crash under lookahead hashes).
        assert row["failure"] is None or _carried(version, row["failure"]), row["failure"]["summary"]
        assert row["capabilities"]["partial_hash_hits"] and row["capabilities"]["reprefillable_tokens"]
    # The same bug seen per request: the second full-attention group answers
    # a lookup with more blocks than the hit.
    lookup = by_version["0.28.0"]["lookup"]
    assert lookup["status"] == "discrepancy" and lookup["failure"]["category"] == "lookup_contract"
    assert "blocks for a hit of" in lookup["failure"]["summary"][0]
    assert by_version["0.33.0"]["lookup"]["status"] == "no discrepancy"
    assert by_version["0.33.0"]["lookup"]["cases"] >= 100
    assert by_version["0.33.0"]["stateful"]["status"] == "no discrepancy"
    # The engine column: vLLM's real Scheduler, engine-built. History shows every
    # bug a release carries, so a finding there is a known bug the release carries.
    for version, row in by_version.items():
        engine = row["engine"]
        assert engine["operations"] > 500 and engine["outcome"] in ("OK", "FINDING")
        assert engine["failure"] is None or _carried(version, engine["failure"]), engine["failure"]["summary"]
    assert by_version["0.33.0"]["stateful"]["operations"] > 1000
    assert by_version["0.28.0"]["status"] == "discrepancy"
    assert by_version["0.28.0"]["stateful"]["failure"]["category"] == "state_hit_groups"
    assert by_version["0.33.0"]["capabilities"]["get_num_cacheable_tokens"] is True
    assert by_version["0.28.0"]["capabilities"]["get_num_cacheable_tokens"] is False
    table = capsys.readouterr().out
    assert "engine (vLLM's Scheduler)" in table
    assert "| 0.28.0 | yes | yes |" in table and "(in get_num_cacheable_tokens)" in table
    # Lookahead block hashes (multi-module MTP) arrived with 0.33.
    assert by_version["0.33.0"]["capabilities"]["lookahead_block_hashes"] is True
    assert by_version["0.28.0"]["capabilities"]["lookahead_block_hashes"] is False


def _carried(version: str, failure: dict) -> bool:
    """Whether a stored failure is a known vLLM bug ``version`` carries."""
    return any(b.carried_by(version) and b.matches(failure["summary"][0], Category(failure["category"]))
               for b in KNOWN_BUGS)
