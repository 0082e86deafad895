"""An engine finding's regression test (``kvspec.emit.engine_test``),
without vLLM: written from the upstream script's validated values and its
engine code (one translation of an engine program, not two), named after
the behaviour, asserting what the finding measured, naming neither kvspec
nor the finding; a kind no test is written for says why."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from tests.support import assert_ruff_clean_as_vllm_lints, engine_findings_of_every_kind
from kvspec.emit.engine_test import ENGINE_TEST_KINDS, engine_test_code
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding
from kvspec.subjects.upstream_repro import ENGINE_CODE, Unscriptable, repro_script

FIXTURE = Path(__file__).parent.parent / "fixtures" / "finding_engine_mamba_estimate_0.34.0.json"


def _finding(category: Category | None = None) -> Finding:
    finding = Finding.from_dict(json.loads(FIXTURE.read_text()))
    return finding if category is None else attrs.evolve(finding, category=category)


def _shared(code: str) -> str:
    """The engine code of a generated file: from the model's config.json to the driver's end."""
    start = code.index("# The toy model's config.json")
    return code[start:code.index("            execute(*queue.pop())\n", start)]


@pytest.mark.parametrize("category, name, check", [
    (Category.STATE_BLOCK_ESTIMATE, "test_block_estimate_covers_allocate_slots", "watch_estimates(scheduler)"),
    (Category.STATE_WINDOW, "test_sliding_window_keeps_the_blocks_its_next_step_reads",
     "drive(scheduler, OPS, check=assert_window_held)"),
    (Category.SUBJECT_CRASH, "test_scheduler_step_does_not_raise", "drive(scheduler, OPS)"),
])
def test_the_test_is_the_scripts_engine_code_with_the_findings_assertion(category, name, check):
    finding = _finding(category)
    code = engine_test_code(finding, "0.34.0")
    compile(code, f"{name}.py", "exec")
    assert f"\ndef {name}(tmp_path):\n    scheduler = make_scheduler(str(tmp_path))\n" in code
    assert check in code and "kvspec" not in code and "finding" not in code.lower()
    assert "print(" not in code and "os.environ" not in code  # a test, not a script
    # One translation of the engine program: the script's, byte for byte.
    if category in (Category.STATE_BLOCK_ESTIMATE, Category.SUBJECT_CRASH):
        script = repro_script(EngineProgram.from_dict(finding.inputs["engine_program"]),
                              finding.run["engine_settings"], category, "0.34.0")
        assert _shared(code) == _shared(script.code)
    assert _shared(code).startswith(ENGINE_CODE.split("@", 1)[0])
    assert "NUM_BLOCKS = 22" in code and '("mamba_align", 64, 0, 1, 1, 1)' in code
    assert ("(add_request, schedule, update_from_output" in ENGINE_CODE
            or "update_from_output" in _shared(code))


def test_the_window_assertion_says_the_window_in_vllms_words():
    code = engine_test_code(_finding(Category.STATE_WINDOW), "0.34.0")
    assert '"a running request\'s sliding-window block table must hold real blocks "' in code
    assert "max(0, num_processed - window + 1) // block_size" in code
    assert all(len(line) <= 88 for line in code.splitlines())


@pytest.mark.parametrize("category, name, check, always", [
    (Category.STATE_LEAK, "test_every_block_is_free_once_no_request_holds_one", "assert_no_block_leaked", True),
    (Category.STATE_REF_COUNT, "test_block_ref_cnt_counts_the_block_tables_holding_it",
     "assert_ref_cnt_counts_block_tables", False),
    (Category.STATE_FREE_LIST, "test_free_block_queue_matches_its_counter", "assert_free_queue_matches_its_counter",
     True),
    (Category.STATE_FREE_BLOCKS, "test_a_block_is_free_iff_nothing_references_it", "assert_free_iff_unreferenced",
     True),
    (Category.STATE_FORGET, "test_finished_request_leaves_no_block_table", "assert_finished_requests_forgotten",
     True),
    (Category.STATE_HASH_MAP, "test_cached_block_map_agrees_with_block_hashes",
     "assert_hash_map_agrees_with_block_hashes", True),
    (Category.STATE_ONE_GROUP, "test_a_block_belongs_to_one_kv_cache_group", "assert_one_group_per_block", True),
])
def test_a_pool_rule_is_checked_on_the_schedulers_manager_in_the_stateful_tests_words(category, name, check, always):
    """Leaks, reference counts and the free queue: the rule read off the
    scheduler's KV cache manager after the inputs (and after each schedule()
    where it holds at every point; a reference count only once no batch is in
    flight), with the message the stateful test of the same rule has."""
    from kvspec.emit.stateful_test import assertion_message

    code = engine_test_code(_finding(category), "0.34.0")
    compile(code, f"{name}.py", "exec")
    assert f"\ndef {check}(scheduler, processed=None):\n" in code
    body = code[code.index(f"\ndef {name}(tmp_path):\n"):]
    drive = f"drive(scheduler, OPS, check={check})" if always else "drive(scheduler, OPS)\n"
    assert drive in body and body.rstrip().endswith(f"{check}(scheduler)")
    assert " ".join(assertion_message(category).split()[:5]) in code
    assert all(len(line) <= 88 for line in code.splitlines()) and "kvspec" not in code


def test_a_retention_hit_test_asserts_the_hit_the_request_was_owed():
    """What a user loses: the request's hit (what its first
    get_computed_blocks() found) at least what earlier requests left cached for it; the request
    and the figure are taken from the finding only as a plain name and a number."""
    finding = attrs.evolve(_finding(Category.STATE_RETENTION_HIT),
                           detail="retention_hit: request r0: a hit of 0 tokens; retention owes at least 64, r1's "
                                  "replay boundary (after step)")
    code = engine_test_code(finding, "0.34.0")
    compile(code, "t.py", "exec")
    assert "\ndef test_request_hits_the_prefix_blocks_earlier_requests_left_cached(tmp_path):\n" in code
    assert "hits.setdefault(request.request_id, found[1])" in code and "drive(scheduler, OPS)\n" in code
    assert 'hit = hits.get("r0", 0)\n    assert hit >= 64, (' in code
    assert all(len(line) <= 88 for line in code.splitlines())
    for detail in ("retention_hit: something else", "request r0); import os: a hit of 1 tokens; retention owes "
                                                    "at least 64"):
        with pytest.raises(Unscriptable, match="names no request and owed hit"):
            engine_test_code(attrs.evolve(finding, detail=detail), "0.34.0")


@pytest.mark.parametrize("category, name, check, body", [
    (Category.STATE_MAMBA_STATE, "test_mamba_group_keeps_the_block_of_the_running_state",
     "    for request in scheduler.running:\n        num_computed = request.num_computed_tokens\n"
     "        for group_id in [0, 1]:", "        assert_mamba_state_held(scheduler)\n        return outputs\n"),
    (Category.STATE_TABLE_COVERAGE, "test_full_attention_block_table_covers_computed_tokens",
     "        for group_id in [2]:", "drive(scheduler, OPS, check=assert_full_attention_tables_cover)"),
    (Category.STATE_HIT_GROUPS, "test_every_group_trims_its_hit_blocks_to_the_common_hit",
     "num_blocks = (num_computed_tokens + block_size - 1) // block_size", "watch_lookups(scheduler)"),
    (Category.STATE_LOOKUP_PURITY, "test_get_computed_blocks_takes_no_reference",
     "ref_cnts = [block.ref_cnt for block in manager.block_pool.blocks]", "watch_lookups(scheduler)"),
    (Category.STATE_RESET, "test_reset_prefix_cache_succeeds_iff_no_block_is_in_use",
     "assert bool(reset) is not bool(in_use), (", "watch_resets(scheduler)"),
    (Category.STATE_ZEROING_MISSED, "test_new_attention_blocks_are_handed_out_for_zeroing",
     "                for group_id in [2]\n", "watch_zeroing(scheduler)"),
])
def test_a_rule_on_the_managers_calls_is_checked_where_the_scheduler_makes_them(category, name, check, body):
    """Mamba state, coverage, the lookup rules, reset and zeroing: checked
    after each schedule() on the groups of the layout vLLM built, or on the
    manager's own call wrapped where the scheduler calls it, in the stateful
    test's words for the same rule."""
    from kvspec.emit.stateful_test import assertion_message

    code = engine_test_code(_finding(category), "0.34.0")
    compile(code, f"{name}.py", "exec")
    test = code[code.index(f"\ndef {name}(tmp_path):\n    scheduler = make_scheduler(str(tmp_path))\n"):]
    assert check in code and body in test
    assert test.rstrip().endswith("drive(scheduler, OPS)" if "watch" in body else ")")
    assert " ".join(assertion_message(category).split()[:5]) in code
    assert all(len(line) <= 88 for line in code.splitlines()) and "kvspec" not in code


