"""The test a stateful finding carries reads like one of vLLM's own
(tests/v1/core): the release's helpers, a behaviour's name, vLLM's words,
nothing of kvspec, ruff-clean under vLLM's configuration; the report says
which module it extends and what failed on each side; and it is proposed only
when none of vLLM's own tests, asked first, already catches the finding."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import attrs
import pytest

from kvspec.emit.stateful_test import FREE_ORDER_PARTS, assertion_message, emit_stateful_test, stateful_test_name
from kvspec.emit.vllm_tests import Idiom
from kvspec.model.capabilities import Capabilities
from kvspec.model.finding import Category, Finding
from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
from kvspec.model.program import Program
from kvspec.report.finding import render_markdown, render_text

from tests.support import VLLM_CATCHER as CATCHER, asked_vllm_tests as _asked

FIXTURES = Path(__file__).parent.parent / "fixtures"
# A licence header as the emitter takes it from the release's own test files
# (a stand-in here: kvspec carries no third party's header).
HEADER = ("# (the release's licence line)",
          "# (the release's attribution line)")

SWA_MAMBA = CoordinatorConfig(groups=(KVCacheGroup(GroupKind.SLIDING_WINDOW, 4, sliding_window=4),
                                      KVCacheGroup(GroupKind.MAMBA_ALIGN, 4)),
                              scheduler_block_size=4, hash_block_size=4)
TWO_FULL = CoordinatorConfig(groups=(KVCacheGroup(GroupKind.FULL_ATTENTION, 2),
                                     KVCacheGroup(GroupKind.FULL_ATTENTION, 4),
                                     KVCacheGroup(GroupKind.SLIDING_WINDOW, 4, sliding_window=4)),
                             scheduler_block_size=4, hash_block_size=2)
PROMPT = list(range(1, 11))
OTHER = [5, 9, 2, 40000, 7, 7, 1, 3, 12, 11, 10, 4, 8]  # not a range: laid out as a list


def _allocate(rid, n, hit, **extra):
    kwargs = {"num_new_computed_tokens": hit, "new_computed_blocks": "computed", "num_external_computed_tokens": 0,
              "num_lookahead_tokens": 0, "full_sequence_must_fit": True, "has_scheduled_reqs": False, **extra}
    return {"call": "allocate_slots", "id": rid, "num_new_tokens": n, "kwargs": kwargs, "allocated": True}


def _step(rid, n, hit=0, boundary=True):
    return [{"call": "op", "op": {"do": "schedule"}}, {"call": "new_step_starts"},
            {"call": "get_computed_blocks", "id": rid, "hit": hit},
            *([{"call": "set_shared_prefix_boundary", "id": rid}] if boundary else []),
            _allocate(rid, n, hit), {"call": "set_computed", "id": rid, "value": hit + n},
            {"call": "append_output", "id": rid, "tokens": [100001]},
            {"call": "set_status", "id": rid, "status": "RUNNING"},
            {"call": "take_new_block_ids"}, {"call": "take_kv_cache_block_copies"}]


# A program of every kind of call the worker records, ending in a schedule step.
TRACE = [
    {"call": "op", "op": {"do": "arrive", "id": "r0", "tokens": PROMPT}},
    {"call": "request", "id": "r0", "tokens": PROMPT}, *_step("r0", 10),
    {"call": "op", "op": {"do": "finish", "id": "r0"}},
    {"call": "set_status", "id": "r0", "status": "FINISHED_STOPPED"}, {"call": "free", "id": "r0"},
    {"call": "op", "op": {"do": "evict", "id": "r0", "from_block": 1}}, {"call": "evict_blocks", "ids": [3, 2]},
    {"call": "op", "op": {"do": "reset"}}, {"call": "reset_prefix_cache", "returned": True},
    {"call": "op", "op": {"do": "arrive", "id": "r1", "tokens": OTHER}},
    {"call": "request", "id": "r1", "tokens": OTHER},
    {"call": "op", "op": {"do": "arrive", "id": "r2", "tokens": PROMPT[:6]}},
    {"call": "request", "id": "r2", "tokens": PROMPT[:6]},
    *_step("r1", 12, 0, boundary=False),
    {"call": "op", "op": {"do": "preempt", "id": "r1"}},
    {"call": "set_status", "id": "r1", "status": "PREEMPTED"}, {"call": "free", "id": "r1"},
    {"call": "op", "op": {"do": "schedule", "budget": 8}}, {"call": "new_step_starts"},
    {"call": "get_computed_blocks", "id": "r2", "hit": 4},
    {"call": "truncate_computed_blocks", "id": "r2", "tokens": 4},
    {"call": "set_drafts", "id": "r2", "count": 2},
    _allocate("r2", 1, 4, num_external_computed_tokens=1), {"call": "set_computed", "id": "r2", "value": 6},
    {"call": "append_output", "id": "r2", "tokens": [100002, 100003]},
    {"call": "set_status", "id": "r2", "status": "RUNNING"},
    {"call": "reset_prefix_cache", "returned": None},
    {"call": "take_new_block_ids"}, {"call": "take_kv_cache_block_copies"},
]
STATEFUL = [c for c in Category if assertion_message(c)] + [Category.SUBJECT_CRASH, Category.PRECONDITION]


def _finding(category, config=SWA_MAMBA, detail="a kvspec finding", **more):
    program = Program(config, 64, 128, ops=({"do": "arrive", "id": "r0", "tokens": PROMPT}, {"do": "schedule"}))
    return Finding(source="fuzz", verdict=f"DISCREPANCY: {category.value}", category=category,
                   compared={"differential": "stateful", "capabilities": {}},
                   inputs={"program": program.as_dict()}, detail=detail, **more)


def _ruff(*args, cwd):
    from ruff.__main__ import find_ruff_bin

    return subprocess.run([str(find_ruff_bin()), *args], capture_output=True, text=True, cwd=cwd)


def _ruff_clean(tmp_path, code, name):
    (tmp_path / "pyproject.toml").write_text((FIXTURES / "vllm-0.33.0-ruff.toml").read_text())
    for module in ("vllm/__init__.py", "vllm/utils/__init__.py", "vllm/utils/hashing.py", "vllm/v1/__init__.py",
                   "vllm/v1/core/__init__.py", "vllm/v1/core/kv_cache_utils.py", "vllm/v1/core/kv_cache_manager.py",
                   "vllm/v1/kv_cache_interface.py", "vllm/v1/request.py", "vllm/sampling_params.py",
                   "tests/__init__.py", "tests/v1/__init__.py", "tests/v1/core/__init__.py",
                   "tests/v1/core/test_prefix_caching.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).touch()
    test = tmp_path / "tests" / "v1" / "core" / f"{name}.py"
    test.write_text(code)
    rel = str(test.relative_to(tmp_path))
    for args in (("check", "--no-cache", rel), ("format", "--no-cache", "--check", "--diff", rel)):
        run = _ruff(*args, cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr + code


@pytest.mark.parametrize("helpers", [True, False], ids=["helpers", "own-builder"])
@pytest.mark.parametrize("category", STATEFUL, ids=lambda c: c.value)
def test_every_stateful_test_reads_like_vllms_and_is_ruff_clean(tmp_path, category, helpers):
    config = TWO_FULL if category is Category.STATE_HIT_GROUPS else SWA_MAMBA
    trace = TRACE
    if category in (Category.STATE_HIT_GROUPS, Category.STATE_HIT_BOUNDS, Category.STATE_HIT_LENGTH,
                    Category.STATE_LOOKUP_PURITY):
        trace = TRACE[:TRACE.index({"call": "truncate_computed_blocks", "id": "r2", "tokens": 4})]
    if category is Category.SUBJECT_CRASH:  # vLLM raised in the last lookup
        trace = trace[:-11] + [{"call": "get_computed_blocks", "id": "r2", "hit": None}]
    f = _finding(category, config, observations={"error": "AssertionError: no"})
    caps = Capabilities(request_keywords=("request_id", "prompt_token_ids", "sampling_params", "pooling_params",
                                          "block_hasher", "eos_token_id"))
    code = emit_stateful_test(f, trace, caps, Idiom(helpers=helpers, header=HEADER))
    assert code is not None
    name = stateful_test_name(f)
    assert f"\ndef {name}():\n" in code and name.startswith("test_")
    assert "kvspec" not in code.lower() and "monkeypatch" not in code and "inspect" not in code
    assert code.startswith(HEADER[0])
    ast.parse(code)
    message = assertion_message(category)
    if message:
        assert message.split()[0] in code  # the rule, in vLLM's words, is the assertion's message
    if category not in (Category.PRECONDITION,):
        assert ("make_request(" in code) is helpers and ("make_kv_cache_manager(" in code) is helpers
    _ruff_clean(tmp_path, code, name)


FINISH_R0 = TRACE[:TRACE.index({"call": "op", "op": {"do": "evict", "id": "r0", "from_block": 1}})]
EVICT_R0 = TRACE[:TRACE.index({"call": "op", "op": {"do": "reset"}})]


@pytest.mark.parametrize("part", list(FREE_ORDER_PARTS))
def test_a_free_order_test_pins_the_part_of_the_rule_the_finding_broke(tmp_path, part):
    """free_order has several parts: the test is named after the one broken
    (chosen by the rule's own words in the finding), compares the free block
    queue before and after the operation, and says it in vLLM's words."""
    words, name, message = FREE_ORDER_PARTS[part]
    f = _finding(Category.STATE_FREE_ORDER, detail=f"free_order: block 2 ... ({words}) (after finish r0)")
    code = emit_stateful_test(f, FINISH_R0, Capabilities(), Idiom(helpers=True, header=HEADER))
    assert stateful_test_name(f) == name and assertion_message(f) == message
    assert f"\ndef {name}():\n" in code and "\ndef free_queue(manager):\n" in code
    assert code.index("free_before = free_queue(manager)") < code.index("manager.free(r0)") \
        < code.index("free_after = free_queue(manager)")
    assert " ".join(message.split()[:4]) in code
    if part == "reverse":  # the freed request's table, taken before the free, in reverse
        assert 'if request_id not in {"r0"}' in code and "reversed(blocks)" in code
    _ruff_clean(tmp_path, code, name)


def test_a_part_of_free_order_no_test_is_written_for_says_why(tmp_path):
    from kvspec.emit.stateful_test import no_test_why
    from kvspec.findings import stateful

    f = _finding(Category.STATE_FREE_ORDER, detail="free_order: block 3 left the free queue's head while ...")
    assert stateful_test_name(f) is None and emit_stateful_test(f, FINISH_R0, Capabilities(), Idiom()) is None
    done = stateful.with_regression_test(f, tmp_path / "f.json", FINISH_R0, Capabilities(), None, tests_root=None)
    assert done.regression_test == {"test_name": None, "proposed": False,
                                    "why_not_proposed": f"no test written: {no_test_why(f)}"}
    assert "no test is written for this part of free_order" in no_test_why(f)
    assert "no regression test: no test is written for this part of free_order" in render_text(done)
    engine_only = no_test_why(_finding(Category.STATE_RETENTION_HIT))
    assert "observed on engine programs only" in engine_only


def test_an_evicted_block_test_names_the_blocks_evict_blocks_was_given(tmp_path):
    f = _finding(Category.STATE_EVICTED_FINDABLE)
    code = emit_stateful_test(f, EVICT_R0, Capabilities(), Idiom(helpers=True, header=HEADER))
    name = stateful_test_name(f)
    assert name == "test_evicted_blocks_are_no_longer_cached"
    assert code.index("manager.evict_blocks({2, 3})") < code.index("for block_id in [2, 3]:")
    assert "block.block_hash is None and block_id not in mapped" in code
    assert "\ndef cached_block_ids(pool):\n" in code and "_dup_ids" in code  # every release's hash map
    _ruff_clean(tmp_path, code, name)


def test_the_second_full_attention_groups_test_is_named_after_it():
    assert stateful_test_name(_finding(Category.STATE_HIT_GROUPS, TWO_FULL)) == \
        "test_second_full_attention_group_trims_hit_blocks"
    assert stateful_test_name(_finding(Category.STATE_HIT_GROUPS)) == \
        "test_every_group_trims_its_hit_blocks_to_the_common_hit"


def test_only_the_calls_up_to_the_broken_rule_and_defaults_left_out():
    code = emit_stateful_test(_finding(Category.STATE_ZEROING_MISSED), TRACE, Capabilities(), Idiom(helpers=True))
    # At vLLM's defaults: no keyword.  Not at them: said.
    assert "num_lookahead_tokens" not in code and "full_sequence_must_fit=True" in code
    assert "num_external_computed_tokens=1" in code
    # The step under test collects what it allocated, then asserts on take_new_block_ids.
    assert code.index("allocated = set()") > code.index("manager.free(r1)")
    assert code.rstrip().endswith(")") and "assert allocated <= zeroed" in code


def test_an_untrusted_trace_makes_no_test():
    bad = [dict(e) for e in TRACE]
    bad[1] = {**bad[1], "id": "r0); import os; os.system('x'"}
    assert emit_stateful_test(_finding(Category.STATE_LEAK), bad, Capabilities(), Idiom()) is None
    odd = TRACE + [{"call": "open('/etc/passwd')"}]
    assert emit_stateful_test(_finding(Category.STATE_LEAK), odd, Capabilities(), Idiom()) is None


def test_the_report_names_the_module_and_what_failed_on_each_side():
    record = {"test_name": "test_new_attention_blocks_are_handed_out_for_zeroing", "proposed": True,
              "module": "tests/v1/core/test_prefix_caching.py",
              "lint": {"outcome": "passed", "against": "ruff"},
              "verified": [{"outcome": "failed", "must": "failed", "as_expected": True, "against": "vllm 0.27.1",
                            "failure": "the test's assertion"},
                           {"outcome": "passed", "must": "passed", "as_expected": True,
                            "against": "vllm 0.28.0, the first release without sliding_window_blocks_not_zeroed"}]}
    text = render_markdown(_finding(Category.STATE_ZEROING_MISSED, regression_test=record))
    assert "test_new_attention_blocks_are_handed_out_for_zeroing, to add to tests/v1/core/test_prefix_caching.py" \
        in text
    assert "failed on the test's assertion on vllm 0.27.1" in text
    assert "passed on vllm 0.28.0, the first release without" in text
    assert "ruff check and ruff format --check with the release's configuration: passed" in text
    assert "test_prefix_cache_registration" not in text
    # The code is emitted anew from the recorded calls, never copied from the finding.
    shown = render_markdown(_finding(Category.STATE_ZEROING_MISSED, regression_test={
        **record, "trace": TRACE, "code": "import os  # not shown", "idiom": {"helpers": "tests.v1.core.test_prefix_caching"}}))
    assert "Regression test for tests/v1/core/test_prefix_caching.py" in shown
    assert "def test_new_attention_blocks_are_handed_out_for_zeroing():" in shown and "import os" not in shown
    bad = [*TRACE[:1], {**TRACE[1], "id": "r0; import os"}, *TRACE[2:]]
    hostile = render_markdown(_finding(Category.STATE_ZEROING_MISSED, regression_test={**record, "trace": bad}))
    assert "def test_" not in hostile
    crash = attrs.evolve(_finding(Category.SUBJECT_CRASH), regression_test={
        **record, "verified": [{**record["verified"][0], "failure": "vLLM's own assert (AssertionError: x)"},
                               {"outcome": "failed", "must": "passed", "as_expected": False, "against": "vllm 0.28.0",
                                "cannot_run": "the test cannot run on vllm 0.28.0: TypeError: unexpected"}]})
    text = render_markdown(crash)
    assert "failed on vLLM's own assert (AssertionError: x) on vllm 0.27.1" in text
    assert "the test cannot run on vllm 0.28.0: TypeError" in text


def test_a_lookup_rule_is_checked_at_the_lookup_that_broke_it():
    """The step looks up r0 then r1; the finding names r1: the check follows
    r1's lookup, and a request no call uses is not made."""
    trace = [{"call": "op", "op": {"do": "arrive", "id": "r0", "tokens": PROMPT}},
             {"call": "request", "id": "r0", "tokens": PROMPT},
             {"call": "op", "op": {"do": "arrive", "id": "r1", "tokens": PROMPT}},
             {"call": "request", "id": "r1", "tokens": PROMPT},
             {"call": "op", "op": {"do": "arrive", "id": "r2", "tokens": PROMPT}},
             {"call": "request", "id": "r2", "tokens": PROMPT},
             *_step("r0", 10)[:-2], {"call": "get_computed_blocks", "id": "r1", "hit": 0},
             {"call": "get_computed_blocks", "id": "r2", "hit": 0}]
    f = _finding(Category.STATE_HIT_GROUPS, TWO_FULL, detail="hit_groups: request r1: group 1 returned 1 blocks")
    code = emit_stateful_test(f, trace, Capabilities(), Idiom(helpers=True))
    lookup = code.index("manager.get_computed_blocks(r1)")
    assert code.index("block_sizes = ") > lookup > code.index("manager.get_computed_blocks(r0)")
    assert "r2" not in code  # looked up after the check: not needed, not made


# -- vLLM's own tests asked first, as for a registration finding ---------------

def _stateful(**more) -> Finding:
    return _finding(Category.STATE_LEAK, **more)


def test_a_stateful_finding_vllm_already_catches_keeps_its_test_unproposed_and_unrun(tmp_path, monkeypatch):
    from kvspec.findings import stateful

    def must_not_run(*args, **kwargs):
        raise AssertionError("a test vLLM's own already catches was run")

    monkeypatch.setattr(stateful, "verify_stateful_test", must_not_run)
    caught = _stateful(vllm_tests=_asked([CATCHER]))
    done = stateful.with_regression_test(caught, tmp_path / "f.json", TRACE, caught.subject_capabilities(),
                                         None, tests_root=None)
    test = done.regression_test
    assert (test["proposed"], test["verified"], test["lint"]) == (False, [], None)
    assert test["why_not_proposed"] == f"vLLM's own {CATCHER} already catches it"
    assert (tmp_path / "f" / test["file_name"]).read_text() == test["code"]  # kept as an artifact
    text, markdown = render_text(done), render_markdown(done)
    assert f"already caught by {CATCHER}: it fails on the subject and passes on the release" in text
    assert "not proposed (vLLM's own test above already catches the finding)" in text
    assert "ruff not run" not in text and "```python" not in markdown
    assert f"Already caught by {CATCHER}" in markdown and done.verdict in markdown  # the finding stays
    many = _stateful(vllm_tests=_asked([CATCHER, *(f"tests/v1/core/t.py::t{i}" for i in range(9))]))
    assert "(and 9 more: tests/v1/core/t.py::t0, tests/v1/core/t.py::t1, tests/v1/core/t.py::t2, ...)" \
        in render_text(many)
    # Not caught: the suite's pass is said, and the test is verified and proposed.
    monkeypatch.setattr(stateful, "verify_stateful_test", lambda *a: {
        "lint": {"outcome": "passed"}, "verified": [{"outcome": "failed", "must": "failed", "as_expected": True,
                                                     "against": "s", "failure": "the test's assertion"}],
        "other_side": None})
    missed = stateful.with_regression_test(_stateful(vllm_tests=_asked([])), tmp_path / "g.json", TRACE,
                                           caught.subject_capabilities(), None, tests_root=None)
    assert missed.regression_test["proposed"] is True
    assert "not caught by vLLM's tests: its 313 CPU tests of these files pass on it" in render_text(missed)
    assert "```python" in render_markdown(missed)


def test_a_release_is_not_asked_and_the_report_says_why():
    from types import SimpleNamespace

    from kvspec.findings.vllm_suite import ask_vllm_tests

    for kind, words in (("release", "on the release they pass by definition"),
                        ("current", "no release tests kvspec knows"), ("source", "not available")):
        asked = ask_vllm_tests(SimpleNamespace(kind=kind), None)
        assert asked["asked"] is False and asked["caught_by"] == [], asked
        finding = _stateful(vllm_tests=asked)
        assert Finding.from_dict(json.loads(json.dumps(finding.to_dict()))).vllm_tests == asked
        assert "vLLM's own tests not asked: " in render_text(finding) and words in render_markdown(finding)
    # The words are kvspec's own, chosen by a known key: a file's text is never shown.
    odd = _stateful(vllm_tests={"asked": False, "why_not": "elsewhere", "reason": "<script>"})
    assert "not asked" not in render_markdown(odd) and "<script>" not in render_markdown(odd)



def test_free_order_and_evicted_block_tests_belong_with_vllms_prefix_caching_tests(tmp_path):
    """vLLM tests the free block queue and evict_blocks in
    tests/v1/core/test_prefix_caching.py: those tests are proposed there, the
    others for the suite's module calling what they check most."""
    from kvspec.emit.vllm_tests import HELPER_FILE, SUITE
    from kvspec.findings.stateful import proposed_module

    for name, body in ((HELPER_FILE, "manager.free(req)\n"), (SUITE[0], "manager.free(a); allocate_slots(b)\n")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    assert proposed_module(tmp_path, Category.STATE_FREE_ORDER) == HELPER_FILE
    assert proposed_module(tmp_path, Category.STATE_EVICTED_FINDABLE) == HELPER_FILE
    assert proposed_module(tmp_path, Category.STATE_LEAK) == SUITE[0]
