"""Engine findings whose program runs speculative decoding get an upstream
script and a regression test in vLLM's idiom, sharing one engine code: vLLM's
SpeculativeConfig built from the finding's flags, the drafter's groups as
vLLM's planning flagged them, the lookahead and the EAGLE block drop as vLLM
derives them.  The script reproduces in a fresh process where the finding was
found and runs to its end where the bug is fixed; the test fails where the
finding was found, as it did, and passes where the bug is not."""

from __future__ import annotations

import json
import re
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
# vLLM's connector_lookup_takes_deepest_group_hit (0.24.0-0.26.0, fixed in 0.27.0) in its crash form, under
# EAGLE3: kvspec fuzz --vllm 0.26.0 --engine --seed 0 with every known bug recognised but that crash form.
EAGLE_CRASH = FIXTURES / "finding_engine_crash_eagle_cow_0.26.0.json"


def test_the_upstream_script_of_a_crash_under_eagle_reproduces(tmp_path, capsys):
    """Toy Qwen3-Next with an EAGLE3 drafter of twice its KV page (the
    drafter's group at half the scheduler block), kvspec's connector and
    --prefix-match-unit 16: on 0.26.0 the connector's per-group lookup gives a
    full-attention group a partial hit past its blocks and the copy-on-write
    asserts.  ``kvspec report --upstream``'s script (vLLM's SpeculativeConfig
    and the drafter's config.json written in, no kvspec) reproduces in a
    fresh process on 0.26.0 (a bare assert: its last line is the class name)
    and, run beside it, clean on 0.27.0."""
    from kvspec.cli import main
    from kvspec.model.outcome import Outcome

    report = tmp_path / "report.md"
    assert main(["report", "--upstream", str(EAGLE_CRASH), "--output", str(report)]) == Outcome.OK.exit_code
    err = capsys.readouterr().err
    assert "the script reproduced (exit status 1" in err
    # ... and, run beside it on 0.27.0, the first release without the bug, it runs clean.
    assert "on vLLM 0.27.0 it ran clean (exit status 0" in err
    text = report.read_text()
    assert "**reproduced**, exit status 1" in text and "in _apply_cow" in text and "\nAssertionError\n" in text
    assert "On vLLM 0.27.0, the first release without the bug, kvspec ran the same script" in text
    assert "**ran clean**, exit status 0" in text
    (code,) = re.findall(r"(?ms)^```python\n(.*?)^```$", text)
    assert not re.search(r"^\s*(import|from) kvspec", code, re.M)
    assert "return SpeculativeConfig(" in code and 'architectures=["LlamaForCausalLMEagle3"]' in code
    assert "class ExternalStoreConnector(KVConnectorBase_V1, SupportsHMA):" in code


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


@pytest.mark.soak  # the emitted test run on both sides, about a minute on 2 cores: `python -m pytest -m soak`
def test_the_test_of_a_crash_under_eagle_fails_on_its_release_and_passes_where_fixed(tmp_path):
    """The same finding's script runs to its end on 0.27.0, and its test
    (vLLM's scheduler stepped as the engine stepped it) fails on 0.26.0 with
    vLLM's own assert and passes on 0.27.0."""
    from kvspec.findings.engine import with_engine_test
    from kvspec.model.engine import EngineProgram
    from kvspec.model.finding import Category, Finding
    from kvspec.subjects.provision import ensure_release
    from kvspec.subjects.upstream_repro import repro_script, run_repro

    doc = json.loads(EAGLE_CRASH.read_text())
    script = repro_script(EngineProgram.from_dict(doc["inputs"]["engine_program"]), doc["run"]["engine_settings"],
                          Category.SUBJECT_CRASH, "0.26.0")
    fixed_run = run_repro(script, "AssertionError", tree=str(ensure_release("0.27.0")), label="vLLM 0.27.0")
    assert fixed_run.returncode == 0 and not fixed_run.reproduced, fixed_run
    assert "no failure: the finding did not reproduce" in fixed_run.tail, fixed_run.tail
    finding = with_engine_test(Finding.from_dict(json.loads(EAGLE_CRASH.read_text())), tmp_path / EAGLE_CRASH.name,
                               release("0.26.0"))
    test = finding.regression_test
    assert test["lint"]["outcome"] == "passed" and test["proposed"], test
    assert test["test_name"] == "test_scheduler_step_does_not_raise"
    subject, fixed = test["verified"]
    assert subject["outcome"] == "failed" and subject["failure"] == "vLLM's own assert (AssertionError)", subject
    # (the output kept is its last 4,000 characters: vLLM's logs, not the traceback)
    assert fixed["outcome"] == "passed" and "0.27.0, the first release without" in fixed["against"], fixed


@pytest.mark.soak  # about 40 s on 2 cores under load: opt in with `python -m pytest -m soak`
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
    assert "test_every_group_trims_its_hit_blocks_to_the_common_hit" in subject["output"]
    assert fixed["outcome"] == "passed" and "0.29.0, the first release without" in fixed["against"], fixed
