"""A regression test, in vLLM's idiom, from an engine finding.

The engine finding's program -- the toy model's config.json, the settings
vLLM derived for its flags, the engine inputs in order -- is the upstream
bug-report script's (``subjects.upstream_repro``): the test is written from
the same validated values and the same engine code (``ENGINE_CODE``: the
scheduler built from vLLM's public config classes, ``add_request``,
``schedule``, ``update_from_output`` with a built ``ModelRunnerOutput``,
``finish_requests``, ``reset_prefix_cache`` as ``EngineCore`` makes them),
not a second translation of the program.  What the test adds is the
assertion of what the finding measured, named after the behaviour:

- ``schedule()`` raising: the test drives the inputs; vLLM's exception fails it;
- a block estimate below the allocation: each ``allocate_slots`` takes no
  more free blocks than the groups' ``get_num_blocks_to_allocate`` estimated;
- a sliding window freed early: after each ``schedule()``, every running
  request keeps real blocks for the window its step attends to.

It imports vLLM and torch only and names neither kvspec nor the finding.
vLLM's ``create_scheduler`` (``tests/v1/core/utils.py``) builds one
full-attention group, so the test builds its scheduler from the derived
settings itself (said in its docstring).
"""

from __future__ import annotations

import re

from kvspec.emit.stateful_test import CACHED_BLOCK_IDS, assertion_message
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding
from kvspec.subjects.upstream_repro import IMPORTS, Unscriptable, engine_code, engine_values, wrap

__all__ = ["ENGINE_TEST_KINDS", "engine_test_name", "engine_assertion_message", "emit_engine_test",
           "engine_test_code", "rendered_engine_test", "CALL_CHECKED"]

# The behaviour each kind pins: (test name, the assertion's message or None:
# vLLM's own exception fails it).
_BEHAVIOUR: dict[Category, tuple[str, str | None]] = {
    Category.SUBJECT_CRASH: ("test_scheduler_step_does_not_raise", None),
    Category.STATE_BLOCK_ESTIMATE: ("test_block_estimate_covers_allocate_slots", "block estimate below allocation"),
    Category.STATE_WINDOW: (
        "test_sliding_window_keeps_the_blocks_its_next_step_reads",
        "a running request's sliding-window block table must hold real blocks for "
        "the window of tokens its next step attends to"),
}
# The pool's own rules, read off the scheduler's KV cache manager after the
# inputs (and, where they hold at every point, after each schedule()): the
# stateful tests' messages, one wording for a rule.
_STATE_RULES = {
    Category.STATE_LEAK: "test_every_block_is_free_once_no_request_holds_one",
    Category.STATE_REF_COUNT: "test_block_ref_cnt_counts_the_block_tables_holding_it",
    Category.STATE_FREE_LIST: "test_free_block_queue_matches_its_counter",
    Category.STATE_FREE_BLOCKS: "test_a_block_is_free_iff_nothing_references_it",
    Category.STATE_FORGET: "test_finished_request_leaves_no_block_table",
    Category.STATE_HASH_MAP: "test_cached_block_map_agrees_with_block_hashes",
    Category.STATE_ONE_GROUP: "test_a_block_belongs_to_one_kv_cache_group",
}
_BEHAVIOUR.update({category: (name, assertion_message(category)) for category, name in _STATE_RULES.items()})
_BEHAVIOUR[Category.STATE_RETENTION_HIT] = (
    "test_request_hits_the_prefix_blocks_earlier_requests_left_cached",
    "a request must hit the prefix blocks earlier requests left in the prefix cache for it")
ENGINE_TEST_KINDS = tuple(_BEHAVIOUR)
# What the test drives: the release's test module calling it most is where it goes.
CALL_CHECKED = "update_from_output"


def engine_test_name(category: Category) -> str | None:
    entry = _BEHAVIOUR.get(category)
    return entry[0] if entry else None


def engine_assertion_message(category: Category) -> str | None:
    entry = _BEHAVIOUR.get(category)
    return entry[1] if entry else None


