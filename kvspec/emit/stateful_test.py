"""A regression test, in vLLM's idiom, from a stateful finding.

The worker records the calls the finding's (shrunk) program made on vLLM's
objects: requests built, ``new_step_starts``, ``get_computed_blocks``,
``allocate_slots`` with its arguments, tokens appended, ``free``,
``reset_prefix_cache``, ``evict_blocks``, the step's zeroing and
copy-on-write drains.  The test makes those calls, up to the operation that
broke the rule, as vLLM's own prefix-caching tests make them: the manager
and the requests from the release's helpers (``make_kv_cache_manager`` and
``make_request`` of ``tests/v1/core/test_prefix_caching.py``, when the
release has them), keyword arguments only where they differ from vLLM's
defaults, one comment per scheduler step.  It then asserts the rule in plain
code on vLLM's own attributes, with a message in vLLM's words.  It is named
after the behaviour, imports vLLM and the release's helpers only, and names
neither kvspec nor the finding.

Safety: a finding may come from a file kvspec did not write.  What goes
into code is rebuilt from typed values (the program through
``model.program.Program``, request ids as plain names, numbers as ints,
keyword names from a fixed list); no string of a finding is copied in.

``kvspec.findings.stateful`` lints it with the release's ruff configuration
and runs it on both sides.
"""

from __future__ import annotations

import re
from math import lcm
from typing import Any

from kvspec.model.capabilities import Capabilities
from kvspec.model.finding import Category, Finding
from kvspec.model.program import Program

from .vllm_tests import SPEC_CLASSES, Idiom, kv_cache_group_lines

__all__ = ["emit_stateful_test", "stateful_test_name", "assertion_message", "expected_failure", "STATE_CALLS",
           "CALL_CHECKED", "IN_HELPER_MODULE", "CACHED_BLOCK_IDS", "FREE_ORDER_PARTS", "FREE_ORDER_HEAD",
           "free_order_part", "no_test_why"]

WIDTH = 88  # vLLM's line length (its pyproject.toml, [tool.ruff] line-length)

# The behaviour each rule pins: (test name, the assertion's message).
_BEHAVIOUR: dict[Category, tuple[str, str]] = {
    Category.STATE_ZEROING_MISSED: (
        "test_new_attention_blocks_are_handed_out_for_zeroing",
        "every block newly allocated to an attention group must be returned by "
        "take_new_block_ids() so that it is zeroed"),
    Category.STATE_ZEROING: (
        "test_only_newly_allocated_blocks_are_handed_out_for_zeroing",
        "take_new_block_ids() must return only blocks this step allocated"),
    Category.STATE_HIT_GROUPS: (
        "test_every_group_trims_its_hit_blocks_to_the_common_hit",
        "each KV cache group must hold cdiv(num_computed_tokens, block_size) hit blocks"),
    Category.STATE_HIT_BOUNDS: (
        "test_prefix_cache_hit_leaves_a_token_to_compute",
        "a prefix cache hit must leave one token to compute and end on a block boundary"),
    Category.STATE_HIT_LENGTH: (
        "test_prefix_cache_hit_is_the_leading_run_of_cached_blocks",
        "the hit must be the leading run of the request's blocks in the prefix cache"),
    Category.STATE_LOOKUP_PURITY: (
        "test_get_computed_blocks_takes_no_reference",
        "get_computed_blocks() must not change any block's ref_cnt or the free count"),
    Category.STATE_REF_COUNT: (
        "test_block_ref_cnt_counts_the_block_tables_holding_it",
        "a block's ref_cnt must equal the number of block tables holding it"),
    Category.STATE_FREE_LIST: (
        "test_free_block_queue_matches_its_counter",
        "the free block queue must match num_free_blocks and hold each block once"),
    Category.STATE_FREE_BLOCKS: (
        "test_a_block_is_free_iff_nothing_references_it",
        "the free block queue must hold exactly the blocks with ref_cnt == 0"),
    Category.STATE_FORGET: (
        "test_freed_request_leaves_no_block_table",
        "no KV cache group may keep a block table for a freed request"),
    Category.STATE_LEAK: (
        "test_every_block_is_free_when_no_request_holds_one",
        "with no request left, every block but the null block must be free"),
    Category.STATE_TABLE_COVERAGE: (
        "test_full_attention_block_table_covers_computed_tokens",
        "a full-attention block table must cover the request's computed tokens"),
    Category.STATE_MAMBA_STATE: (
        "test_mamba_group_keeps_the_block_of_the_running_state",
        "a Mamba group must hold a real block at the slot of the request's last computed token"),
    Category.STATE_WINDOW: (
        "test_sliding_window_group_keeps_the_blocks_the_next_step_reads",
        "a sliding window group must hold real blocks for the window its next step reads"),
    Category.STATE_TABLE_APPEND_ONLY: (
        "test_running_request_block_table_is_append_only",
        "a running request's block table may only grow or null out skipped blocks"),
    Category.STATE_RESET: (
        "test_reset_prefix_cache_succeeds_iff_no_block_is_in_use",
        "reset_prefix_cache() must succeed exactly when no block is in use"),
    Category.STATE_HASH_MAP: (
        "test_cached_block_map_agrees_with_block_hashes",
        "the cached block map must hold exactly the blocks that have a hash"),
    Category.STATE_ONE_GROUP: (
        "test_a_block_belongs_to_one_kv_cache_group",
        "a block must be held by one KV cache group at a time"),
    Category.STATE_EVICTED_FINDABLE: (
        "test_evicted_blocks_are_no_longer_cached",
        "evict_blocks() must drop every block it is given from the prefix cache, so no "
        "later lookup hits KV that failed to load"),
}

