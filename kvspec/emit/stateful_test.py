"""A regression test, in vLLM's idiom, from a stateful finding.

The worker records every call the program made on vLLM's objects (requests
built, ``new_step_starts``, ``get_computed_blocks``, ``allocate_slots`` with
its arguments, tokens appended, ``free``, ``reset_prefix_cache``,
``evict_blocks``, the step's zeroing and copy-on-write drains).  The test
replays exactly those calls on a ``KVCacheManager`` built as vLLM's own
prefix-caching tests build one, asserts that each call answers as it did
(otherwise the replay diverged: a different failure, said so), then asserts
the broken invariant in plain code on vLLM's own attributes.  It imports
vLLM, pytest and the standard library only: it can be pasted into
``tests/v1/core/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvspec.model.capabilities import Capabilities, expected_regime
from kvspec.model.finding import Category, Finding
from kvspec.model.program import Program, describe_op

__all__ = ["STATE_ASSERT_MESSAGE", "DIVERGED_MESSAGE", "emit_stateful_test", "expected_failure",
           "verify_stateful_test"]

STATE_ASSERT_MESSAGE = "kvspec state invariant"
DIVERGED_MESSAGE = "the replay diverged from the recorded run"

_SPECS = {
    "full_attention": "FullAttentionSpec(block_size={b}, num_kv_heads=1, head_size=8, dtype=torch.float16)",
    "sliding_window": "SlidingWindowSpec(block_size={b}, num_kv_heads=1, head_size=8, dtype=torch.float16, "
                      "sliding_window={w})",
    "mamba_align": "MambaSpec(block_size={b}, shapes=((4, 4),), dtypes=(torch.float16,), "
                   "mamba_cache_mode=\"align\")",
}

_HEADER = '''\
import inspect
from collections import Counter

import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

try:
    from vllm.utils.hashing import sha256
except ImportError:  # older layout
    from vllm.utils import sha256


def _known(fn, wanted):
    """The keyword arguments this vLLM's ``fn`` takes."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in wanted.items() if k in params}


def _held(manager):
    """How many table slots (every group, every request) hold each block."""
    return Counter(
        block.block_id
        for group in manager.coordinator.single_type_managers
        for blocks in group.req_to_blocks.values()
        for block in blocks
    )


def _free_ids(manager):
    return [block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()]


def _tables(manager):
    return {
        (rid, index): [block.block_id for block in blocks]
        for index, group in enumerate(manager.coordinator.single_type_managers)
        for rid, blocks in group.req_to_blocks.items()
    }


def _has_hash(block):
    return getattr(block, "block_hash", getattr(block, "_block_hash", None)) is not None