_WINDOW_CHECK = '''

def assert_window_held(scheduler, processed):
    """Each running request keeps real blocks in its sliding-window block table
    from the first token its step attends to up to its last processed token."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    for request in scheduler.running:
        num_processed = processed.get(request.request_id, 0)
        for manager in managers:
            window = getattr(manager.kv_cache_spec, "sliding_window", None)
            if not window or num_processed == 0:
                continue
            block_size = manager.block_size
            first = max(0, num_processed - window + 1) // block_size
            last = (num_processed - 1) // block_size
            blocks = manager.req_to_blocks[request.request_id][first : last + 1]
            assert not any(block.is_null for block in blocks), (
@MESSAGE@
                f"request {request.request_id} processed "
                f"{num_processed} tokens (sliding window {window}, block size "
                f"{block_size}), yet slots {first}..{last} hold "
                f"{[block.block_id for block in blocks]} (null block: "
                f"{[block.is_null for block in blocks]})"
            )
'''

def _same_blocks(function: str, doc: str, left: tuple[str, str, str], right: tuple[str, str, str]) -> str:
    """A check that two sets of block ids agree: each side (its name, the code
    making it, what a block on that side only is), both differences said."""
    (a, make_a, only_a), (b, make_b, only_b) = left, right
    return (f'''

def {function}(scheduler, processed=None):
    """{doc}"""
    pool = scheduler.kv_cache_manager.block_pool
{make_a}
{make_b}
    assert {a} == {b}, (
@MESSAGE8@
        f"{only_a}: {{sorted({a} - {b})}}, "
        f"{only_b}: {{sorted({b} - {a})}}"
    )
''')


# Each state rule's check: (function, its code, whether it holds at every
# schedule() -- else it is checked once the inputs are driven, when no batch
# is in flight to hold references).
_STATE_CHECKS = {
    Category.STATE_LEAK: ("assert_no_block_leaked", '''

def assert_no_block_leaked(scheduler, processed=None):
    """With no request left in the scheduler, every block but the null block is free."""
    pool = scheduler.kv_cache_manager.block_pool
    if not scheduler.requests:
        num_free = pool.get_num_free_blocks()
        assert num_free == len(pool.blocks) - 1, (
@MESSAGE12@
            f"{len(pool.blocks) - 1 - num_free} blocks are not free"
        )
''', True),
    Category.STATE_REF_COUNT: ("assert_ref_cnt_counts_block_tables", '''

def assert_ref_cnt_counts_block_tables(scheduler, processed=None):
    """Each block's ref_cnt is the number of block tables holding it."""
    manager = scheduler.kv_cache_manager
    held = {}
    for group in manager.coordinator.single_type_managers:
        for blocks in group.req_to_blocks.values():
            for block in blocks:
                held[block.block_id] = held.get(block.block_id, 0) + 1
    for block in manager.block_pool.blocks:
        if not block.is_null:
            assert block.ref_cnt == held.get(block.block_id, 0), (
@MESSAGE16@
                f"block {block.block_id} has ref_cnt {block.ref_cnt}, held by "
                f"{held.get(block.block_id, 0)} block tables"
            )
''', False),
    Category.STATE_FREE_LIST: ("assert_free_queue_matches_its_counter", '''

def assert_free_queue_matches_its_counter(scheduler, processed=None):
    """The free block queue holds each block once, not the null block, and as
    many as num_free_blocks."""
    pool = scheduler.kv_cache_manager.block_pool
    free = [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]
    assert pool.null_block.block_id not in free
    assert len(set(free)) == len(free) == pool.get_num_free_blocks(), (
@MESSAGE8@
        f"{len(free)} blocks in the queue, {len(set(free))} distinct, "
        f"num_free_blocks {pool.get_num_free_blocks()}"
    )
''', True),
    Category.STATE_FREE_BLOCKS: ("assert_free_iff_unreferenced", _same_blocks(
        "assert_free_iff_unreferenced", "The free block queue holds exactly the blocks with ref_cnt == 0.",
        ("free", "    free = {block.block_id for block in pool.free_block_queue.get_all_free_blocks()}",
         "free but referenced"),
        ("unused", "    unused = {\n        block.block_id\n        for block in pool.blocks\n"
                   "        if block.ref_cnt == 0 and not block.is_null\n    }", "unreferenced but not free")), True),
    Category.STATE_FORGET: ("assert_finished_requests_forgotten", '''

def assert_finished_requests_forgotten(scheduler, processed=None):
    """No KV cache group keeps a block table for a request the scheduler freed."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    for group_id, manager in enumerate(managers):
        for request_id in manager.req_to_blocks:
            assert request_id in scheduler.requests, (
@MESSAGE16@
                f"group {group_id} keeps a block table for request {request_id}"
            )
''', True),
    Category.STATE_HASH_MAP: ("assert_hash_map_agrees_with_block_hashes", "\n\n" + "\n".join(CACHED_BLOCK_IDS) + "\n"
                              + _same_blocks(
        "assert_hash_map_agrees_with_block_hashes",
        "The prefix cache's hash map holds exactly the blocks that have a block hash.",
        ("mapped", "    mapped = cached_block_ids(pool)", "mapped without a hash"),
        ("hashed", "    hashed = {block.block_id for block in pool.blocks if block.block_hash is not None}",
         "hashed but not mapped")), True),
    Category.STATE_ONE_GROUP: ("assert_one_group_per_block", '''

def assert_one_group_per_block(scheduler, processed=None):
    """A block other than the null block is held by one KV cache group at a time."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    owners = {}
    for group_id, manager in enumerate(managers):
        for blocks in manager.req_to_blocks.values():
            for block in blocks:
                if not block.is_null:
                    owners.setdefault(block.block_id, set()).add(group_id)
    for block_id, groups in owners.items():
        assert len(groups) == 1, (
@MESSAGE12@
            f"block {block_id} is held by groups {sorted(groups)}"
        )
''', True),
}