# free_order is a rule of several parts: the test pins the part the finding
# broke, chosen by the words of the rule's own message (model.state._free_order).
FREE_ORDER_PARTS: dict[str, tuple[str, str, str]] = {
    "tail": ("a freed cached block joins the tail",
             "test_freed_cached_blocks_join_the_free_queue_tail",
             "a block freed with its block hash must join the free block queue behind the "
             "blocks already free (least recently used evicted first)"),
    "reverse": ("tail first (reverse slot order)",
                "test_freed_request_blocks_join_the_free_queue_in_reverse_order",
                "a freed request's blocks must join the free block queue in reverse order, "
                "so that its last block is evicted first"),
    "order": ("stayed free but changed their order",
              "test_blocks_that_stay_free_keep_their_eviction_order",
              "blocks that stay free must keep their order in the free block queue"),
    "end": ("lies among blocks that stayed free",
            "test_freed_blocks_join_the_free_queue_at_an_end",
            "a freed block must join the free block queue at its head or its tail"),
}
# free_order's part on allocation (the blocks taken are the queue's head), in
# the same form: written for the engine test only, which wraps the pool's
# get_new_blocks; a stateful test would have to tell the lookup's hits
# (taken where they lie) from the operation's allocations, and is not written.
FREE_ORDER_HEAD: tuple[str, str, str] = (
    "left the free queue's head",
    "test_allocation_takes_blocks_from_the_free_queue_head",
    "allocation must take blocks from the head of the free block queue (least "
    "recently used first)")


def free_order_part(finding: Finding) -> str | None:
    """Which part of free_order the finding broke (None: one no test is written for)."""
    for part, (words, _, _) in FREE_ORDER_PARTS.items():
        if words in (finding.detail or ""):
            return part
    return None


_LOOKUP_RULES = (Category.STATE_HIT_GROUPS, Category.STATE_HIT_BOUNDS, Category.STATE_HIT_LENGTH,
                 Category.STATE_LOOKUP_PURITY)

# The manager calls a stateful test can make (what the worker records).
STATE_CALLS = ("request", "new_step_starts", "get_computed_blocks", "truncate_computed_blocks",
               "allocate_slots", "set_computed", "append_output", "set_shared_prefix_boundary",
               "set_drafts", "set_status", "free", "reset_prefix_cache", "evict_blocks",
               "take_new_block_ids", "take_kv_cache_block_copies")

# allocate_slots keywords the worker passes, with vLLM's defaults: a keyword
# at its default is left out, as vLLM's own tests leave it out.
_ALLOCATE_DEFAULTS = {"num_lookahead_tokens": 0, "num_external_computed_tokens": 0,
                      "delay_cache_blocks": False, "num_encoder_tokens": 0,
                      "full_sequence_must_fit": False, "reserved_blocks": 0, "has_scheduled_reqs": True}
_STATUSES = ("RUNNING", "PREEMPTED", "WAITING", "FINISHED_STOPPED", "FINISHED_ABORTED",
             "FINISHED_LENGTH_CAPPED")



def stateful_test_name(finding: Finding) -> str | None:
    """The test function's name, from the rule (never from a finding's text)."""
    if finding.category is Category.STATE_FREE_ORDER:
        part = free_order_part(finding)
        return FREE_ORDER_PARTS[part][1] if part else None
    if finding.category is Category.SUBJECT_CRASH:
        return "test_scheduler_step_does_not_raise"
    if finding.category is Category.PRECONDITION:
        return "test_kv_cache_manager_accepts_the_layout"
    entry = _BEHAVIOUR.get(finding.category)
    if entry is None:
        return None
    name = entry[0]
    if finding.category is Category.STATE_HIT_GROUPS:
        try:
            groups = Program.from_dict(finding.inputs["program"]).config.groups
        except (KeyError, TypeError, ValueError):
            return name
        if sum(g.kind.value == "full_attention" for g in groups) >= 2:
            return "test_second_full_attention_group_trims_hit_blocks"
    return name


def assertion_message(category: Category | Finding) -> str | None:
    """The test's assertion message for a rule (for a free_order finding,
    given the finding: the part it broke)."""
    if isinstance(category, Finding):
        if category.category is Category.STATE_FREE_ORDER:
            part = free_order_part(category)
            return FREE_ORDER_PARTS[part][2] if part else None
        category = category.category
    entry = _BEHAVIOUR.get(category)
    return entry[1] if entry else None


def no_test_why(finding: Finding) -> str:
    """In one line, why a stateful finding gets no test."""
    if finding.category is Category.STATE_FREE_ORDER:
        return ("no test is written for this part of free_order (written for: "
                + "; ".join(words for words, _, _ in FREE_ORDER_PARTS.values()) + ")")
    if finding.category in (Category.STATE_BLOCK_ESTIMATE, Category.STATE_RETENTION_HIT):
        return (f"{finding.category.value} is observed on engine programs only (the scheduler's estimates and "
                "retention's owed hits): its test is the engine finding's")
    if stateful_test_name(finding) is None:
        return f"no stateful test is written for {finding.category.value} findings"
    return "the finding's recorded calls make no test (a call or value the emitter does not take)"


def expected_failure(finding: Finding) -> str:
    """What the test's failure on the subject must show: its assertion's
    message, or for a crash the exception vLLM raised."""
    if finding.category in (Category.SUBJECT_CRASH, Category.PRECONDITION):
        error = (finding.observations or {}).get("error", "")
        return error.split(":", 1)[0] or "Error"
    return assertion_message(finding) or ""


# -- code layout, as ruff format lays it out ------------------------------------