def _no_connector(category: Category, **settings) -> Finding:
    """The fixture's finding as one of ``category`` with no KV connector (an
    evicted block's test is written for a connector vLLM ships), its settings
    changed as given."""
    finding = _finding(category)
    engine = {k: v for k, v in finding.run["engine_settings"].items() if k != "kv_connector"}
    return attrs.evolve(finding, run={**finding.run, "engine_settings": {**engine, **settings}})


@pytest.mark.parametrize("category, name, check, body", [
    (Category.STATE_TABLE_APPEND_ONLY, "test_running_request_block_table_is_append_only",
     "kept = all(new in (old, null_block_id) for old, new in zip(before, blocks))",
     "    assert_block_tables_append_only = block_table_check(scheduler)\n"),
    (Category.STATE_ZEROING, "test_only_newly_allocated_blocks_are_handed_out_for_zeroing",
     "and tables.get(key, [])[slot : slot + 1] != [block_id]", "    watch_zeroed_blocks(scheduler)\n"),
    (Category.STATE_HIT_BOUNDS, "test_prefix_cache_hit_leaves_a_token_to_compute",
     "assert num_computed_tokens % 64 == 0, (", "    watch_lookups(scheduler)\n"),
    (Category.STATE_EVICTED_FINDABLE, "test_evicted_blocks_are_no_longer_cached",
     "assert block.block_hash is None and block_id not in mapped, (", "    watch_evictions(scheduler)\n"),
])
def test_each_remaining_rule_is_checked_where_the_scheduler_changes_what_it_reads(category, name, check, body):
    """Append-only tables after each schedule() and update_from_output();
    zeroing around take_new_block_ids(), the hit's bounds around
    get_computed_blocks(), eviction around evict_blocks(): in the stateful
    test's words for the same rule, named after the behaviour."""
    from kvspec.emit.engine_test import engine_assertion_message, engine_test_name
    from kvspec.emit.stateful_test import assertion_message

    finding = _no_connector(category)
    code = engine_test_code(finding, "0.34.0")
    compile(code, f"{name}.py", "exec")
    assert engine_test_name(finding) == name and engine_assertion_message(finding) == assertion_message(category)
    test = code[code.index(f"\ndef {name}(tmp_path):\n    scheduler = make_scheduler(str(tmp_path))\n"):]
    assert check in code and body in test
    drive = "drive(scheduler, OPS, check=assert_block_tables_append_only)" \
        if category is Category.STATE_TABLE_APPEND_ONLY else "drive(scheduler, OPS)"
    assert test.rstrip().endswith(drive)
    assert " ".join(assertion_message(category).split()[:5]) in code
    assert all(len(line) <= 88 for line in code.splitlines())
    assert "kvspec" not in code and "finding" not in code.lower()


