"""``kvspec report --upstream`` on a stored engine finding of the newest
release's open bug (the Mamba estimate after a synchronous connector load,
found by `kvspec fuzz --vllm 0.34.0 --engine --include-known --seed 0`): the
script kvspec writes runs in a fresh process on 0.34.0, reproduces, and the
report offers exactly that script."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvspec.model.outcome import Outcome
from kvspec.subjects.subject import mutant_subject, release

FIXTURE = Path(__file__).parent.parent / "fixtures" / "finding_engine_mamba_estimate_0.34.0.json"


def test_the_upstream_report_of_the_mamba_estimate_finding_reproduces_on_0_34_0(tmp_path, capsys):
    from kvspec.cli import main

    report = tmp_path / "report.md"
    assert main(["report", "--upstream", str(FIXTURE), "--output", str(report)]) == Outcome.OK.exit_code
    assert "the script reproduced (exit status 1" in capsys.readouterr().err
    text = report.read_text()
    assert "**reproduced**, exit status 1" in text
    assert ("AssertionError: block estimate below allocation: allocate_slots for request r0 took 6 free blocks, "
            "but the KV-cache groups' get_num_blocks_to_allocate estimated 4 (1, 1, 2)") in text
    assert "in schedule" in text  # raised from inside vLLM's schedule(), through its allocate_slots
    (script,) = re.findall(r"(?ms)^```python\n(.*?)^```$", text)
    assert "pip install vllm==0.34.0 && python repro.py" in script
    assert not re.search(r"^\s*(import|from) kvspec", script, re.M)
    # The finding's test in vLLM's idiom, from the same engine code: it lints
    # clean under the release's ruff configuration and fails on 0.34.0 on its
    # assertion; no release without the bug is known, and that is said.
    test = _engine_test(tmp_path, FIXTURE, release("0.34.0"))
    assert test["test_name"] == "test_block_estimate_covers_allocate_slots" and test["proposed"], test
    (run,) = test["verified"]
    assert run["outcome"] == "failed" and run["failure"] == "the test's assertion" and run["as_expected"], run
    assert test["other_side"] == "no release without this bug is known to kvspec (model/known.py)"


OWN_CONNECTOR = FIXTURE.parent / "finding_engine_mamba_estimate_kvspec_connector_0.34.0.json"


def test_the_mamba_estimate_found_with_kvspecs_connector_reproduces_with_the_connector_written_in(tmp_path,
                                                                                                   capsys):
    """The same open bug found with kvspec's own connector (toy-nemotron-h,
    a synchronous load of 64 of 65 prompt tokens): the script writes the
    connector into itself (ExternalStoreConnector), imports vLLM alone, and
    reproduces in a fresh process on 0.34.0; the finding's test fails there on
    its assertion."""
    from kvspec.cli import main

    report = tmp_path / "report.md"
    assert main(["report", "--upstream", str(OWN_CONNECTOR), "--output", str(report)]) == Outcome.OK.exit_code
    assert "the script reproduced (exit status 1" in capsys.readouterr().err
    text = report.read_text()
    assert ("AssertionError: block estimate below allocation: allocate_slots for request r0 took 6 free blocks, "
            "but the KV-cache groups' get_num_blocks_to_allocate estimated 4 (1, 1, 2)") in text
    (script,) = re.findall(r"(?ms)^```python\n(.*?)^```$", text)
    assert "class ExternalStoreConnector(KVConnectorBase_V1, SupportsHMA):" in script
    assert '{"offer": 64, "async": False, "delay": 0, "fail": None}' in script
    assert not re.search(r"^\s*(import|from) kvspec", script, re.M) and "kvspec" not in script.split('"""', 2)[2]
    test = _engine_test(tmp_path, OWN_CONNECTOR, release("0.34.0"))
    assert test["test_name"] == "test_block_estimate_covers_allocate_slots" and test["proposed"], test
    (run,) = test["verified"]
    assert run["outcome"] == "failed" and run["failure"] == "the test's assertion" and run["as_expected"], run


WINDOW = FIXTURE.parent / "finding_engine_window_frees_early_0.34.0.json"


def _engine_test(tmp_path, fixture: Path, subject) -> dict:
    from kvspec.findings.engine import with_engine_test
    from kvspec.model.finding import Finding

    finding = with_engine_test(Finding.from_dict(json.loads(fixture.read_text())), tmp_path / fixture.name, subject)
    test = finding.regression_test
    assert test["lint"]["outcome"] == "passed", test["lint"]["output"]
    assert "kvspec" not in test["code"] and Path(finding.artifacts["regression_test"]).read_text() == test["code"]
    return test


def test_an_engine_findings_test_fails_on_the_mutant_and_passes_on_its_release(tmp_path):
    """``kvspec fuzz --vllm 0.34.0 --mutant window_frees_early --engine
    --seed 0``'s finding: the test asserts the window the step attends to is
    held, fails on the mutant on that assertion and passes on 0.34.0."""
    _fails_on_the_mutant_passes_on_the_release(tmp_path, WINDOW, "window_frees_early",
                                               "test_sliding_window_keeps_the_blocks_its_next_step_reads",
                                               "must hold real blocks for the window of tokens its next step "
                                               "attends to")