def _call(indent: str, head: str, args: list[str], tail: str = "") -> list[str]:
    """``head(args)tail``: on one line if it fits, else the arguments on one
    line inside the brackets, else one per line with a trailing comma."""
    one = f"{indent}{head}({', '.join(args)}){tail}"
    if len(one) <= WIDTH:
        return [one]
    inner = f"{indent}    {', '.join(args)}"
    if len(inner) <= WIDTH:
        return [f"{indent}{head}(", inner, f"{indent}){tail}"]
    return [f"{indent}{head}(", *[f"{indent}    {a}," for a in args], f"{indent}){tail}"]


def _list(indent: str, prefix: str, items: list[int]) -> list[str]:
    line = f"{indent}{prefix}[{', '.join(map(str, items))}]"
    if len(line) <= WIDTH:
        return [line]
    inner = f"{indent}    {', '.join(map(str, items))}"
    if len(inner) <= WIDTH:
        return [f"{indent}{prefix}[", inner, f"{indent}]"]
    return [f"{indent}{prefix}[", *[f"{indent}    {i}," for i in items], f"{indent}]"]


def _comment(indent: str, text: str) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(indent) + 2 + len(line) + 1 + len(word) > WIDTH:
            lines.append(f"{indent}# {line}")
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + ([f"{indent}# {line}"] if line else [])


def _assert(indent: str, condition: str, message: str) -> list[str]:
    """``assert condition, "message"`` as ruff format lays it out (the
    message split into adjacent literals when it does not fit)."""
    one = f'{indent}assert {condition}, "{message}"'
    if len(one) <= WIDTH:
        return [one]
    if len(f"{indent}assert {condition}, (") <= WIDTH and len(f'{indent}    "{message}"') <= WIDTH:
        return [f"{indent}assert {condition}, (", f'{indent}    "{message}"', f"{indent})"]
    parts, line = [], ""
    for word in message.split(" "):
        piece = f"{line} {word}" if line else word
        if line and len(f'{indent}    "{piece} "') > WIDTH:
            parts.append(line + " ")
            line = word
        else:
            line = piece
    parts.append(line)
    return [f"{indent}assert {condition}, (", *[f'{indent}    "{p}"' for p in parts], f"{indent})"]