_TEST_TEMPLATE = '''\
"""@DOC@
"""

import inspect
import json
import os

@IMPORTS@
@ENGINE_CODE@@CHECK@

def @NAME@(tmp_path):
    scheduler = make_scheduler(str(tmp_path))
@BODY@
'''

_DOCS = {
    Category.SUBJECT_CRASH: "The scheduler's engine steps on these inputs must not raise.",
    Category.STATE_BLOCK_ESTIMATE: "allocate_slots must take no more free blocks than the KV-cache groups' "
                                   "block estimates, the figure the scheduler checks against the free pool.",
    Category.STATE_WINDOW: "A sliding-window group must keep the blocks of the window a running request's "
                           "next step attends to.",
}
_DOCS.update({category: f"{(assertion_message(category) or '')[:1].upper()}{(assertion_message(category) or '')[1:]}."
              for category in _STATE_CHECKS})
_DOCS[Category.STATE_RETENTION_HIT] = ("A request must hit the prefix blocks earlier requests left in the prefix "
                                       "cache for it: the tokens a user does not recompute.")

_BODIES = {
    Category.SUBJECT_CRASH: "    drive(scheduler, OPS)",
    Category.STATE_BLOCK_ESTIMATE: "    watch_estimates(scheduler)\n    drive(scheduler, OPS)",
    Category.STATE_WINDOW: "    drive(scheduler, OPS, check=assert_window_held)",
    **{category: (f"    drive(scheduler, OPS, check={check})\n" if always else "    drive(scheduler, OPS)\n")
       + f"    {check}(scheduler)" for category, (check, _, always) in _STATE_CHECKS.items()},
}
# A retention hit: each request's hit at its first lookup (what
# get_computed_blocks() returned), against the least the finding's request was owed.
_RETENTION_BODY = '''\
    # Each request's prefix cache hit: what its first get_computed_blocks() found.
    hits = {}
    manager = scheduler.kv_cache_manager
    lookup = manager.get_computed_blocks

    def get_computed_blocks(request, *args, **kwargs):
        found = lookup(request, *args, **kwargs)
        hits.setdefault(request.request_id, found[1])
        return found

    manager.get_computed_blocks = get_computed_blocks
    drive(scheduler, OPS)
    hit = hits.get(@ID@, 0)
    assert hit >= @OWED@, (
@MESSAGE8@
        f"request @RID@ hit {hit} tokens; at least @OWED@ were left in the cache for it"
    )'''