def _fails_on_the_mutant_passes_on_the_release(tmp_path, fixture: Path, mutant: str, name: str, words: str) -> None:
    test = _engine_test(tmp_path, fixture, mutant_subject("0.34.0", mutant))
    assert test["test_name"] == name and test["proposed"]
    subject, release_side = test["verified"]
    assert subject["outcome"] == "failed" and subject["failure"] == "the test's assertion", subject
    assert words in subject["output"]
    assert release_side["outcome"] == "passed" and release_side["against"] == "unmutated vllm 0.34.0", release_side


RETENTION = FIXTURE.parent / "finding_engine_retention_hit_0.34.0.json"


def test_a_retention_hit_findings_test_asserts_the_hit_a_user_loses(tmp_path):
    """A retention_hit finding of ``free_cached_block_misses`` on 0.34.0
    (toy-gpt-oss: a resend of a computed 65-token prompt after its requests
    ended hits nothing where 64 tokens were left cached): the test asserts the
    resend's first get_computed_blocks() hit, fails on the mutant on that
    assertion and passes on 0.34.0."""
    _fails_on_the_mutant_passes_on_the_release(tmp_path, RETENTION, "free_cached_block_misses",
                                               "test_request_hits_the_prefix_blocks_earlier_requests_left_cached",
                                               "request r3 hit 0 tokens; at least 64 were left in the cache for it")


FREE_ORDER = FIXTURE.parent / "finding_engine_free_head_first_0.34.0.json"


def test_a_free_order_findings_test_wraps_the_managers_free(tmp_path):
    """``kvspec fuzz --vllm 0.34.0 --mutant free_head_first --engine --seed 0``'s
    finding (toy-llama: a 128-token request finishes): the test checks the
    free block queue around KVCacheManager.free, fails on the mutant on its
    assertion and passes on 0.34.0."""
    _fails_on_the_mutant_passes_on_the_release(tmp_path, FREE_ORDER, "free_head_first",
                                               "test_freed_request_blocks_join_the_free_queue_in_reverse_order",
                                               "so that its last block is evicted first")


MAMBA_STATE = FIXTURE.parent / "finding_engine_mamba_state_slot_nulled_0.34.0.json"


def test_a_mamba_state_findings_test_schedules_the_prefills_as_the_engine_did(tmp_path):
    """``kvspec fuzz --vllm 0.34.0 --mutant mamba_state_slot_nulled --engine
    --seed 0``'s finding (toy-nemotron-h, the release's defaults: a 128- and a
    129-token request, one async step that admits both whole): the test builds
    the Mamba groups' specs with the prefill checkpoint vLLM's Mamba2 layer
    declares, so its scheduler admits both as the engine did (without it,
    prefills split at block boundaries, r7 waited and the test passed on the
    mutant); it fails on the mutant on its assertion and passes on 0.34.0."""
    _fails_on_the_mutant_passes_on_the_release(tmp_path, MAMBA_STATE, "mamba_state_slot_nulled",
                                               "test_mamba_group_keeps_the_block_of_the_running_state",
                                               "request r7 computed 128 tokens; group 0 holds 2 slots, slot 1 "
                                               "the null block")


# Engine tests of rules no earlier mutant or known bug reached through the
# engine: (fixture, mutant, test name, the words the failing assertion says).
# Each fixture is `kvspec fuzz --engine --vllm 0.34.0 --mutant MUTANT
# --max-examples 100 --seed 0`'s finding, stored without its test (rewritten here).
CALL_RULE_MUTANTS = [
    (FIXTURE.parent / "finding_engine_zeroing_missed_zeroing_ids_overwritten_0.34.0.json", "zeroing_ids_overwritten",
     "test_new_attention_blocks_are_handed_out_for_zeroing", "so that it is zeroed: blocks [3, 6] were not handed out"),
    (FIXTURE.parent / "finding_engine_lookup_pure_lookup_touches_hit_0.34.0.json", "lookup_touches_hit",
     "test_get_computed_blocks_takes_no_reference", "the free count: request r5's lookup changed a ref_cnt"),
    (FIXTURE.parent / "finding_engine_hit_length_unitary_hit_limit_decremented_0.34.0.json",
     "unitary_hit_limit_decremented", "test_prefix_cache_hit_is_the_leading_run_of_cached_blocks",
     "request r6 hit 0 tokens; the prefix cache held its first 1 blocks"),
    (FIXTURE.parent / "finding_engine_hit_bounds_lookup_counts_partial_block_0.34.0.json",
     "lookup_counts_partial_block", "test_prefix_cache_hit_leaves_a_token_to_compute",
     "request r2 hit 63 tokens, not a multiple of the scheduler block size 64"),
]


@pytest.mark.parametrize("fixture, mutant, name, words", CALL_RULE_MUTANTS,
                         ids=[row[1] for row in CALL_RULE_MUTANTS])
def test_a_call_rules_findings_test_fails_on_the_mutant_and_passes_on_its_release(tmp_path, fixture, mutant, name,
                                                                                  words):
    """The finding's test wraps the manager's call the rule is on, fails on
    the mutant on that assertion and passes on 0.34.0."""
    _fails_on_the_mutant_passes_on_the_release(tmp_path, fixture, mutant, name, words)