def _is_plain_id(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and len(value) <= 16 and value.isascii()


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {value!r}")
    return value


# -- the test ---------------------------------------------------------------------


class _Emitter:
    def __init__(self, finding: Finding, program: Program, trace: list[dict[str, Any]], caps: Capabilities,
                 idiom: Idiom):
        self.f, self.program, self.caps, self.idiom = finding, program, caps, idiom
        self.category = finding.category
        self.config = program.config
        self.groups = program.config.groups
        ops = [i for i, entry in enumerate(trace) if entry.get("call") == "op"]
        self.final_start = ops[-1]
        self.trace = trace
        self.message = assertion_message(finding) or ""
        self.free_order = free_order_part(finding) if self.category is Category.STATE_FREE_ORDER else None
        # A lookup rule is checked at the lookup that broke it: the request
        # the finding names (only to choose among the trace's own ids), else
        # the step's last lookup.
        lookups = [i for i in range(self.final_start, len(trace)) if trace[i].get("call") == "get_computed_blocks"]
        named = re.search(r"request (\w+)", finding.detail or "")
        chosen = [i for i in lookups if named and trace[i].get("id") == named.group(1)]
        self.checked_lookup = (chosen or lookups or [None])[-1]
        self.uses: set[str] = set()  # names the body uses, for the imports
        self.helpers: set[str] = set()
        self.request_spans: dict[str, tuple[int, int]] = {}  # where each request is made in the body

    # words
    def _op_comment(self, op: dict[str, Any], step: int) -> list[str]:
        kind = op.get("do")
        if kind == "schedule":
            budget = f", token budget {_int(op['budget'])}" if "budget" in op else ""
            drafts = (f", {_int(op['drafts'])} draft tokens ({_int(op.get('accepted', 0))} accepted)"
                      if op.get("drafts") else "")
            return _comment("    ", f"Scheduler step {step}{budget}{drafts}.")
        rid = op.get("id")
        if kind == "finish" and _is_plain_id(rid):
            return _comment("    ", f"{rid} finishes.")
        if kind == "preempt" and _is_plain_id(rid):
            return _comment("    ", f"{rid} is preempted.")
        if kind == "reset":
            return ["    # Reset the prefix cache."]
        if kind == "evict" and _is_plain_id(rid):
            return _comment("    ", f"A failed KV load evicts {rid}'s blocks from block "
                                   f"{_int(op.get('from_block', 0))} on.")
        return []

    def body(self) -> list[str] | None:
        out: list[str] = []
        step = 0
        hit_var: dict[str, int] = {}
        last_hit: int | None = None
        final = self.final_start
        attention = [i for i, g in enumerate(self.groups) if g.kind.value != "mamba_align"]
        for index, entry in enumerate(self.trace):
            call = entry.get("call")
            rid = entry.get("id")
            if rid is not None and not _is_plain_id(rid):
                return None
            in_final = index > final
            if call == "op":
                op = entry.get("op") or {}
                if op.get("do") == "schedule":
                    step += 1
                comment = self._op_comment(op, step)
                if comment:
                    out += ["", *comment]
                if index == final:
                    out += self._before_final()
                continue
            if call not in STATE_CALLS:
                return None
            if call == "request":
                start = len(out)
                out += self._request(rid, [_int(t) for t in entry["tokens"]])
                self.request_spans[rid] = (start, len(out))
            elif call == "new_step_starts":
                out.append("    manager.new_step_starts()")
            elif call == "get_computed_blocks":
                if entry.get("hit") is None:  # vLLM raised here: the call is the test
                    return out + ["    # A scheduler step looks the request up: this must not raise.",
                                  f"    manager.get_computed_blocks({rid})"]
                out += self._lookup(index, rid, index == self.checked_lookup)
                last_hit = _int(entry["hit"])
                hit_var[rid] = last_hit
                if index == self.checked_lookup and self.category in _LOOKUP_RULES:
                    return out + self._lookup_check(rid)
                out.append(f"    assert num_computed_tokens == {last_hit}")
            elif call == "set_shared_prefix_boundary":
                out.append(f"    {rid}.shared_prefix_boundary = boundary")
            elif call == "truncate_computed_blocks":
                tokens = _int(entry["tokens"])
                out += _call("    ", "computed_blocks = manager.truncate_computed_blocks",
                             ["computed_blocks", str(tokens)])
                out.append(f"    num_computed_tokens = {tokens}")
                last_hit = tokens
            elif call == "allocate_slots":
                args = self._allocate_args(entry, rid, last_hit)
                if args is None:
                    return None
                line = _call("    ", "new_blocks = manager.allocate_slots", args)
                if entry.get("allocated") is None:  # vLLM raised here: the call is the test
                    return out + ["    # A scheduler step allocates the request's slots: this must not raise.",
                                  *_call("    ", "manager.allocate_slots", args)]
                out += line
                out.append("    assert new_blocks is not None" if entry["allocated"] else
                           "    assert new_blocks is None")
                if in_final and self.category is Category.STATE_ZEROING_MISSED and entry["allocated"] \
                        and not entry.get("kwargs", {}).get("num_external_computed_tokens"):
                    self.uses.add("allocated")
                    out += _call("    ", "allocated.update", [
                        f"block.block_id for group_id in {attention} for block in new_blocks.blocks[group_id]"])
                last_hit = None
            elif call == "set_computed":
                out.append(f"    {rid}.num_computed_tokens = {_int(entry['value'])}")
            elif call == "append_output":
                tokens = [_int(t) for t in entry["tokens"]]
                arg = str(tokens[0]) if len(tokens) == 1 else str(tokens)
                out.append(f"    {rid}.append_output_token_ids({arg})")
            elif call == "set_drafts":
                out.append(f"    {rid}.spec_token_ids = [7] * {_int(entry['count'])}")
            elif call == "set_status":
                status = entry.get("status")
                if status not in _STATUSES:
                    return None
                self.uses.add("RequestStatus")
                out.append(f"    {rid}.status = RequestStatus.{status}")
            elif call == "free":
                out.append(f"    manager.free({rid})")
            elif call == "reset_prefix_cache":
                if in_final and self.category is Category.STATE_RESET:
                    out += ["    in_use = any(",
                            "        block.ref_cnt > 0 and not block.is_null for block in manager.block_pool.blocks",
                            "    )",
                            "    reset = manager.reset_prefix_cache()"]
                elif entry.get("returned") is None:
                    out.append("    manager.reset_prefix_cache()")
                else:
                    out.append(f"    assert manager.reset_prefix_cache() is {bool(entry['returned'])}")
            elif call == "evict_blocks":
                ids = sorted(_int(i) for i in entry["ids"])
                out.append(f"    manager.evict_blocks({set(ids) if ids else 'set()'})")
            elif call == "take_new_block_ids":
                if in_final and self.category in (Category.STATE_ZEROING_MISSED, Category.STATE_ZEROING):
                    out.append("    zeroed = set(manager.take_new_block_ids())")
                    return out + self._final_check()  # what follows in the step is not needed
                else:
                    out.append("    manager.take_new_block_ids()")
            elif call == "take_kv_cache_block_copies":
                out += ["    _, retained = manager.take_kv_cache_block_copies()",
                        "    manager.block_pool.free_blocks(retained)"]
        return out + self._final_check()

    def _before_final(self) -> list[str]:
        if self.category is Category.STATE_FREE_ORDER:
            self.helpers.add("free_queue")
            out = ["    free_before = free_queue(manager)"]
            if self.free_order == "reverse":
                self.helpers.add("block_tables")
                out.append("    tables_before = block_tables(manager)")
            return out
        if self.category is Category.STATE_ZEROING_MISSED:
            self.uses.add("allocated")
            return ["    allocated = set()"]
        if self.category in (Category.STATE_TABLE_APPEND_ONLY, Category.STATE_ZEROING):
            self.helpers.add("block_tables")
            return ["    tables_before = block_tables(manager)"]
        return []

    def _request(self, rid: str, tokens: list[int]) -> list[str]:
        hash_block = self.config.hash_block_size
        lookahead = self.program.num_hash_lookahead_tokens
        contiguous = len(tokens) > 3 and tokens == list(range(tokens[0], tokens[0] + len(tokens)))
        if contiguous:
            start = "" if tokens[0] == 0 else f"{tokens[0]}, "
            prompt, out = f"list(range({start}{tokens[0] + len(tokens)}))", []
        elif len(tokens) <= 8:
            prompt, out = str(tokens), []
        else:
            prompt, out = f"{rid}_prompt", _list("    ", f"{rid}_prompt = ", tokens)
        if self.idiom.helpers:
            args = [f'"{rid}"', prompt, str(hash_block), "sha256"]
            if lookahead:
                args.append(f"num_hash_lookahead_tokens={lookahead}")
            return out + _call("    ", f"{rid} = make_request", args)
        self.uses.add("Request")
        hasher = f"get_request_block_hasher({hash_block}, sha256" + (f", {lookahead})" if lookahead else ")")
        wanted = {"request_id": f'"{rid}"', "prompt_token_ids": prompt,
                  "sampling_params": f"SamplingParams(max_tokens={self.program.max_model_len})",
                  "pooling_params": "None", "block_hasher": hasher, "eos_token_id": "None"}
        if self.caps.request_keywords:
            wanted = {k: v for k, v in wanted.items() if k in self.caps.request_keywords}
        return out + _call("    ", f"{rid} = Request", [f"{k}={v}" for k, v in wanted.items()])

    def _lookup(self, index: int, rid: str, in_final: bool) -> list[str]:
        boundary = index + 1 < len(self.trace) and self.trace[index + 1].get("call") == "set_shared_prefix_boundary"
        out = []
        if in_final and self.category is Category.STATE_LOOKUP_PURITY:
            out += ["    ref_cnts = [block.ref_cnt for block in manager.block_pool.blocks]",
                    "    num_free = manager.block_pool.get_num_free_blocks()"]
        if boundary:
            return out + _call("    ", "computed_blocks, num_computed_tokens, boundary = manager.get_computed_blocks",
                               [rid])
        return out + [f"    computed_blocks, num_computed_tokens = manager.get_computed_blocks({rid})[:2]"]

    def _allocate_args(self, entry: dict[str, Any], rid: str, last_hit: int | None) -> list[str] | None:
        kwargs = entry.get("kwargs") or {}
        args = [rid, str(_int(entry["num_new_tokens"]))]
        hit = kwargs.get("num_new_computed_tokens", 0)
        computed = kwargs.get("new_computed_blocks") == "computed"
        if computed or hit:
            args.append("num_computed_tokens" if last_hit is not None and hit == last_hit else str(_int(hit)))
            if computed:
                args.append("computed_blocks")
        for key, value in kwargs.items():
            if key in ("num_new_computed_tokens", "new_computed_blocks"):
                continue
            if key not in _ALLOCATE_DEFAULTS:
                return None
            if isinstance(value, bool):
                if value is not _ALLOCATE_DEFAULTS[key]:
                    args.append(f"{key}={value}")
            elif _int(value) != _ALLOCATE_DEFAULTS[key]:
                args.append(f"{key}={value}")
        return args

    def _lookup_check(self, rid: str) -> list[str]:
        m = self.message
        if self.category is Category.STATE_HIT_GROUPS:
            sizes = [g.block_size for g in self.groups]
            fa = [i for i, g in enumerate(self.groups) if g.kind.value == "full_attention"]
            out = [f"    block_sizes = {sizes}",
                   "    for group_blocks, block_size in zip(computed_blocks.blocks, block_sizes):",
                   "        num_blocks = (num_computed_tokens + block_size - 1) // block_size",
                   *_assert("        ", "len(group_blocks) == num_blocks", m)]
            if fa:
                out += [f"    for group_id in {fa}:",
                        "        blocks = computed_blocks.blocks[group_id]",
                        *_assert("        ", "not any(block.is_null for block in blocks)",
                                 "full-attention hit blocks must be real blocks")]
            return out
        if self.category is Category.STATE_HIT_BOUNDS:
            partial = self.f.compared.get("capabilities", {}).get("partial_hash_hits")
            unit = self.config.hash_block_size if partial and self.config.allow_partial_hash_hits \
                else self.config.scheduler_block_size
            return [f"    assert num_computed_tokens % {unit} == 0",
                    *_assert("    ", f"num_computed_tokens < {rid}.num_tokens", m)]
        if self.category is Category.STATE_HIT_LENGTH:
            size = self.groups[0].block_size
            eagle = any(g.eagle for g in self.groups)
            self.uses.add("make_block_hash_with_group_id")
            out = [f"    num_full_blocks = ({rid}.num_tokens - 1) // {size}",
                   "    cached = manager.block_pool.cached_block_hash_to_block",
                   "    num_cached = 0",
                   f"    for block_hash in {rid}.block_hashes[:num_full_blocks]:",
                   "        if make_block_hash_with_group_id(block_hash, 0) not in cached._cache:",
                   "            break",
                   "        num_cached += 1"]
            if eagle:
                out.append("    num_cached = max(num_cached - 1, 0)  # EAGLE drops the last block")
            return out + _assert("    ", f"num_computed_tokens == num_cached * {size}", m)
        # STATE_LOOKUP_PURITY
        return [*_assert("    ", "[block.ref_cnt for block in manager.block_pool.blocks] == ref_cnts", m),
                "    assert manager.block_pool.get_num_free_blocks() == num_free"]

    def _final_check(self) -> list[str]:
        m, c = self.message, self.category
        if c is Category.STATE_ZEROING_MISSED:
            return ["", *_comment("    ", "Every attention group's new blocks must be handed out to be zeroed."),
                    *_assert("    ", "allocated <= zeroed", m)]
        if c is Category.STATE_ZEROING:
            return ["    placed = {",
                    "        block_id",
                    "        for key, blocks in block_tables(manager).items()",
                    "        for block_id in blocks[len(tables_before.get(key, [])) :]",
                    "    }",
                    *_assert("    ", "zeroed <= placed", m)]
        if c is Category.STATE_REF_COUNT:
            self.helpers.add("block_tables")
            return ["    held = Counter(",
                    "        block_id for blocks in block_tables(manager).values() for block_id in blocks",
                    "    )",
                    "    for block in manager.block_pool.blocks:",
                    "        if not block.is_null:",
                    *_assert("            ", "block.ref_cnt == held[block.block_id]", m)]
        if c is Category.STATE_FREE_LIST:
            return ["    pool = manager.block_pool",
                    "    free = [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]",
                    "    assert pool.null_block.block_id not in free",
                    *_assert("    ", "len(set(free)) == len(free) == pool.get_num_free_blocks()", m)]
        if c is Category.STATE_FREE_BLOCKS:
            return ["    pool = manager.block_pool",
                    "    free = {block.block_id for block in pool.free_block_queue.get_all_free_blocks()}",
                    "    unused = {",
                    "        block.block_id",
                    "        for block in pool.blocks",
                    "        if block.ref_cnt == 0 and not block.is_null",
                    "    }",
                    *_assert("    ", "free == unused", m)]
        if c is Category.STATE_FORGET:
            self.helpers.add("block_tables")
            running = self._running_at_end()
            return [_running_line(running),
                    "    for request_id, _ in block_tables(manager):",
                    *_assert("        ", "request_id in running", m)]
        if c is Category.STATE_LEAK:
            return ["    pool = manager.block_pool",
                    *_assert("    ", "pool.get_num_free_blocks() == len(pool.blocks) - 1", m)]
        if c is Category.STATE_TABLE_COVERAGE:
            self.helpers.add("block_tables")
            fa = {i: g.block_size for i, g in enumerate(self.groups) if g.kind.value == "full_attention"}
            return [*self._each_running_table("block_sizes", fa),
                    "            num_computed = requests[request_id].num_computed_tokens",
                    "            need = -(-num_computed // block_sizes[group_id])",
                    *_assert("            ", "len(blocks) >= need", m)]
        if c is Category.STATE_MAMBA_STATE:
            self.helpers.add("block_tables")
            mamba = {i: g.block_size for i, g in enumerate(self.groups) if g.kind.value == "mamba_align"}
            return [*self._each_running_table("block_sizes", mamba, null_block=True),
                    "            num_computed = requests[request_id].num_computed_tokens",
                    "            slot = -(-num_computed // block_sizes[group_id]) - 1",
                    "            held = slot < len(blocks) and blocks[slot] != null_block_id",
                    *_assert("            ", "num_computed == 0 or held", m)]
        if c is Category.STATE_WINDOW:
            self.helpers.add("block_tables")
            windows = {i: (g.block_size, g.sliding_window) for i, g in enumerate(self.groups)
                       if g.kind.value == "sliding_window"}
            return [*self._each_running_table("windows", windows, null_block=True),
                    "            block_size, window = windows[group_id]",
                    "            num_computed = requests[request_id].num_computed_tokens",
                    "            first = max(0, num_computed - window + 1) // block_size",
                    "            end = -(-num_computed // block_size)",
                    "            read = blocks[first:end]",
                    "            held = len(read) == end - first and null_block_id not in read",
                    *_assert("            ", "held", m)]
        if c is Category.STATE_TABLE_APPEND_ONLY:
            running = self._running_at_end()
            self.helpers.add("block_tables")
            return [_running_line(running),
                    "    null_block_id = manager.block_pool.null_block.block_id",
                    "    for key, blocks in block_tables(manager).items():",
                    "        before = tables_before.get(key)",
                    "        if before is None or key[0] not in running:",
                    "            continue",
                    "        assert len(blocks) >= len(before)",
                    "        kept = all(new in (old, null_block_id) for old, new in zip(before, blocks))",
                    *_assert("        ", "kept", m)]
        if c is Category.STATE_RESET:
            return _assert("    ", "bool(reset) is not in_use", m)
        if c is Category.STATE_FREE_ORDER:
            return self._free_order_check()
        if c is Category.STATE_EVICTED_FINDABLE:
            evicted = sorted({_int(i) for e in self.trace[self.final_start:] if e.get("call") == "evict_blocks"
                              for i in e.get("ids", ())})
            return ["    pool = manager.block_pool",
                    "    mapped = cached_block_ids(pool)",
                    f"    for block_id in {evicted}:",
                    "        block = pool.blocks[block_id]",
                    *_assert("        ", "block.block_hash is None and block_id not in mapped", m)]
        if c is Category.STATE_HASH_MAP:
            return ["    pool = manager.block_pool",
                    "    mapped = cached_block_ids(pool)",
                    "    hashed = {",
                    "        block.block_id",
                    "        for block in pool.blocks",
                    "        if getattr(block, \"block_hash\", None) is not None",
                    "    }",
                    *_assert("    ", "mapped == hashed", m)]
        if c is Category.STATE_ONE_GROUP:
            self.helpers.add("block_tables")
            return ["    null_block_id = manager.block_pool.null_block.block_id",
                    "    owners = {}",
                    "    for (_, group_id), blocks in block_tables(manager).items():",
                    "        for block_id in blocks:",
                    "            if block_id != null_block_id:",
                    "                owners.setdefault(block_id, set()).add(group_id)",
                    *_assert("    ", "all(len(groups) == 1 for groups in owners.values())", m)]
        return []

    def _free_order_check(self) -> list[str]:
        """The part of free_order the finding broke, on the free queue before
        and after the operation (free_before, free_after)."""
        m, part = self.message, self.free_order
        out = ["    free_after = free_queue(manager)"]
        if part != "reverse":
            out.append("    stayed = [block_id for block_id in free_after if block_id in free_before]")
        if part == "tail":
            return out + ["    behind = free_after[free_after.index(stayed[-1]) + 1 :] if stayed else free_after",
                          "    for block_id in free_after:",
                          "        block = manager.block_pool.blocks[block_id]",
                          "        if block_id not in free_before and block.block_hash is not None:",
                          *_assert("            ", "block_id in behind", m)]
        if part == "reverse":
            freed = sorted({e["id"] for e in self.trace[self.final_start:]
                            if e.get("call") == "free" and _is_plain_id(e.get("id"))})
            full = [i for i, g in enumerate(self.groups) if g.kind.value == "full_attention"]
            return out + ["    pool = manager.block_pool",
                          "    newly_free = [block_id for block_id in free_after if block_id not in free_before]",
                          "    for (request_id, group_id), blocks in tables_before.items():",
                          f"        if request_id not in {_names(freed)} or group_id not in {full}:",
                          "            continue",
                          "        freed = [block_id for block_id in reversed(blocks) if block_id in newly_free]",
                          "        # Cached blocks join the tail, uncached ones the head: each in order.",
                          "        for cached in (True, False):",
                          "            positions = [",
                          "                free_after.index(block_id)",
                          "                for block_id in freed",
                          "                if (pool.blocks[block_id].block_hash is not None) is cached",
                          "            ]",
                          *_assert("            ", "positions == sorted(positions)", m)]
        if part == "order":
            return out + _assert("    ", "stayed == [block_id for block_id in free_before if block_id in stayed]",
                                 m)
        # "end": the blocks that stayed free still form one run.
        return out + ["    if stayed:",
                      "        first = free_after.index(stayed[0])",
                      *_assert("        ", "free_after[first : first + len(stayed)] == stayed", m)]

    def _each_running_table(self, name: str, groups: dict, null_block: bool = False) -> list[str]:
        """The emitted loop over the block tables of the requests still
        running at the end, in the groups ``name`` maps (its body follows)."""
        running = self._running_at_end()
        return ["    requests = {" + ", ".join(f'"{r}": {r}' for r in running) + "}",
                f"    {name} = {groups}",
                *(["    null_block_id = manager.block_pool.null_block.block_id"] if null_block else []),
                "    for (request_id, group_id), blocks in block_tables(manager).items():",
                f"        if request_id in requests and group_id in {name}:"]

    def _running_at_end(self) -> list[str]:
        running: list[str] = []
        for entry in self.trace:
            if entry.get("call") == "set_status" and _is_plain_id(entry.get("id")):
                rid = entry["id"]
                if entry.get("status") == "RUNNING" and rid not in running:
                    running.append(rid)
                elif entry.get("status") != "RUNNING" and rid in running:
                    running.remove(rid)
        return running

    # the file
    def manager_lines(self, assign: str = "manager = ") -> list[str]:
        out = ["    init_none_hash(sha256)", "    kv_cache_config = KVCacheConfig(",
               f"        num_blocks={self.program.num_blocks},", "        kv_cache_tensors=[],",
               "        kv_cache_groups=["]
        out += kv_cache_group_lines(self.groups, self.caps.per_group_eagle)
        out += ["        ],"]
        if self.program.retention_interval is not None:
            out.append(f"        prefix_cache_retention_interval={_int(self.program.retention_interval)},")
        out.append("    )")
        builder = "make_kv_cache_manager" if self.idiom.helpers else "KVCacheManager"
        c, p = self.config, self.program
        wanted = [("max_model_len", str(p.max_model_len), True)]
        if not self.idiom.helpers or c.scheduler_block_size != lcm(*(g.block_size for g in self.groups)):
            wanted.append(("scheduler_block_size", str(c.scheduler_block_size), True))
        wanted += [("hash_block_size", str(c.hash_block_size), True),
                   ("enable_caching", "False", not c.enable_caching),
                   ("use_eagle", "True", any(g.eagle for g in self.groups) and not p.num_hash_lookahead_tokens),
                   ("num_prefill_lookahead", str(c.num_prefill_lookahead), bool(c.num_prefill_lookahead)),
                   ("num_hash_lookahead_tokens", str(p.num_hash_lookahead_tokens),
                    bool(p.num_hash_lookahead_tokens)),
                   ("dcp_world_size", str(c.dcp_world_size), c.dcp_world_size != 1)]
        # max_num_batched_tokens and max_in_flight_tokens, where a release
        # takes them, default to max_model_len, as the worker sets them.
        accepted = set(self.caps.manager_keywords)
        args = ["kv_cache_config"] + [f"{k}={v}" for k, v, on in wanted
                                      if on and (not accepted or k in accepted)]
        return out + _call("    ", f"{assign}{builder}", args)


    def imports(self, body: str) -> list[str]:
        third = []
        if "Counter(" in body:
            third.append("from collections import Counter")
        third = third + ([""] if third else []) + ["import torch"]
        kinds = sorted({SPEC_CLASSES[g.kind.value] for g in self.groups} | {"KVCacheConfig", "KVCacheGroupSpec"})
        first = []
        if self.idiom.helpers:
            names = ["make_kv_cache_manager"] + (["make_request"] if "make_request(" in body else [])
            first.append(_import_line("tests.v1.core.test_prefix_caching", names))
        elif "SamplingParams(" in body:
            first.append("from vllm.sampling_params import SamplingParams")
        first.append("from vllm.utils.hashing import sha256")
        if not self.idiom.helpers:
            first.append("from vllm.v1.core.kv_cache_manager import KVCacheManager")
        utils = ["init_none_hash"]
        if not self.idiom.helpers and "Request(" in body:
            utils.insert(0, "get_request_block_hasher")
        if "make_block_hash_with_group_id" in body:
            utils.append("make_block_hash_with_group_id")
        first.append(_import_line("vllm.v1.core.kv_cache_utils", sorted(utils)))
        first += [_import_line("vllm.v1.kv_cache_interface", kinds)]
        request_names = sorted(n for n in ("Request", "RequestStatus")
                               if re.search(rf"\b{n}\b[(.]", body))
        if request_names:
            first.append(_import_line("vllm.v1.request", request_names))
        return third + [""] + [line for chunk in first for line in chunk.split("\n")]


def _without_unused_requests(body: list[str], spans: dict[str, tuple[int, int]]) -> list[str]:
    """The body without the requests no call up to the check uses."""
    drop: set[int] = set()
    for rid, (start, end) in spans.items():
        rest = "\n".join(line for i, line in enumerate(body) if not start <= i < end)
        if not re.search(rf"\b{rid}\b", rest):
            drop.update(range(start, end))
    return [line for i, line in enumerate(body) if i not in drop]


def _names(ids: list[str]) -> str:
    """A set literal of request ids (plain names only)."""
    return "{" + ", ".join(f'"{r}"' for r in ids) + "}" if ids else "set()"


def _running_line(running: list[str]) -> str:
    """The requests still running at the end, by id (plain names only)."""
    return f"    running = {_names(running)}"


def _import_line(module: str, names: list[str]) -> str:
    one = f"from {module} import {', '.join(names)}"
    if len(one) <= WIDTH:
        return one
    return "\n".join([f"from {module} import (", *[f"    {n}," for n in names], ")"])


# The blocks the prefix cache's hash map holds, however the release keeps
# them (a block, a dict of blocks by id, or from 0.34 block ids).
CACHED_BLOCK_IDS = [
    "def cached_block_ids(pool):",
    '    """The ids of the blocks the prefix cache\'s hash map holds."""',
    "    cached = pool.cached_block_hash_to_block",
    "    ids = set()",
    "    for value in cached._cache.values():",
    "        if isinstance(value, int):",
    "            ids.add(value)",
    "        elif isinstance(value, dict):",
    "            ids.update(value)",
    "        else:",
    "            ids.add(value.block_id)",
    '    for dup_ids in getattr(cached, "_dup_ids", {}).values():',
    "        ids.update(dup_ids)",
    "    return ids",
]

_FREE_QUEUE = [
    "def free_queue(manager):",
    '    """The free block queue\'s block ids, from its head (evicted first) to its tail."""',
    "    queue = manager.block_pool.free_block_queue",
    "    return [block.block_id for block in queue.get_all_free_blocks()]",
]

_BLOCK_TABLES = [
    "def block_tables(manager):",
    '    """(request id, KV cache group id) -> the block ids in that block table."""',
    "    return {",
    "        (request_id, group_id): [block.block_id for block in blocks]",
    "        for group_id, group in enumerate(manager.coordinator.single_type_managers)",
    "        for request_id, blocks in group.req_to_blocks.items()",
    "    }",
]


def _docstring(emitter: _Emitter, name: str) -> list[str]:
    words = {"full_attention": "full attention", "sliding_window": "sliding window",
             "mamba_align": 'Mamba "align"'}
    layout = ", ".join(f"{words[g.kind.value]} (block {g.block_size}"
                       + (f", window {g.sliding_window}" if g.kind.value == "sliding_window" else "")
                       + (", EAGLE" if g.eagle else "") + ")" for g in emitter.groups)
    if emitter.category is Category.SUBJECT_CRASH:
        rule = "the calls a scheduler step makes on the KV cache manager must not raise"
    elif emitter.category is Category.PRECONDITION:
        rule = "KVCacheManager must accept a layout its config validators accept"
    else:
        rule = emitter.message
    text = f"Groups {layout}: {rule}."
    text = text[0].upper() + text[1:]
    lines, line, limit = [], "", WIDTH - 7
    for word in text.split():
        if line and len(line) + 1 + len(word) > limit:
            lines.append(line)
            line, limit = word, WIDTH - 4
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    if len(lines) == 1 and len(f'    """{lines[0]}"""') <= WIDTH:
        return [f'    """{lines[0]}"""']
    return [f'    """{lines[0]}', *[f"    {line}" for line in lines[1:]], '    """']


def emit_stateful_test(finding: Finding, trace: list[dict[str, Any]] | None, caps: Capabilities,
                       idiom: Idiom | None = None) -> str | None:
    """The test's source, or None when the finding's program or trace cannot make one."""
    idiom = idiom or Idiom()
    name = stateful_test_name(finding)
    if not trace or name is None:
        return None
    try:
        program = Program.from_dict(finding.inputs["program"])
    except (KeyError, TypeError, ValueError):
        return None
    if not any(entry.get("call") == "op" for entry in trace):
        return None
    emitter = _Emitter(finding, program, trace, caps, idiom)
    try:
        if finding.category is Category.PRECONDITION:
            body: list[str] | None = []
        else:
            body = emitter.body()
    except (KeyError, TypeError, ValueError):
        return None
    if body is None:
        return None
    body = _without_unused_requests(body, emitter.request_spans)
    # A refused layout: building the manager is the test.
    setup = emitter.manager_lines("" if finding.category is Category.PRECONDITION else "manager = ")
    function = [f"def {name}():", *_docstring(emitter, name), *setup, *body]
    text = "\n".join(function)
    out = [*idiom.header, *emitter.imports(text), "", ""]
    if "block_tables(" in text:
        out += [*_BLOCK_TABLES, "", ""]
    if "free_queue(" in text:
        out += [*_FREE_QUEUE, "", ""]
    if "cached_block_ids(" in text:
        out += [*CACHED_BLOCK_IDS, "", ""]
    return "\n".join(out + function) + "\n"


# What each rule's test checks, by the vLLM call it reads (where in vLLM's tests it belongs).
CALL_CHECKED = {Category.STATE_ZEROING_MISSED: "take_new_block_ids", Category.STATE_ZEROING: "take_new_block_ids",
            Category.STATE_HIT_GROUPS: "get_computed_blocks", Category.STATE_HIT_BOUNDS: "get_computed_blocks",
            Category.STATE_HIT_LENGTH: "get_computed_blocks", Category.STATE_LOOKUP_PURITY: "get_computed_blocks",
            Category.STATE_RESET: "reset_prefix_cache"}
# Rules whose test belongs with vLLM's own tests of the free block queue and
# of evict_blocks: the prefix-caching module that holds the helpers.
IN_HELPER_MODULE = (Category.STATE_FREE_ORDER, Category.STATE_EVICTED_FINDABLE)
