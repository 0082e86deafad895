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
_BODIES = {
    Category.SUBJECT_CRASH: "    drive(scheduler, OPS)",
    Category.STATE_BLOCK_ESTIMATE: "    watch_estimates(scheduler)\n    drive(scheduler, OPS)",
    Category.STATE_WINDOW: "    drive(scheduler, OPS, check=assert_window_held)",
}


_ABOUT = ("Driven through vLLM's Scheduler on CPU, on a toy model of the {family} family (its config.json "
          "below), with the settings vLLM {version} derived for its flags.  The KVCacheConfig is built from "
          "vLLM's public config classes rather than by the engine's KV-cache planning (which runs in the GPU "
          "worker): create_scheduler in tests/v1/core/utils.py builds one full-attention group only.")


def _string_lines(text: str, indent: str, width: int = 88) -> str:
    """``text`` as adjacent string literals, one a line, within ``width``."""
    pieces = wrap(text, width - len(indent) - 3).split("\n")
    return "\n".join(f'{indent}"{piece}{" " if i < len(pieces) - 1 else ": "}"' for i, piece in enumerate(pieces))


def emit_engine_test(program: EngineProgram, settings, category: Category, version: str) -> str:
    """The test's code, or ``Unscriptable`` saying why there is none."""
    if category not in _BEHAVIOUR:
        raise Unscriptable(f"no engine regression test for {category.value} findings yet (written for: "
                           f"{', '.join(k.value for k in ENGINE_TEST_KINDS)})")
    values = engine_values(program, settings, version, category is Category.STATE_BLOCK_ESTIMATE)
    check = ""
    if category is Category.STATE_WINDOW:
        check = _WINDOW_CHECK.replace("@MESSAGE@", _string_lines(engine_assertion_message(category) or "",
                                                                 " " * 16))
    template = (_TEST_TEMPLATE.replace("@IMPORTS@", IMPORTS).replace("@CHECK@", check)
                .replace("@DOC@", wrap(_DOCS[category]) + "\n\n"
                         + wrap(_ABOUT.format(family=program.setup.toy.family, version=version)))
                .replace("@NAME@", _BEHAVIOUR[category][0]).replace("@BODY@", _BODIES[category]))
    return engine_code(template, program, values)


def engine_test_code(finding: Finding, version: str) -> str:
    """The test of a stored engine finding, from its validated engine program
    and settings (nothing of the finding's text is copied into code)."""
    program = EngineProgram.from_dict((finding.inputs or {}).get("engine_program"))
    return emit_engine_test(program, (finding.run or {}).get("engine_settings"), finding.category, version)


def rendered_engine_test(finding: Finding, version: str) -> str | None:
    """The test for a report, or None where there is none (the reason is the
    finding's ``regression_test["why_not_proposed"]``)."""
    try:
        return engine_test_code(finding, version)
    except (Unscriptable, KeyError, TypeError, ValueError):
        return None
