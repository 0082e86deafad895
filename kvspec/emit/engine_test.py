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
- a pool rule (leak, ref_cnt, the free queue, ...): read off the scheduler's
  KV cache manager after each ``schedule()`` and at the end;
- a Mamba state or a full-attention table short of the computed tokens, a
  running request's table changed other than by growing or nulling a slot:
  after each ``schedule()`` and ``update_from_output()``;
- a rule on one call (free order, allocation from the free queue's head, the
  lookup rules, reset, zeroing, eviction after a failed KV load): that call
  wrapped on the scheduler's manager or block pool, where it is made.

It imports vLLM and torch only and names neither kvspec nor the finding.
vLLM's ``create_scheduler`` (``tests/v1/core/utils.py``) builds one
full-attention group, so the test builds its scheduler from the derived
settings itself (said in its docstring).
"""

from __future__ import annotations

import re

from kvspec.emit.stateful_test import CACHED_BLOCK_IDS, FREE_ORDER_HEAD, FREE_ORDER_PARTS, assertion_message
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding
from kvspec.subjects.upstream_repro import (OWN_CONNECTOR_NOTE, RuleCheck, Unscriptable, engine_code, engine_values,
                                            wrap)

__all__ = ["ENGINE_TEST_KINDS", "engine_test_name", "engine_assertion_message", "emit_engine_test",
           "engine_test_code", "rendered_engine_test", "CALL_CHECKED", "rule_check"]

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
# Rules read through the manager's own calls or after each schedule(), in the
# stateful tests' words (one wording for a rule): free_order's part is the
# finding's (FREE_ORDER_PARTS), by the words of the rule's message.
_CALL_RULES = {
    Category.STATE_MAMBA_STATE: "test_mamba_group_keeps_the_block_of_the_running_state",
    Category.STATE_TABLE_COVERAGE: "test_full_attention_block_table_covers_computed_tokens",
    Category.STATE_HIT_GROUPS: "test_every_group_trims_its_hit_blocks_to_the_common_hit",
    Category.STATE_HIT_LENGTH: "test_prefix_cache_hit_is_the_leading_run_of_cached_blocks",
    Category.STATE_LOOKUP_PURITY: "test_get_computed_blocks_takes_no_reference",
    Category.STATE_RESET: "test_reset_prefix_cache_succeeds_iff_no_block_is_in_use",
    Category.STATE_ZEROING_MISSED: "test_new_attention_blocks_are_handed_out_for_zeroing",
    Category.STATE_ZEROING: "test_only_newly_allocated_blocks_are_handed_out_for_zeroing",
    Category.STATE_HIT_BOUNDS: "test_prefix_cache_hit_leaves_a_token_to_compute",
    Category.STATE_TABLE_APPEND_ONLY: "test_running_request_block_table_is_append_only",
    Category.STATE_EVICTED_FINDABLE: "test_evicted_blocks_are_no_longer_cached",
}
_BEHAVIOUR.update({category: (name, assertion_message(category)) for category, name in _CALL_RULES.items()})
_BEHAVIOUR[Category.STATE_FREE_ORDER] = ("", None)  # by part: _free_order_part
# free_order's parts: the stateful tests' (by the rule's words), and the one
# on allocation, which only the engine test checks (get_new_blocks wrapped).
_FREE_ORDER_PARTS = {**FREE_ORDER_PARTS, "head": FREE_ORDER_HEAD}
ENGINE_TEST_KINDS = tuple(_BEHAVIOUR)
# What the test drives: the release's test module calling it most is where it goes.
CALL_CHECKED = "update_from_output"


def _free_order_part(detail: str | None) -> str | None:
    """The part of free_order a finding broke, by its rule's words (None: no test)."""
    return next((part for part, (words, _, _) in _FREE_ORDER_PARTS.items() if words in (detail or "")), None)