'''


def _q(value: Any) -> str:
    """A Python literal for data from a finding: json is a subset of
    Python's literal syntax for the ints, strings and lists used here."""
    text = json.dumps(value)
    return text.replace("true", "True").replace("false", "False").replace("null", "None")


def _manager_lines(program: Program, caps: Capabilities) -> list[str]:
    lines = ["def _manager():", "    groups = ["]
    for i, g in enumerate(program.config.groups):
        spec = _SPECS[g.kind.value].format(b=g.block_size, w=g.sliding_window)
        eagle = f", is_eagle_group={g.eagle}" if caps.per_group_eagle else ""
        lines.append(f"        KVCacheGroupSpec([\"layer{i}\"], {spec}{eagle}),")
    lines.append("    ]")
    retention = ""
    if program.retention_interval is not None:
        retention = f", prefix_cache_retention_interval={program.retention_interval}"
    c = program.config
    use_eagle = any(g.eagle for g in c.groups)
    lines += [
        "    config = KVCacheConfig(**_known(KVCacheConfig, dict(",
        f"        num_blocks={program.num_blocks}, kv_cache_tensors=[], kv_cache_groups=groups{retention})))",
        "    return KVCacheManager(**_known(KVCacheManager.__init__, dict(",
        f"        kv_cache_config=config, max_model_len={program.max_model_len}, "
        f"scheduler_block_size={c.scheduler_block_size},",
        f"        hash_block_size={c.hash_block_size}, enable_caching={c.enable_caching}, "
        f"use_eagle={use_eagle},",
        f"        num_prefill_lookahead={c.num_prefill_lookahead}, dcp_world_size={c.dcp_world_size}, "
        f"max_num_batched_tokens={program.max_model_len},",
        f"        max_in_flight_tokens={program.max_model_len}, log_stats=False,",
        "    )))",
    ]
    return lines


def _check_lines(category: Category, program: Program, final_op: dict[str, Any]) -> list[str]:
    """The broken invariant, asserted on vLLM's attributes after the last operation."""
    msg = STATE_ASSERT_MESSAGE
    null = "manager.block_pool.null_block.block_id"
    if category is Category.STATE_REF_COUNT:
        return ["held = _held(manager)",
                f"counts = {{b.block_id: b.ref_cnt for b in manager.block_pool.blocks if b.block_id != {null}}}",
                "assert counts == {i: held.get(i, 0) for i in counts}, (",
                f"    \"{msg}: a block's ref_cnt equals the table slots holding it\")"]
    if category is Category.STATE_FREE_LIST:
        return ["free = _free_ids(manager)",
                f"assert manager.block_pool.get_num_free_blocks() == len(free) == len(set(free)) and {null} not in free, (",
                f"    \"{msg}: the free queue matches its counter, holds no block twice, not the null block\")"]
    if category is Category.STATE_FREE_BLOCKS:
        return [f"unreferenced = {{b.block_id for b in manager.block_pool.blocks if b.ref_cnt == 0}} - {{{null}}}",
                "assert set(_free_ids(manager)) == unreferenced, (",
                f"    \"{msg}: a block is in the free queue iff nothing references it\")"]
    if category is Category.STATE_FORGET:
        return ["left = [key for key in _tables(manager) if key[0] not in running]",
                f"assert not left, \"{msg}: no group keeps a table for a freed or preempted request\""]
    if category is Category.STATE_LEAK:
        return ["assert manager.block_pool.get_num_free_blocks() == len(manager.block_pool.blocks) - 1, (",
                f"    \"{msg}: with no request holding a block, every block but the null one is free\")"]
    if category is Category.STATE_TABLE_COVERAGE:
        sizes = [g.block_size if g.kind.value == "full_attention" else None for g in program.config.groups]
        return [f"sizes = {_q(sizes)}",
                "for (rid, index), blocks in _tables(manager).items():",
                "    if rid in running and sizes[index]:",
                f"        real = [b for b in blocks if b != {null}]",
                "        need = -(-requests[rid].num_computed_tokens // sizes[index])",
                f"        assert len(real) >= need, \"{msg}: a full-attention table covers the computed tokens\""]
    if category is Category.STATE_TABLE_APPEND_ONLY:
        return ["after = _tables(manager)",
                "for key, old in tables_before.items():",
                "    new = after.get(key)",
                "    if new is None or key[0] not in running:",
                "        continue",
                f"    assert len(new) >= len(old) and all(n in (o, {null}) for o, n in zip(old, new)), (",
                f"        \"{msg}: a running request's table slot keeps its block or turns null\")"]
    if category is Category.STATE_RESET:
        return ["assert reset_returned == (not held_before_reset), (",
                f"    \"{msg}: reset_prefix_cache succeeds iff no block is held\")",
                "if reset_returned:",
                "    assert not any(_has_hash(b) for b in manager.block_pool.blocks), (",
                f"        \"{msg}: a successful reset leaves no key\")"]
    if category is Category.STATE_HASH_MAP:
        return ["mapped = set()",
                "for value in manager.block_pool.cached_block_hash_to_block._cache.values():",
                "    blocks = value.values() if isinstance(value, dict) else [value]",
                "    mapped |= {getattr(b, 'block_id', b) for b in blocks}",
                "keyed = {b.block_id for b in manager.block_pool.blocks if _has_hash(b)}",
                f"assert mapped == keyed and {null} not in mapped, (",
                f"    \"{msg}: the hash map and the blocks' own hashes agree\")"]
    if category is Category.STATE_ONE_GROUP:
        return ["owners = {}",
                "for (rid, index), blocks in _tables(manager).items():",
                "    for b in blocks:",
                f"        if b != {null}:",
                "            owners.setdefault(b, set()).add(index)",
                "assert all(len(groups) == 1 for groups in owners.values()), (",
                f"    \"{msg}: a block is held by one KV-cache group at a time\")"]
    if category is Category.STATE_ZEROING_MISSED:
        attention = [i for i, g in enumerate(program.config.groups) if g.kind.value != "mamba_align"]
        return ["after = _tables(manager)",
                f"fresh = {{b for (rid, index), blocks in after.items() if index in {_q(attention)} and rid not in loaded",
                "         for i, b in enumerate(blocks)",
                f"         if b != {null} and (tables_before.get((rid, index)) or [])[i:i + 1] != [b]",
                "         and b not in hit_blocks}",
                "assert fresh <= set(zeroed), (",
                f"    \"{msg}: every fresh attention block a step places is handed out for zeroing\")"]
    if category is Category.STATE_ZEROING:
        return ["after = _tables(manager)",
                "placed = {b for key, blocks in after.items() for i, b in enumerate(blocks)",
                "          if (tables_before.get(key) or [])[i:i + 1] != [b]}",
                "assert set(zeroed) <= placed, (",
                f"    \"{msg}: what is handed out for zeroing are blocks this operation placed\")"]
    return []


_LOOKUP_CHECKS = {
    Category.STATE_HIT_GROUPS: lambda sizes, unit, fa, eagle: [
        "for group, size in zip(found[0].blocks, " + _q(sizes) + "):",
        "    assert len(group) == -(-found[1] // size), (",
        f"        \"{STATE_ASSERT_MESSAGE}: every group holds cdiv(hit, block) blocks for one hit\")",
        "for index in " + _q(fa) + ":",
        "    assert all(not b.is_null and _has_hash(b) for b in found[0].blocks[index]), (",
        f"        \"{STATE_ASSERT_MESSAGE}: full-attention hit blocks are real and registered\")"],
    Category.STATE_HIT_BOUNDS: lambda sizes, unit, fa, eagle: [
        f"assert 0 <= found[1] <= max(0, request.num_tokens - 1) and found[1] % {unit} == 0, (",
        f"    \"{STATE_ASSERT_MESSAGE}: a hit leaves a token to compute and lands on a multiple of {unit}\")"],
    # A one-group model: the leading run of the request's blocks the map holds
    # (a lookup changes no key, so the map is read after it), less EAGLE's block.
    Category.STATE_HIT_LENGTH: lambda sizes, unit, fa, eagle: [
        "held = [kv_cache_utils.make_block_hash_with_group_id(h, 0) in "
        "manager.block_pool.cached_block_hash_to_block._cache",
        f"        for h in request.block_hashes[:max(0, request.num_tokens - 1) // {sizes[0]}]]",
        "run = held.index(False) if False in held else len(held)",
        f"run -= 1 if {eagle} and run else 0",
        f"assert found[1] == run * {sizes[0]}, (",
        f"    \"{STATE_ASSERT_MESSAGE}: the hit is the leading run of registered blocks\")"],
    Category.STATE_LOOKUP_PURITY: lambda sizes, unit, fa, eagle: [
        "assert pool_before == [b.ref_cnt for b in manager.block_pool.blocks] + "
        "[manager.block_pool.get_num_free_blocks()], (",
        f"    \"{STATE_ASSERT_MESSAGE}: a lookup takes no reference and frees no block\")"],
}


def emit_stateful_test(finding: Finding, trace: list[dict[str, Any]] | None, caps: Capabilities) -> str | None:
    """The test's source, or None when the finding's program or trace cannot make one."""
    if not trace:
        return None
    try:
        program = Program.from_dict(finding.inputs["program"])
    except (KeyError, TypeError, ValueError):
        return None
    category = finding.category
    ops = [i for i, entry in enumerate(trace) if entry["call"] == "op"]
    if not ops:
        return None
    final_start = ops[-1]
    final_op = trace[final_start]["op"]
    sizes = [g.block_size for g in program.config.groups]
    fa = [i for i, g in enumerate(program.config.groups) if g.kind.value == "full_attention"]
    partial = expected_regime(program.config, caps).partial_hash_hits
    unit = program.config.hash_block_size if partial else program.config.scheduler_block_size
    name = f"test_kvspec_{category.value}"
    body = [
        "kv_cache_utils.init_none_hash(sha256)",
        "manager = _manager()",
        f"hasher = kv_cache_utils.get_request_block_hasher({program.config.hash_block_size}, sha256)",
        f"params = SamplingParams(max_tokens={program.max_model_len})",
        "requests, running, found = {}, set(), None",
    ]
    if category is Category.PRECONDITION:
        body = body[:1] + ["_manager()  # vLLM refused this geometry"]
        trace = []
    for index, entry in enumerate(trace):
        call, rid = entry["call"], entry.get("id")
        last = index >= final_start
        if call == "op":
            body.append(f"# {describe_op(entry['op'])}")
            if index == final_start:
                body += ["tables_before = _tables(manager)", "zeroed = []"]
                if category is Category.STATE_ZEROING_MISSED:
                    body += ["hit_blocks, loaded = set(), set()  # cache hits, requests given connector tokens"]
            continue
        r = f"requests[{_q(rid)}]" if rid else ""
        if call == "request":
            body.append(f"requests[{_q(rid)}] = Request(**_known(Request.__init__, dict(request_id={_q(rid)}, "
                        f"prompt_token_ids={_q(entry['tokens'])}, sampling_params=params, pooling_params=None, "
                        "block_hasher=hasher, eos_token_id=None, arrival_time=0.0)))")
        elif call == "new_step_starts":
            body.append("manager.new_step_starts()")
        elif call == "get_computed_blocks":
            if last and category is Category.STATE_LOOKUP_PURITY:
                body.append("pool_before = [b.ref_cnt for b in manager.block_pool.blocks] + "
                            "[manager.block_pool.get_num_free_blocks()]")
            body.append(f"found = manager.get_computed_blocks({r})")
            if entry["hit"] is None:  # vLLM raised here: the call is the test
                continue
            if last and category is Category.STATE_ZEROING_MISSED:
                body.append("hit_blocks |= {b.block_id for group in found[0].blocks for b in group}")
            if last and category in _LOOKUP_CHECKS:
                body.append(f"request = {r}")
                body += _LOOKUP_CHECKS[category](sizes, unit, fa, any(g.eagle for g in program.config.groups))
            else:
                body.append(f"assert found[1] == {entry['hit']}, \"{DIVERGED_MESSAGE}\"")
        elif call == "truncate_computed_blocks":
            body.append(f"found = (manager.truncate_computed_blocks(found[0], {entry['tokens']}), {entry['tokens']})")
        elif call == "allocate_slots":
            kwargs = ", ".join(f"{k}=found[0]" if v == "computed" else f"{k}={_q(v)}"
                               for k, v in entry["kwargs"].items())
            call_text = f"manager.allocate_slots({r}, {entry['num_new_tokens']}{', ' + kwargs if kwargs else ''})"
            if last and category is Category.STATE_ZEROING_MISSED and \
                    entry["kwargs"].get("num_external_computed_tokens"):
                body.append(f"loaded.add({_q(rid)})")
            if entry["allocated"] is None:  # vLLM raised here: the call is the test
                body.append(call_text)
            else:
                expect = "is not None" if entry["allocated"] else "is None"
                body.append(f"assert {call_text} {expect}, \"{DIVERGED_MESSAGE}\"")
        elif call == "set_computed":
            body.append(f"{r}.num_computed_tokens = {entry['value']}")
        elif call == "append_output":
            body += [f"{r}.append_output_token_ids({t})" for t in entry["tokens"]]
        elif call == "set_shared_prefix_boundary":
            body.append(f"{r}.shared_prefix_boundary = found[2]")
        elif call == "set_drafts":
            body.append(f"{r}.spec_token_ids = [7] * {entry['count']}")
        elif call == "set_status":
            body.append(f"{r}.status = type({r}.status).{entry['status']}")
            if entry["status"] == "RUNNING":
                body.append(f"running.add({_q(rid)})")
            else:
                body.append(f"running.discard({_q(rid)})")
        elif call == "free":
            body.append(f"manager.free({r})")
        elif call == "reset_prefix_cache":
            if last and category is Category.STATE_RESET:
                body += ["held_before_reset = any(b.ref_cnt > 0 for b in manager.block_pool.blocks "
                         "if b.block_id != manager.block_pool.null_block.block_id)",
                         "reset_returned = bool(manager.reset_prefix_cache())"]
            elif entry["returned"] is None:
                body.append("manager.reset_prefix_cache()")
            else:
                body.append(f"assert bool(manager.reset_prefix_cache()) is {entry['returned']}, "
                            f"\"{DIVERGED_MESSAGE}\"")
        elif call == "evict_blocks":
            body.append(f"manager.evict_blocks(set({_q(entry['ids'])}))")
        elif call == "take_new_block_ids":
            body.append("zeroed = list(manager.take_new_block_ids())" if last else "manager.take_new_block_ids()")
        elif call == "take_kv_cache_block_copies":
            body += ["_, retained = manager.take_kv_cache_block_copies()",
                     "if retained:", "    manager.block_pool.free_blocks(retained)"]
    if category not in _LOOKUP_CHECKS and category not in (Category.SUBJECT_CRASH, Category.PRECONDITION):
        checks = _check_lines(category, program, final_op)
        if not checks:
            return None
        body += checks
    doc = [f'"""{_docline(finding.verdict)}', "", f"kvspec program: {_docline(program.describe())}",
           f"finding: {_docline(finding.detail)}", '"""']
    lines = [f'"""Regression test emitted by kvspec from a stateful finding (replay: {_docline(finding.replay or "")})."""',
             "", _HEADER, "", *_manager_lines(program, caps), "", "",
             f"def {name}(monkeypatch):", *(f"    {line}" for line in doc)]
    if program.retention_interval is not None:  # the environment before 0.29; harmless after
        lines.append(f"    monkeypatch.setenv(\"VLLM_PREFIX_CACHE_RETENTION_INTERVAL\", \"{program.retention_interval}\")")
    lines += [f"    {line}" for line in body]
    return "\n".join(lines) + "\n"


def _docline(text: str) -> str:
    """Text from a finding, safe inside a docstring or comment."""
    return str(text).replace("\\", "/").replace('"""', "'''").replace("\n", " ")[:400]


