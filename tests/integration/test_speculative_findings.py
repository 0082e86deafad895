"""Engine findings whose program runs speculative decoding get a regression
test in vLLM's idiom, from the upstream script's engine code: vLLM's
SpeculativeConfig built from the finding's flags, the drafter's groups as
vLLM's planning flagged them, the lookahead and the EAGLE block drop as vLLM
derives them.  The test fails where the finding was found, on its assertion,
and passes where the bug is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.subjects.subject import mutant_subject, release

FIXTURES = Path(__file__).parent.parent / "fixtures"
# kvspec fuzz --vllm 0.34.0 --mutant hit_keeps_trimmed_blocks --engine --hash-scheme legacy --seed 1
EAGLE_MUTANT = FIXTURES / "finding_engine_hit_groups_eagle_0.34.0.json"
# vLLM's second_full_attention_group_untrimmed (0.23.0-0.28.x, fixed in 0.29.0) met under EAGLE3:
# kvspec fuzz --vllm 0.27.1 --engine --seed 0 with every known bug but the open Mamba estimate bug
# reported (with --include-known that one, met first, is the finding).
EAGLE_RELEASE = FIXTURES / "finding_engine_second_full_attention_group_eagle_0.27.1.json"
NAME = "test_every_group_trims_its_hit_blocks_to_the_common_hit"


def _engine_test(tmp_path, fixture: Path, subject) -> dict:
    from kvspec.findings.engine import with_engine_test
    from kvspec.model.finding import Finding

    finding = with_engine_test(Finding.from_dict(json.loads(fixture.read_text())), tmp_path / fixture.name, subject)
    test = finding.regression_test
    assert test["lint"]["outcome"] == "passed", test["lint"]["output"]
    assert test["test_name"] == NAME and test["proposed"], test
    code = test["code"]
    assert "kvspec" not in code and "return SpeculativeConfig(" in code and 'SPECULATIVE_METHOD = "eagle3"' in code
    return test


def test_an_eagle_findings_test_fails_on_the_mutant_and_passes_on_its_release(tmp_path):
    """The mutant keeps the block the EAGLE drop cut from a one-group hit
    (toy Llama with its EAGLE3 drafter, legacy hashes so the drop runs: two
    64-token prefixes, one step): the test builds that scheduler (the group
    vLLM's planning flagged as the drafter's, the drop vLLM's scheduler
    decides), fails on the mutant on its assertion and passes on 0.34.0."""
    test = _engine_test(tmp_path, EAGLE_MUTANT, mutant_subject("0.34.0", "hit_keeps_trimmed_blocks"))
    assert "DISABLE_LOOKAHEAD_BLOCK_HASHES = True" in test["code"] and "EAGLE_GROUPS = [0]" in test["code"]
    subject, release_side = test["verified"]
    assert subject["outcome"] == "failed" and subject["failure"] == "the test's assertion", subject
    assert "request r1: group 0 returned 1 blocks for a hit of 0 tokens" in subject["output"]
    assert release_side["outcome"] == "passed" and release_side["against"] == "unmutated vllm 0.34.0", release_side


@pytest.mark.soak  # two older releases' runs, about a minute on 2 cores: opt in with `python -m pytest -m soak`
def test_a_known_bug_met_under_eagle_fails_on_its_release_and_passes_where_it_is_fixed(tmp_path):
    """vLLM's hybrid lookup trims only the first full-attention group; the
    EAGLE3 drafter's own group (toy Qwen3-Next with a drafter of twice its KV
    page) returns blocks past the hit.  The test fails on 0.27.1 on its
    assertion and passes on 0.29.0, the first release without the bug."""
    test = _engine_test(tmp_path, EAGLE_RELEASE, release("0.27.1"))
    subject, fixed = test["verified"]
    assert subject["outcome"] == "failed" and subject["failure"] == "the test's assertion", subject
    assert "request r2: group 4 returned 2 blocks for a hit of 0 tokens" in subject["output"]
    assert fixed["outcome"] == "passed" and "0.29.0, the first release without" in fixed["against"], fixed
