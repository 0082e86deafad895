"""`kvspec mtp` on real releases: the multi-module MTP verdict and its evidence.

The model says a hit keeps stale draft KV iff EAGLE and L > drop tail, which
the guard S >= L does not exclude.  With the writer prefilled the way vLLM's
own scheduler chunks it, real vLLM (0.28.0 and 0.33.0, legacy hashes and the
EAGLE drop) shows stale reuse in exactly the configurations the model allows
-- including S=4, H=2, L=3 with a full-attention block of 4, which a
single-chunk writer hid -- and 0.33.0's lookahead block hashes show none.  No
deployment profile reaches it and its effect is on acceptance only: hardening.
"""

from __future__ import annotations

import json

from kvspec.model.outcome import Outcome
from kvspec.cli import main

LEGACY, LOOKAHEAD = "legacy hashes + EAGLE drop", "lookahead block hashes"
RECONCILED = "S=4 H=2 lookahead=3 dcp=1 caching=on [mamba_align(block 4), full_attention(block 4, EAGLE)]"


def test_stale_draft_reuse_on_the_ci_releases(tmp_path, capsys):
    out, md = tmp_path / "mtp.json", tmp_path / "mtp.md"
    code = main(["mtp", "--vllm", "0.28.0", "--vllm", "0.33.0", "--json", str(out),
                 "--markdown", str(md)])
    assert code == Outcome.HARDENING.exit_code
    doc = json.loads(out.read_text())
    assert doc["schema"] == "kvspec.mtp/1" and doc["verdict"].startswith("HARDENING")
    assert "no deployment profile" in doc["verdict"] and "acceptance only" in doc["verdict"]
    assert all(t["as_expected"] for t in doc["theorems"])
    by_version = {s["vllm_version"]: s for s in doc["subjects"]}
    assert set(by_version["0.28.0"]["schemes"]) == {LEGACY}  # no lookahead hashes before 0.33
    assert set(by_version["0.33.0"]["schemes"]) == {LEGACY, LOOKAHEAD}
    for version in ("0.28.0", "0.33.0"):
        legacy = by_version[version]["schemes"][LEGACY]
        assert legacy["error_count"] == 0
        assert legacy["witnesses"] > 0 and legacy["model_necessary"], version
        # The model's condition, exactly (it was not, with a single-chunk writer).
        assert legacy["model_condition_matches"] and not legacy["whole_block_condition_matches"], version
        row = next(r for r in legacy["per_config"] if r["config"] == RECONCILED)
        assert row["model_predicts_stale"] and row["vllm_stale"] > 0, version
        smallest = legacy["smallest"]
        assert smallest["shared"] <= smallest["read_up_to"] < smallest["writer_tokens"]
        # The suggested guard refuses every stale configuration, nothing vLLM handled safely.
        assert legacy["fix_refuses_every_stale"] and legacy["fix_refuses_safe"] == []
        reach = by_version[version]["reach"]
        assert reach["profiles"] == [] and reach["fix_refuses_profiles"] == [] and reach["called"] > 0
    assert by_version["0.33.0"]["schemes"][LEGACY]["mamba_checkpoint_fields"]  # 0.33's Mamba2 declares them
    lookahead = by_version["0.33.0"]["schemes"][LOOKAHEAD]
    assert lookahead["error_count"] == 0 and lookahead["cases"] > 1000
    assert lookahead["witnesses"] == 0
    assert "Suggested fix" in md.read_text()
    assert "VERDICT: HARDENING" in capsys.readouterr().out