def expected_failure(finding: Finding) -> str:
    """What the emitted test's failure must show: the invariant's message,
    or for a crash the exception vLLM raised."""
    if finding.category in (Category.SUBJECT_CRASH, Category.PRECONDITION):
        error = (finding.observations or {}).get("error", "")
        return error.split(":", 1)[0] or "Error"
    return STATE_ASSERT_MESSAGE


def verify_stateful_test(test_path: Path, subject, expected: str = STATE_ASSERT_MESSAGE) -> list[dict[str, Any]]:
    """Run the emitted test where it must fail showing ``expected`` (the
    subject) and, for a mutant, where it must pass (its release)."""
    from kvspec.subjects.subject import release
    from kvspec.subjects.testrun import run_pytest

    checks = [{**run_pytest(subject, str(test_path)), "must": "failed"}]
    if subject.kind == "mutant":
        base = release(subject.version)
        checks.append({**run_pytest(base, str(test_path)), "must": "passed", "against": f"unmutated {base.label}"})
    for check in checks:
        output = check.get("output", "")
        # The failure must be the invariant's own (pytest prints the test's
        # source too, so the messages alone would match any failure).
        raised = [line for line in output.splitlines() if line.startswith("E ") and "Error" in line]
        genuine = check["must"] != "failed" or (any(expected in line for line in raised)
                                                and not any(DIVERGED_MESSAGE in line for line in raised))
        check["as_expected"] = check["outcome"] == check["must"] and genuine
    return checks