def test_hit_bounds_is_checked_on_the_block_the_settings_end_a_hit_on():
    """The hash block under partial hash hits, the scheduler block otherwise;
    no hit at all with prefix caching off; settings that do not say are no test."""
    partial = engine_test_code(_no_connector(Category.STATE_HIT_BOUNDS, partial_hash_hits=True, hash_block_size=16),
                               "0.34.0")
    assert "assert num_computed_tokens % 16 == 0, (" in partial and "hash block size 16" in partial
    plain = engine_test_code(_no_connector(Category.STATE_HIT_BOUNDS, hash_block_size=16), "0.34.0")
    assert "assert num_computed_tokens % 64 == 0, (" in plain and "scheduler block size 64" in plain
    off = engine_test_code(_no_connector(Category.STATE_HIT_BOUNDS, enable_caching=False), "0.34.0")
    assert "assert num_computed_tokens == 0, (" in off and "% 64" not in off
    with pytest.raises(Unscriptable, match="do not say whether prefix caching and partial hash hits are on"):
        engine_test_code(_no_connector(Category.STATE_HIT_BOUNDS, partial_hash_hits=None), "0.34.0")
    with pytest.raises(Unscriptable, match="no valid scheduler_block_size"):
        engine_test_code(_no_connector(Category.STATE_HIT_BOUNDS, scheduler_block_size="64; import os"), "0.34.0")


