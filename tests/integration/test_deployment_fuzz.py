"""The deployment scope and both hash schemes on the CI releases: what
deployments run conforms, and the results say what they covered."""

from __future__ import annotations

import pytest

from kvspec.diff_tests.fuzz import fuzz_subject


@pytest.mark.parametrize("version, schemes", [("0.33.0", ["legacy", "lookahead"]), ("0.28.0", ["legacy"])])
def test_deployment_sizes_and_hash_schemes_conform(kvspec_release, version, schemes):
    proc = kvspec_release(version)
    result = fuzz_subject(proc, max_examples=150, seed=3)
    assert result.failure is None, result.failure and result.failure.as_dict()["summary"]
    doc = result.as_dict()
    assert doc["hash_schemes"]["fuzzed"] == schemes
    assert doc["deployments"]["cases"] > 50 and doc["deployments"]["configs"] >= 10
    if "lookahead" in schemes:
        assert doc["hash_schemes"]["lookahead_cases"] > 100 and doc["hash_schemes"]["legacy_cases"] > 100
        # Nothing kept out: the sliding-window EAGLE crash is drawn, met, recognised and said.
        assert set(doc["known_met"]) <= {"sliding_window_eagle_multi_module_lookahead_crash"}
    else:
        assert doc["hash_schemes"]["lookahead_cases"] == 0 and doc["known_met"] == {}
    assert doc["not_covered"]  # both releases have features kvspec does not drive, said


def test_narrowing_says_what_was_left_out(kvspec_release):
    result = fuzz_subject(kvspec_release("0.33.0"), max_examples=20, seed=3, hash_schemes=("lookahead",))
    assert result.hash_schemes == ("lookahead",) and result.schemes_left_out == ("legacy",)
    assert "legacy hashes NOT fuzzed: the EAGLE branch of the bound never ran" in result.scheme_text
    # Every case is drawn under lookahead hashes, but for a known finding's few (drawn under legacy).
    assert result.tally.lookahead_cases > 0.8 * result.tally.cases