def _entry(category: Category | Finding) -> tuple[str, str | None] | None:
    if isinstance(category, Finding):
        if category.category is Category.STATE_FREE_ORDER:
            part = _free_order_part(category.detail)
            return _FREE_ORDER_PARTS[part][1:] if part else None
        category = category.category
    if category is Category.STATE_FREE_ORDER:
        return None
    return _BEHAVIOUR.get(category)


def engine_test_name(category: Category | Finding) -> str | None:
    """The test's name (free_order's: by the part the finding broke)."""
    entry = _entry(category)
    return entry[0] if entry else None


def engine_assertion_message(category: Category | Finding) -> str | None:
    entry = _entry(category)
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

def _per_table(function: str, doc: str, check: str) -> str:
    """A check over each running request's block table in the groups
    @GROUPS@ names (``check``: its lines, with ``num_computed`` and ``blocks``)."""
    return f'''

def {function}(scheduler, processed=None):
    """{doc}"""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    for request in scheduler.running:
        num_computed = request.num_computed_tokens
        for group_id in @GROUPS@:
            manager = managers[group_id]
            blocks = manager.req_to_blocks.get(request.request_id, [])
{check}'''


# Rules after each schedule() and each update_from_output(), over the groups
# of one kind (@GROUPS@: their ids in the layout vLLM built).
_AFTER_SCHEDULE = {
    Category.STATE_MAMBA_STATE: ("assert_mamba_state_held", "mamba_align", _per_table(
        "assert_mamba_state_held", "Each running request's Mamba groups hold a real block at the slot of its\n"
        "    last computed token, where its running state is kept.", """\
            slot = (num_computed + manager.block_size - 1) // manager.block_size - 1
            held = slot < len(blocks) and not blocks[slot].is_null
            assert num_computed == 0 or held, (
@MESSAGE16@
                f"request {request.request_id} computed {num_computed} tokens; "
                f"group {group_id} holds {len(blocks)} slots, slot {slot} "
                f"{'the null block' if slot < len(blocks) else 'missing'}"
            )
""")),
    Category.STATE_TABLE_COVERAGE: ("assert_full_attention_tables_cover", "full_attention", _per_table(
        "assert_full_attention_tables_cover", "Each running request's full-attention block tables cover its computed\n"
        "    tokens.", """\
            need = (num_computed + manager.block_size - 1) // manager.block_size
            assert len(blocks) >= need, (
@MESSAGE16@
                f"request {request.request_id} computed {num_computed} tokens; "
                f"group {group_id} holds {len(blocks)} blocks of {need}"
            )
""")),
}

# ... and after each update_from_output() (the engine step's end).
_AFTER_OUTPUTS = """\
    update_from_output = scheduler.update_from_output

    def checked_update_from_output(*args, **kwargs):
        outputs = update_from_output(*args, **kwargs)
        @CHECK@(scheduler)
        return outputs

    scheduler.update_from_output = checked_update_from_output
    drive(scheduler, OPS, check=@CHECK@)"""