EVICTED = FIXTURE.parent / "finding_engine_evicted_findable_0.34.0.json"


def test_an_evicted_block_test_writes_kvspecs_connector_into_itself():
    """Only kvspec's connector fails loads: a finding found with it gets a
    test that writes the connector (ExternalStoreConnector, vLLM's public
    KVConnectorBase_V1) and its failing load plan into itself, importing
    nothing of kvspec (run on the mutant and the release by
    tests/integration/test_own_connector.py)."""
    finding = Finding.from_dict(json.loads(EVICTED.read_text()))
    assert finding.run["engine_settings"]["kv_connector"] == "KvspecConnector"
    code = engine_test_code(finding, "0.34.0")
    compile(code, "test_it.py", "exec")
    assert "class ExternalStoreConnector(KVConnectorBase_V1, SupportsHMA):" in code
    assert '{"offer": 100, "async": False, "delay": 1, "fail": 1}' in code
    assert "    watch_evictions(scheduler)\n    drive(scheduler, OPS)" in code
    assert "kvspec" not in code and all(len(line) <= 88 for line in code.splitlines())


@pytest.mark.parametrize("kind, finding", engine_findings_of_every_kind(), ids=[kind for kind, _ in engine_findings_of_every_kind()])
def test_every_engine_test_passes_ruff_check_and_format_under_vllms_configuration(tmp_path, kind, finding):
    """A test is offered only if it lints clean: each kind's, as vLLM lints
    its tests (ruff check and ruff format, vLLM's configuration; a name bound
    and never read, F841, kept the lookup tests from being offered)."""
    assert_ruff_clean_as_vllm_lints(engine_test_code(finding, "0.34.0"), tmp_path, "test_it.py")


def test_hit_length_and_zeroing_say_where_no_test_is_written():
    """hit_length's leading run is written for one full-attention group (its
    block the hash block, no EAGLE drop); zeroing for layouts vLLM zeroes
    (with a Mamba group)."""
    with pytest.raises(Unscriptable, match="one full-attention group"):
        engine_test_code(_finding(Category.STATE_HIT_LENGTH), "0.34.0")
    one = _finding(Category.STATE_HIT_LENGTH)
    settings = {**one.run["engine_settings"], "groups": one.run["engine_settings"]["groups"][2:]}
    code = engine_test_code(attrs.evolve(one, run={**one.run, "engine_settings": settings}), "0.34.0")
    assert "num_full_blocks = (request.num_tokens - 1) // 64" in code
    assert "assert num_computed_tokens == num_cached * 64, (" in code
    with pytest.raises(Unscriptable, match="only on layouts with Mamba groups"):
        engine_test_code(attrs.evolve(one, category=Category.STATE_ZEROING_MISSED,
                                      run={**one.run, "engine_settings": settings}), "0.34.0")