_OWED = re.compile(r"request ([A-Za-z0-9_]{1,32}): a hit of \d+ tokens; retention owes at least (\d+)")


_ABOUT = ("Driven through vLLM's Scheduler on CPU, on a toy model of the {family} family (its config.json "
          "below), with the settings vLLM {version} derived for its flags.  The KVCacheConfig is built from "
          "vLLM's public config classes rather than by the engine's KV-cache planning (which runs in the GPU "
          "worker): create_scheduler in tests/v1/core/utils.py builds one full-attention group only.")


def _string_lines(text: str, indent: str, width: int = 88) -> str:
    """``text`` as adjacent string literals, one a line, within ``width``."""
    pieces = wrap(text, width - len(indent) - 3).split("\n")
    return "\n".join(f'{indent}"{piece}{" " if i < len(pieces) - 1 else ": "}"' for i, piece in enumerate(pieces))


def _messages(code: str, message: str) -> str:
    """``@MESSAGEn@``: the assertion's message as string literals indented n."""
    return re.sub(r"@MESSAGE(\d+)@", lambda m: _string_lines(message, " " * int(m.group(1))), code)


def _retention_body(detail: str | None) -> str:
    """The retention test's body, for the request the finding names and the
    hit it was owed (a plain name and a number, validated here)."""
    match = _OWED.search(detail or "")
    if match is None:
        raise Unscriptable("the finding names no request and owed hit (a plain name and a number): no test")
    rid, owed = match.group(1), int(match.group(2))
    return (_RETENTION_BODY.replace("@ID@", f'"{rid}"').replace("@RID@", rid).replace("@OWED@", str(owed)))


def emit_engine_test(program: EngineProgram, settings, category: Category, version: str,
                     detail: str | None = None) -> str:
    """The test's code, or ``Unscriptable`` saying why there is none
    (``detail``: the finding's, read for a retention hit's request and owed hit only)."""
    if category not in _BEHAVIOUR:
        raise Unscriptable(f"no engine regression test for {category.value} findings yet (written for: "
                           f"{', '.join(k.value for k in ENGINE_TEST_KINDS)})")
    values = engine_values(program, settings, version, category is Category.STATE_BLOCK_ESTIMATE)
    body = _retention_body(detail) if category is Category.STATE_RETENTION_HIT else _BODIES[category]
    check = ""
    if category is Category.STATE_WINDOW:
        check = _WINDOW_CHECK.replace("@MESSAGE@", "@MESSAGE16@")
    elif category in _STATE_CHECKS:
        check = _STATE_CHECKS[category][1]
    template = (_TEST_TEMPLATE.replace("@IMPORTS@", IMPORTS).replace("@CHECK@", check)
                .replace("@DOC@", wrap(_DOCS[category]) + "\n\n"
                         + wrap(_ABOUT.format(family=program.setup.toy.family, version=version)))
                .replace("@NAME@", _BEHAVIOUR[category][0]).replace("@BODY@", body))
    return engine_code(_messages(template, engine_assertion_message(category) or ""), program, values)


def engine_test_code(finding: Finding, version: str) -> str:
    """The test of a stored engine finding, from its validated engine program
    and settings (nothing of the finding's text is copied into code)."""
    program = EngineProgram.from_dict((finding.inputs or {}).get("engine_program"))
    return emit_engine_test(program, (finding.run or {}).get("engine_settings"), finding.category, version,
                            finding.detail)


def rendered_engine_test(finding: Finding, version: str) -> str | None:
    """The test for a report, or None where there is none (the reason is the
    finding's ``regression_test["why_not_proposed"]``)."""
    try:
        return engine_test_code(finding, version)
    except (Unscriptable, KeyError, TypeError, ValueError):
        return None