def test_a_script_that_does_not_reproduce_is_not_offered(tmp_path, capsys):
    """The same program read as a crash of schedule(): with the finding's
    22-block pool the allocation fits, so the script runs to its end; the
    report says it did not reproduce, offers no script, and exits 4."""
    from kvspec.cli import main

    doc = json.loads(FIXTURE.read_text())
    doc.update(category="subject_crash", detail="subject_crash: ValueError: Cannot get 1 free blocks from the pool",
               observations={"error": "ValueError: Cannot get 1 free blocks from the pool"})
    finding = tmp_path / "crash.json"
    finding.write_text(json.dumps(doc))
    report = tmp_path / "report.md"
    assert main(["report", "--upstream", str(finding), "--output", str(report)]) == Outcome.INCOMPLETE.exit_code
    text = report.read_text()
    assert "did **not** reproduce, so it is not offered" in text and "```python" not in text
    assert "**did not reproduce**, exit status 0" in text and "no failure: the finding did not reproduce" in text



def test_a_state_findings_upstream_script_fails_on_the_mutant_saying_the_rule():
    """``kvspec fuzz --vllm 0.34.0 --mutant zeroing_ids_overwritten --engine``'s
    zeroing_missed finding: its upstream script (the check its engine test
    makes, rendered once) exits 1 in a fresh process on the mutant, saying the
    rule broken and what vLLM did.  (On 0.34.0 it runs clean: the engine
    test's check passes there, above; ``kvspec report --upstream`` refuses the
    finding itself, a mutant not being a published release.)"""
    from kvspec.emit.engine_test import rule_check
    from kvspec.model.engine import EngineProgram
    from kvspec.model.finding import Finding
    from kvspec.subjects.mutation import mutant
    from kvspec.subjects.mutation.trees import ensure_mutant_tree
    from kvspec.subjects.upstream_repro import repro_script, run_repro

    finding = Finding.from_dict(json.loads(CALL_RULE_MUTANTS[0][0].read_text()))
    program, settings = EngineProgram.from_dict(finding.inputs["engine_program"]), finding.run["engine_settings"]
    script = repro_script(program, settings, finding.category, "0.34.0",
                          rule_check(program, settings, finding.category, finding.detail))
    tree = str(ensure_mutant_tree("0.34.0", mutant("zeroing_ids_overwritten")))
    run = run_repro(script, None, tree=tree, label="vLLM 0.34.0 + zeroing_ids_overwritten")
    assert run.reproduced and run.returncode == 1 and not run.ran_clean, run.tail
    assert run.tail.endswith("Expected: every block newly allocated to an attention group must be returned by "
                             "take_new_block_ids() so that it is zeroed\nActual: blocks [3, 6] were not handed out"), \
        run.tail


# Every engine fixture finding made on a mutant of 0.34.0, by the rule it broke.
MUTANT_FINDINGS = sorted(path for path in FIXTURE.parent.glob("finding_engine_*_0.34.0.json")
                         if json.loads(path.read_text())["compared"]["subject"]["kind"] == "mutant")


@pytest.mark.soak  # each finding's script on its mutant and on 0.34.0, about 20 s each: `python -m pytest -m soak`
@pytest.mark.parametrize("fixture", MUTANT_FINDINGS, ids=[p.name[len("finding_engine_"):-len("_0.34.0.json")]
                                                          for p in MUTANT_FINDINGS])
def test_every_state_findings_upstream_script_fails_on_its_mutant_and_runs_clean_on_the_release(fixture):
    """The script ``kvspec report --upstream`` would write for each kind of
    engine finding (the check its engine test makes, rendered once): exit 1
    in a fresh process on the mutant that made the finding, saying Expected
    (the rule) and Actual; exit 0, run to its end, on unmutated 0.34.0."""
    from kvspec.emit.engine_test import rule_check
    from kvspec.model.engine import EngineProgram
    from kvspec.model.finding import Finding
    from kvspec.subjects.mutation import mutant
    from kvspec.subjects.mutation.trees import ensure_mutant_tree
    from kvspec.subjects.upstream_repro import repro_script, run_repro

    finding = Finding.from_dict(json.loads(fixture.read_text()))
    name = finding.compared["subject"]["mutant"]
    program, settings = EngineProgram.from_dict(finding.inputs["engine_program"]), finding.run["engine_settings"]
    script = repro_script(program, settings, finding.category, "0.34.0",
                          rule_check(program, settings, finding.category, finding.detail))
    tree = str(ensure_mutant_tree("0.34.0", mutant(name)))
    on_mutant = run_repro(script, None, tree=tree, label=f"vLLM 0.34.0 + {name}")
    assert on_mutant.reproduced and on_mutant.returncode == 1, on_mutant.tail
    assert "\nExpected: " in on_mutant.tail and "\nActual: " in on_mutant.tail, on_mutant.tail
    on_release = run_repro(script, None)
    assert on_release.returncode == 0 and not on_release.reproduced, on_release.tail