@pytest.mark.parametrize("words, name, check", [
    ("request r1, group 0: freed block 1 (slot 0) lies ahead of block 2 (slot 1) in the free queue; a freed "
     "request's blocks join it tail first (reverse slot order)",
     "test_freed_request_blocks_join_the_free_queue_in_reverse_order",
     "        for group_id in [2]:\n            blocks = managers[group_id].req_to_blocks.get("),
    ("block 5, newly free and cached, lies ahead of blocks that stayed free (a freed cached block joins the "
     "tail: least recently used first)", "test_freed_cached_blocks_join_the_free_queue_tail",
     "assert block_id in behind, ("),
    ("blocks 3 and 4 stayed free but changed their order in the queue",
     "test_blocks_that_stay_free_keep_their_eviction_order", "assert stayed == [block_id for block_id in"),
    ("block 3, newly free, lies among blocks that stayed free", "test_freed_blocks_join_the_free_queue_at_an_end",
     "assert free_after[first : first + len(stayed)] == stayed, ("),
    ("block 1 left the free queue's head while block 2, behind it, was taken (allocation pops from the head), "
     "and the operation freed nothing it could have come back by",
     "test_allocation_takes_blocks_from_the_free_queue_head", "assert taken == free_before[: len(taken)], ("),
])
def test_a_free_order_test_pins_the_part_the_finding_broke(words, name, check):
    """The part by the words of the rule's message, as the stateful test
    picks it: a freed request's blocks around KVCacheManager.free, the
    others around each BlockPool.free_blocks; the test's name and message
    are the part's (what with_engine_test runs and expects)."""
    from kvspec.emit.engine_test import engine_assertion_message, engine_test_name

    finding = attrs.evolve(_finding(Category.STATE_FREE_ORDER), detail=f"state_free_order: free_order: {words}")
    code = engine_test_code(finding, "0.34.0")
    compile(code, f"{name}.py", "exec")
    assert engine_test_name(finding) == name and f"\ndef {name}(tmp_path):\n" in code and check in code
    assert " ".join(engine_assertion_message(finding).split()[:6]) in code
    watch = "watch_allocations" if "left the free queue's head" in words else "watch_frees"
    assert f"    {watch}(scheduler)\n    drive(scheduler, OPS)\n" in code
    assert all(len(line) <= 88 for line in code.splitlines()) and "kvspec" not in code
    with pytest.raises(Unscriptable, match="no test is written for this part of free_order"):
        engine_test_code(attrs.evolve(finding, detail="free_order: blocks 1 and 2 swapped"), "0.34.0")


def test_a_kind_without_a_test_says_why():
    """Every state rule has an engine test now; a part of free_order no test
    is written for, or a kind that is not a state rule, says why."""
    assert all(c in ENGINE_TEST_KINDS for c in Category if c.value.startswith("state_"))
    odd = attrs.evolve(_finding(Category.STATE_FREE_ORDER), detail="free_order: blocks 1 and 2 swapped")
    with pytest.raises(Unscriptable, match="no test is written for this part of free_order .written for: .*"
                                           "left the free queue's head"):
        engine_test_code(odd, "0.34.0")
    other = next(c for c in Category if c not in ENGINE_TEST_KINDS)
    with pytest.raises(Unscriptable, match=f"no engine regression test for {other.value} findings yet"):
        engine_test_code(_finding(other), "0.34.0")
    with pytest.raises(Unscriptable, match="published release"):
        engine_test_code(_finding(Category.STATE_WINDOW), "a-tree")