# Rules on what one of the manager's calls returns or leaves: the call
# wrapped on the scheduler's manager (the engine calls it there).
_LOOKUP_WATCH = """

def watch_lookups(scheduler):
    \"\"\"Check each prefix cache hit get_computed_blocks() returns.\"\"\"
    manager = scheduler.kv_cache_manager
    lookup = manager.get_computed_blocks

    def get_computed_blocks(request, *args, **kwargs):
@BEFORE@        found = lookup(request, *args, **kwargs)
@CHECK@        return found

    manager.get_computed_blocks = get_computed_blocks
"""
_LOOKUP_CHECKS = {
    Category.STATE_HIT_GROUPS: ("", """\
        computed_blocks, num_computed_tokens = found[0], found[1]
        groups = manager.coordinator.single_type_managers
        for group_id, blocks in enumerate(computed_blocks.blocks):
            block_size = groups[group_id].block_size
            num_blocks = (num_computed_tokens + block_size - 1) // block_size
            assert len(blocks) == num_blocks, (
@MESSAGE16@
                f"request {request.request_id}: group {group_id} returned "
                f"{len(blocks)} blocks for a hit of {num_computed_tokens} tokens"
            )
"""),
    Category.STATE_HIT_LENGTH: ("""\
        # The leading run of the request's full blocks the prefix cache holds.
        num_full_blocks = (request.num_tokens - 1) // @BLOCK@
        num_cached = 0
        for block_hash in request.block_hashes[:num_full_blocks]:
            if not manager.block_pool.get_cached_block(block_hash, [0]):
                break
            num_cached += 1
""", """\
        num_computed_tokens = found[1]
        assert num_computed_tokens == num_cached * @BLOCK@, (
@MESSAGE12@
            f"request {request.request_id} hit {num_computed_tokens} tokens; the "
            f"prefix cache held its first {num_cached} blocks"
        )
"""),
    # hit_bounds: @UNIT@, the block a hit ends on (the hash block under
    # partial hash hits, the scheduler block otherwise); with prefix caching
    # off, _hit_bounds_check asks for no hit at all.
    Category.STATE_HIT_BOUNDS: ("", """\
        num_computed_tokens = found[1]
        assert 0 <= num_computed_tokens < request.num_tokens, (
@MESSAGE12@
            f"request {request.request_id} hit {num_computed_tokens} of its "
            f"{request.num_tokens} tokens"
        )
        assert num_computed_tokens % @UNIT@ == 0, (
@MESSAGE12@
            f"request {request.request_id} hit {num_computed_tokens} tokens, not a "
            f"multiple of the @UNIT_NAME@ block size @UNIT@"
        )
"""),
    Category.STATE_LOOKUP_PURITY: ("""\
        ref_cnts = [block.ref_cnt for block in manager.block_pool.blocks]
        num_free = manager.block_pool.get_num_free_blocks()
""", """\
        assert [block.ref_cnt for block in manager.block_pool.blocks] == ref_cnts, (
@MESSAGE12@
            f"request {request.request_id}'s lookup changed a ref_cnt"
        )
        assert manager.block_pool.get_num_free_blocks() == num_free
"""),
}
_RESET_WATCH = """

def watch_resets(scheduler):
    \"\"\"Check each reset_prefix_cache() of the block pool.\"\"\"
    pool = scheduler.kv_cache_manager.block_pool
    reset_prefix_cache = pool.reset_prefix_cache

    def checked_reset_prefix_cache():
        in_use = [block.block_id for block in pool.blocks if block.ref_cnt > 0]
        reset = reset_prefix_cache()
        assert bool(reset) is not bool(in_use), (
@MESSAGE12@
            f"reset_prefix_cache() returned {reset} with blocks {in_use} in use"
        )
        return reset

    pool.reset_prefix_cache = checked_reset_prefix_cache
"""
_ZEROING_WATCH = """

def watch_zeroing(scheduler):
    \"\"\"Every block allocate_slots() newly gives an attention group is handed out
    by the next take_new_block_ids().\"\"\"
    manager = scheduler.kv_cache_manager
    allocate_slots = manager.allocate_slots
    take_new_block_ids = manager.take_new_block_ids
    allocated = set()

    def checked_allocate_slots(request, *args, **kwargs):
        new_blocks = allocate_slots(request, *args, **kwargs)
        if new_blocks is not None and not kwargs.get("num_external_computed_tokens"):
            allocated.update(
                block.block_id
                for group_id in @GROUPS@
                for block in new_blocks.blocks[group_id]
                if not block.is_null
            )
        return new_blocks

    def checked_take_new_block_ids():
        zeroed = take_new_block_ids()
        assert allocated <= set(zeroed), (
@MESSAGE12@
            f"blocks {sorted(allocated - set(zeroed))} were not handed out"
        )
        allocated.clear()
        return zeroed

    manager.allocate_slots = checked_allocate_slots
    manager.take_new_block_ids = checked_take_new_block_ids
"""
_ZEROED_WATCH = """

def watch_zeroed_blocks(scheduler):
    \"\"\"Each take_new_block_ids() returns only blocks placed in a block table slot
    since the last one (a new slot, or a slot holding another block).\"\"\"
    manager = scheduler.kv_cache_manager
    managers = manager.coordinator.single_type_managers
    null_block_id = manager.block_pool.null_block.block_id
    take_new_block_ids = manager.take_new_block_ids
    tables = {}

    def checked_take_new_block_ids():
        zeroed = take_new_block_ids()
        now = {
            (request_id, group_id): [block.block_id for block in blocks]
            for group_id, group in enumerate(managers)
            for request_id, blocks in group.req_to_blocks.items()
        }
        placed = {
            block_id
            for key, blocks in now.items()
            for slot, block_id in enumerate(blocks)
            if block_id != null_block_id
            and tables.get(key, [])[slot : slot + 1] != [block_id]
        }
        assert set(zeroed) <= placed, (
@MESSAGE12@
            f"blocks {sorted(set(zeroed) - placed)} were handed out, yet no block "
            f"table slot took them since the last take_new_block_ids()"
        )
        tables.clear()
        tables.update(now)
        return zeroed

    manager.take_new_block_ids = checked_take_new_block_ids
"""
# append_only: each running request's tables against the last check's, after
# each schedule() and each update_from_output() (the check keeps them).
_APPEND_ONLY_CHECK = """

def block_table_check(scheduler):
    \"\"\"A check that each running request's block tables only grew since the last
    check, a slot keeping its block or turning null (the blocks a sliding window
    or a Mamba group no longer needs).\"\"\"
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    null_block_id = scheduler.kv_cache_manager.block_pool.null_block.block_id
    tables = {}

    def assert_block_tables_append_only(scheduler, processed=None):
        running = {request.request_id for request in scheduler.running}
        now = {
            (request_id, group_id): [block.block_id for block in blocks]
            for group_id, manager in enumerate(managers)
            for request_id, blocks in manager.req_to_blocks.items()
            if request_id in running
        }
        for (request_id, group_id), blocks in now.items():
            before = tables.get((request_id, group_id), [])
            kept = all(new in (old, null_block_id) for old, new in zip(before, blocks))
            assert len(blocks) >= len(before) and kept, (
@MESSAGE16@
                f"request {request_id}, group {group_id}: the block table went "
                f"from {before} to {blocks}"
            )
        tables.clear()
        tables.update(now)

    return assert_block_tables_append_only
"""
_EVICT_WATCH = "\n\n" + "\n".join(CACHED_BLOCK_IDS) + """


def watch_evictions(scheduler):
    \"\"\"Check the prefix cache after each evict_blocks() of the manager (the
    scheduler's recovery from a failed KV load).\"\"\"
    manager = scheduler.kv_cache_manager
    evict_blocks = manager.evict_blocks

    def checked_evict_blocks(block_ids, *args, **kwargs):
        evicted = evict_blocks(block_ids, *args, **kwargs)
        pool = manager.block_pool
        mapped = cached_block_ids(pool)
        for block_id in sorted(block_ids):
            block = pool.blocks[block_id]
            assert block.block_hash is None and block_id not in mapped, (
@MESSAGE16@
                f"block {block_id} is still cached (block hash: {block.block_hash}, "
                f"in the hash map: {block_id in mapped})"
            )
        return evicted

    manager.evict_blocks = checked_evict_blocks
"""
# free_order, by part: a freed request's blocks (KVCacheManager.free), or the
# free block queue around each BlockPool.free_blocks call.
_FREE_QUEUE = """

def free_queue(pool):
    return [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]
"""
_FREE_REVERSE = _FREE_QUEUE + """

def watch_frees(scheduler):
    \"\"\"Check the free block queue after each request's blocks are freed.\"\"\"
    manager = scheduler.kv_cache_manager
    pool, free = manager.block_pool, manager.free
    managers = manager.coordinator.single_type_managers

    def checked_free(request):
        tables = []
        for group_id in @GROUPS@:
            blocks = managers[group_id].req_to_blocks.get(request.request_id, [])
            tables.append(list(blocks))
        free_before = free_queue(pool)
        free(request)
        free_after = free_queue(pool)
        for blocks in tables:
            freed = [
                block.block_id
                for block in reversed(blocks)
                if block.block_id in free_after and block.block_id not in free_before
            ]
            # Cached blocks join the tail, uncached ones the head: each in order.
            for cached in (True, False):
                positions = [
                    free_after.index(block_id)
                    for block_id in freed
                    if (pool.blocks[block_id].block_hash is not None) is cached
                ]
                assert positions == sorted(positions), (
@MESSAGE20@
                    f"request {request.request_id} freed blocks {freed} (tail "
                    f"first), now at queue positions {positions}"
                )

    manager.free = checked_free
"""
_FREE_BLOCKS_WATCH = _FREE_QUEUE + """

def watch_frees(scheduler):
    \"\"\"Check the free block queue around each free_blocks() of the block pool.\"\"\"
    pool = scheduler.kv_cache_manager.block_pool
    free_blocks = pool.free_blocks

    def checked_free_blocks(ordered_blocks, *args, **kwargs):
        free_before = free_queue(pool)
        free_blocks(ordered_blocks, *args, **kwargs)
        free_after = free_queue(pool)
        stayed = [block_id for block_id in free_after if block_id in free_before]
@PART@
    pool.free_blocks = checked_free_blocks
"""
# ... or the blocks each BlockPool.get_new_blocks takes: the queue's head.
_ALLOCATION_WATCH = _FREE_QUEUE + """

def watch_allocations(scheduler):
    \"\"\"Check the free block queue around each get_new_blocks() of the block pool.\"\"\"
    pool = scheduler.kv_cache_manager.block_pool
    get_new_blocks = pool.get_new_blocks

    def checked_get_new_blocks(*args, **kwargs):
        free_before = free_queue(pool)
        blocks = get_new_blocks(*args, **kwargs)
        still_free = set(free_queue(pool))
        taken = [block_id for block_id in free_before if block_id not in still_free]
        assert taken == free_before[: len(taken)], (
@MESSAGE12@
            f"blocks {taken} were taken from the free block queue {free_before}"
        )
        return blocks

    pool.get_new_blocks = checked_get_new_blocks
"""
_FREE_PARTS = {
    "tail": """\
        if args or kwargs.get("evict_first"):
            return
        behind = free_after
        if stayed:
            behind = free_after[free_after.index(stayed[-1]) + 1 :]
        for block_id in free_after:
            block = pool.blocks[block_id]
            if block_id not in free_before and block.block_hash is not None:
                assert block_id in behind, (
@MESSAGE20@
                    f"block {block_id} was freed with its block hash ahead of "
                    f"blocks that stayed free"
                )
""",
    "order": """\
        assert stayed == [block_id for block_id in free_before if block_id in stayed], (
@MESSAGE12@
            f"the blocks that stayed free went from {free_before} to {stayed}"
        )
""",
    "end": """\
        if stayed:
            first = free_after.index(stayed[0])
            assert free_after[first : first + len(stayed)] == stayed, (
@MESSAGE16@
                f"the free block queue went from {free_before} to {free_after}"
            )
""",
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
# Where the test checks less than the rule, its docstring says so.
_DOCS[Category.STATE_TABLE_APPEND_ONLY] = (
    "A running request's block table may only grow or null out skipped blocks: checked after each schedule() "
    "and each update_from_output() on the requests running at both checks (not a table held while a request "
    "waits for a KV load).")
_DOCS[Category.STATE_ZEROING] = (
    "take_new_block_ids() must return only blocks this step allocated: blocks placed in a block table slot "
    "(a new one, or one holding another block) since the last take_new_block_ids().")
_DOCS[Category.STATE_HIT_BOUNDS] = (
    "A prefix cache hit must leave one token to compute and end on a block boundary (the hash block under "
    "partial hash hits, the scheduler block otherwise); with prefix caching off, every lookup misses.")
_DOCS[Category.STATE_EVICTED_FINDABLE] = (
    "The blocks evict_blocks() is given (the scheduler's recovery from a failed KV load) must leave the prefix "
    "cache, so no later lookup hits KV that failed to load.")
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
    pieces = wrap(text, width - len(indent) - 4).split("\n")  # quotes and ": "
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


_WATCHED = (*_AFTER_SCHEDULE, *_LOOKUP_CHECKS, Category.STATE_RESET, Category.STATE_ZEROING_MISSED,
            Category.STATE_ZEROING, Category.STATE_TABLE_APPEND_ONLY, Category.STATE_EVICTED_FINDABLE,
            Category.STATE_FREE_ORDER)


def _group_ids(settings, *kinds: str) -> list[int]:
    """The ids of the groups of these kinds in the layout vLLM built (validated ints)."""
    groups = (settings or {}).get("groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise Unscriptable("the finding's settings name no KV cache groups: no test")
    return [i for i, g in enumerate(groups) if g.get("kind") in kinds]


def _hit_bounds_check(settings, check: str) -> str:
    """hit_bounds' check for the finding's settings: a hit ends on the hash
    block under partial hash hits, else on the scheduler block (validated
    ints); with prefix caching off there is no hit at all."""
    partial, caching = settings.get("partial_hash_hits"), settings.get("enable_caching")
    if type(partial) is not bool or type(caching) is not bool:
        raise Unscriptable("the finding's engine settings do not say whether prefix caching and partial hash "
                           "hits are on: no test")
    if not caching:
        return """\
        num_computed_tokens = found[1]
        assert num_computed_tokens == 0, (
@MESSAGE12@
            f"request {request.request_id} hit {num_computed_tokens} tokens with "
            f"prefix caching off"
        )
"""
    key = "hash_block_size" if partial else "scheduler_block_size"
    unit = settings.get(key)
    if type(unit) is not int or not 0 < unit <= 1 << 12:
        raise Unscriptable(f"the finding's engine settings have no valid {key}: no test")
    return check.replace("@UNIT_NAME@", "hash" if partial else "scheduler").replace("@UNIT@", str(unit))


def _watched(category: Category, settings, detail: str | None) -> tuple[str, str, str, str | None]:
    """A rule checked after each schedule() or on one of the manager's calls:
    (the check's code, the test's body, its name, its message)."""
    name, message = _BEHAVIOUR[category]
    groups = (settings or {}).get("groups") or []
    if category in _AFTER_SCHEDULE:
        function, kind, code = _AFTER_SCHEDULE[category]
        code = code.replace("@GROUPS@", str(_group_ids(settings, kind)))
        return code, _AFTER_OUTPUTS.replace("@CHECK@", function), name, message
    if category in _LOOKUP_CHECKS:
        before, after = _LOOKUP_CHECKS[category]
        if category is Category.STATE_HIT_LENGTH:
            size = settings.get("hash_block_size") if isinstance(settings, dict) else None
            if (len(groups) != 1 or groups[0].get("kind") != "full_attention" or groups[0].get("eagle")
                    or type(size) is not int or groups[0].get("block_size") != size):
                raise Unscriptable("hit_length's test is written for one full-attention group whose block is the "
                                   "hash block, without EAGLE: no test")
            before, after = before.replace("@BLOCK@", str(size)), after.replace("@BLOCK@", str(size))
        if category is Category.STATE_HIT_BOUNDS:
            after = _hit_bounds_check(settings, after)
        code = _LOOKUP_WATCH.replace("@BEFORE@", before).replace("@CHECK@", after)
        return code, "    watch_lookups(scheduler)\n    drive(scheduler, OPS)", name, message
    if category is Category.STATE_RESET:
        return _RESET_WATCH, "    watch_resets(scheduler)\n    drive(scheduler, OPS)", name, message
    if category is Category.STATE_ZEROING:
        return _ZEROED_WATCH, "    watch_zeroed_blocks(scheduler)\n    drive(scheduler, OPS)", name, message
    if category is Category.STATE_TABLE_APPEND_ONLY:
        body = ("    assert_block_tables_append_only = block_table_check(scheduler)\n"
                + _AFTER_OUTPUTS.replace("@CHECK@", "assert_block_tables_append_only"))
        return _APPEND_ONLY_CHECK, body, name, message
    if category is Category.STATE_EVICTED_FINDABLE:
        return _EVICT_WATCH, "    watch_evictions(scheduler)\n    drive(scheduler, OPS)", name, message
    if category is Category.STATE_ZEROING_MISSED:
        if not _group_ids(settings, "mamba_align"):
            raise Unscriptable("vLLM zeroes new blocks only on layouts with Mamba groups: no test")
        code = _ZEROING_WATCH.replace("@GROUPS@", str(_group_ids(settings, "full_attention", "sliding_window")))
        return code, "    watch_zeroing(scheduler)\n    drive(scheduler, OPS)", name, message
    # free_order: the part the finding broke
    part = _free_order_part(detail)
    if part is None:
        raise Unscriptable("no test is written for this part of free_order (written for: "
                           + "; ".join(words for words, _, _ in _FREE_ORDER_PARTS.values()) + ")")
    _, name, message = _FREE_ORDER_PARTS[part]
    if part == "reverse":
        code = _FREE_REVERSE.replace("@GROUPS@", str(_group_ids(settings, "full_attention")))
    elif part == "head":
        return _ALLOCATION_WATCH, "    watch_allocations(scheduler)\n    drive(scheduler, OPS)", name, message
    else:
        code = _FREE_BLOCKS_WATCH.replace("@PART@", _FREE_PARTS[part])
    return code, "    watch_frees(scheduler)\n    drive(scheduler, OPS)", name, message


def rule_check(program: EngineProgram, settings, category: Category, detail: str | None = None) -> RuleCheck:
    """The rule a finding of ``category`` broke, as its check is written: the
    one rendering the engine test and the upstream script share (its
    functions, the lines driving the inputs under it, the rule's words), or
    ``Unscriptable`` saying why there is none (``detail``: the finding's, read
    for a retention hit's request and owed hit and free_order's part only)."""
    if category not in _BEHAVIOUR:
        raise Unscriptable(f"no engine regression test for {category.value} findings yet (written for: "
                           f"{', '.join(k.value for k in ENGINE_TEST_KINDS)})")
    name, message = _BEHAVIOUR[category]
    body = _retention_body(detail) if category is Category.STATE_RETENTION_HIT else _BODIES.get(category, "")
    check = ""
    if category is Category.STATE_WINDOW:
        check = _WINDOW_CHECK.replace("@MESSAGE@", "@MESSAGE16@")
    elif category in _STATE_CHECKS:
        check = _STATE_CHECKS[category][1]
    elif category in _WATCHED:
        check, body, name, message = _watched(category, settings, detail)
    doc = _DOCS.get(category) or f"{(message or '')[:1].upper()}{(message or '')[1:]}."
    return RuleCheck(category, name, _messages(check, message or ""), _messages(body, message or ""),
                     message or "", doc)


def emit_engine_test(program: EngineProgram, settings, category: Category, version: str,
                     detail: str | None = None) -> str:
    """The test's code, or ``Unscriptable`` saying why there is none
    (``detail``: the finding's, read for a retention hit's request and owed hit only)."""
    rule = rule_check(program, settings, category, detail)
    values = engine_values(program, settings, version, category is Category.STATE_BLOCK_ESTIMATE)
    template = (_TEST_TEMPLATE.replace("@CHECK@", rule.code)
                .replace("@DOC@", wrap(rule.doc)
                         + "\n\n"
                         + wrap(_ABOUT.format(family=program.setup.toy.family, version=version))
                         + ("\n\n" + wrap(OWN_CONNECTOR_NOTE) if values["OWN_CONNECTOR"] else ""))
                .replace("@NAME@", rule.name).replace("@BODY@", rule.body))
    return engine_code(template, program, values)


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