def test_the_report_folds_the_test_anew_with_both_runs_and_its_command():
    """The Markdown shows the test emitted anew from the finding's validated
    inputs (never the stored code), both runs and the pytest command."""
    from kvspec.report.finding import render_markdown, render_text

    window = FIXTURE.parent / "finding_engine_window_frees_early_0.34.0.json"
    finding = Finding.from_dict(json.loads(window.read_text()))
    name = "test_sliding_window_keeps_the_blocks_its_next_step_reads"
    runs = [{"against": "vllm 0.34.0 + window_frees_early", "must": "failed", "outcome": "failed",
             "failure": "the test's assertion", "as_expected": True},
            {"against": "unmutated vllm 0.34.0", "must": "passed", "outcome": "passed", "as_expected": True}]
    finding = attrs.evolve(finding, regression_test={
        "test_name": name, "module": None, "proposed": True, "code": "import os  # stored, not shown",
        "verified": runs, "other_side": None, "lint": {"outcome": "passed"}})
    markdown = render_markdown(finding)
    assert f"Add as `tests/v1/core/{name}.py` of vLLM" in markdown and "# stored, not shown" not in markdown
    assert engine_test_code(finding, "0.34.0") in markdown
    assert (f"Regression test {name}, for tests/v1/core: failed on the test's assertion on vllm 0.34.0 + "
            "window_frees_early; passed on unmutated vllm 0.34.0; ruff check and ruff format --check with the "
            "release's configuration: passed") in markdown
    assert f"pytest tests/v1/core/{name}.py::{name}" in markdown
    assert f"regression test {name}" in render_text(finding)
    # Not proposed (it did not fail as the finding did): said, not folded.
    unoffered = attrs.evolve(finding, regression_test={**finding.regression_test, "proposed": False,
                                                       "why_not_proposed": "it did not fail on X as the finding did"})
    markdown = render_markdown(unoffered)
    assert "not proposed: it did not fail on X as the finding did" in markdown and "```python" not in markdown


def test_a_free_order_test_is_folded_and_run_under_its_parts_name():
    """free_order's test is named by the part broken: the Markdown's file
    and pytest command say that name (they said None.py before)."""
    from kvspec.report.finding import render_markdown

    window = FIXTURE.parent / "finding_engine_window_frees_early_0.34.0.json"
    finding = Finding.from_dict(json.loads(window.read_text()))
    name = "test_allocation_takes_blocks_from_the_free_queue_head"
    runs = [{"against": "vllm 0.34.0 + allocate_from_queue_tail", "must": "failed", "outcome": "failed",
             "failure": "the test's assertion", "as_expected": True},
            {"against": "unmutated vllm 0.34.0", "must": "passed", "outcome": "passed", "as_expected": True}]
    finding = attrs.evolve(finding, category=Category.STATE_FREE_ORDER,
                           detail="state_free_order: free_order: block 1 left the free queue's head while block 17, "
                                  "behind it, was taken (allocation pops from the head) (after step)",
                           regression_test={"test_name": name, "module": None, "proposed": True, "code": "",
                                            "verified": runs, "other_side": None, "lint": {"outcome": "passed"}})
    markdown = render_markdown(finding)
    assert f"Add as `tests/v1/core/{name}.py` of vLLM" in markdown and "None.py" not in markdown
    assert f"pytest tests/v1/core/{name}.py::{name}" in markdown


def test_with_no_verify_test_the_test_is_written_not_offered(tmp_path):
    from kvspec.findings.engine import with_engine_test
    from kvspec.subjects.subject import mutant_subject

    window = FIXTURE.parent / "finding_engine_window_frees_early_0.34.0.json"
    finding = with_engine_test(Finding.from_dict(json.loads(window.read_text())), tmp_path / "f.json",
                               mutant_subject("0.34.0", "window_frees_early"), verify=False)
    test = finding.regression_test
    assert test["proposed"] is False and test["why_not_proposed"] == "not run (--no-verify-test)"
    assert (tmp_path / "f" / test["file_name"]).read_text() == test["code"] and not test["verified"]
    # A kind no test is written for says why, and nothing is written.
    odd = attrs.evolve(_finding(Category.STATE_FREE_ORDER), detail="free_order: blocks 1 and 2 swapped")
    other = with_engine_test(odd, tmp_path / "g.json", mutant_subject("0.34.0", "window_frees_early"), verify=False)
    assert other.regression_test["why_not_proposed"].startswith("no test written: no test is written for this "
                                                                "part of free_order")
    assert not (tmp_path / "g").exists()
