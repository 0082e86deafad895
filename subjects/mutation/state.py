"""State-side operators: defects in the block pool, the managers' bookkeeping
and the coordinator's reconciliation, each killed by the stateful
differential (``diff_tests.stateful``).  Most leave every single request's
registration bounds and a fresh manager's lookups as they were, so only that
differential kills them; the two that change a group's block count for a hit
(``trim_first_group_only``, ``mamba_hit_unpadded``) the lookup contract sees
on one request too.  Each is the shape of a real upstream defect class (see
the manual's kill matrix).
"""

from __future__ import annotations

import ast

from .operator import COORDINATOR_FILE, MANAGER_FILE, MutationOperator
from .source import Edit, Missing, Source, exactly_one, find_class, find_method, is_attr, is_const, is_name, walk

__all__ = ["STATE_MUTANTS", "BLOCK_POOL_FILE", "KV_CACHE_MANAGER_FILE"]

BLOCK_POOL_FILE = "vllm/v1/core/block_pool.py"
KV_CACHE_MANAGER_FILE = "vllm/v1/core/kv_cache_manager.py"


def _method(src: Source, cls_name: str, name: str) -> tuple[str, ast.FunctionDef]:
    cls = find_class(src.tree, cls_name)
    method = find_method(cls, name)
    if method is None:
        raise Missing(f"{cls_name}.{name}")
    return f"{cls_name}.{name}", method


def _is_queue_call(node: ast.AST, attr: str) -> bool:
    """``self.free_block_queue.<attr>(...)`` as a statement."""
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and is_attr(node.value.func, attr) and is_attr(node.value.func.value, "free_block_queue", "self"))


def _touch_keeps_free(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "BlockPool", "touch")
    call = exactly_one([n for n in walk(method.body) if _is_queue_call(n, "remove")],
                       f"`self.free_block_queue.remove(block)` in {where}")
    return where, [src.replace(call, "pass")]


def _reset_ignores_held(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "BlockPool", "reset_prefix_cache")
    test = exactly_one(
        [n.test for n in walk(method.body)
         if isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
         and isinstance(n.test.left, ast.Name) and n.test.left.id == "num_used_blocks"
         and len(n.test.comparators) == 1 and is_const(n.test.comparators[0], 1)],
        f"`if num_used_blocks != 1:` in {where}")
    return where, [src.replace(test, "False")]


def _free_leaks_cached(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "BlockPool", "free_blocks")
    call = exactly_one([n for n in walk(method.body) if _is_queue_call(n, "append_n")],
                       f"`self.free_block_queue.append_n(...)` in {where}")
    return where, [src.replace(call, "pass")]


def _new_block_double_ref(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "BlockPool", "get_new_blocks")
    # `block.ref_cnt = 1` (0.29 on) or `block.ref_cnt += 1` (before): every one of them.
    sets = [n for n in walk(method.body)
            if isinstance(n, (ast.Assign, ast.AugAssign))
            and is_attr(n.targets[0] if isinstance(n, ast.Assign) else n.target, "ref_cnt", "block")
            and is_const(n.value, 1)]
    if not sets:
        raise Missing(f"`block.ref_cnt = 1` in {where}")
    return where, [src.replace(n.value, "2") for n in sets]


def _free_cached_block_misses(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "BlockPool", "get_cached_block")
    test = exactly_one(
        [n.test for n in walk(method.body)
         if isinstance(n, ast.If) and isinstance(n.test, ast.UnaryOp) and isinstance(n.test.op, ast.Not)
         and isinstance(n.test.operand, ast.Name) and n.test.operand.id == "block"],
        f"`if not block:` in {where}")
    return where, [src.replace(test, "not block or block.ref_cnt == 0")]


def _evict_skips_held_blocks(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "BlockPool", "evict_blocks")
    call = exactly_one(
        [n.value for n in walk(method.body)
         if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
         and is_attr(n.value.func, "_maybe_evict_cached_block", "self")],
        f"`self._maybe_evict_cached_block(block)` in {where}")
    # Only free blocks lose their hash: a failed load's block still held by its
    # request stays cached, and stays findable once the request frees it.
    return where, [src.replace(call, f"block.ref_cnt == 0 and {src.segment(call)}")]


def _trim_first_group_only(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "HybridKVCacheCoordinator", "find_longest_cache_hit")
    loop = exactly_one(
        [n for n in method.body
         if isinstance(n, ast.For) and is_attr(n.iter, "attention_groups", "self")
         and any(isinstance(m, ast.Delete) for m in walk(n.body))],
        f"the loop trimming every full-attention group's hit blocks in {where}")
    return where, [src.replace(loop.iter, "self.attention_groups[:1]")]


def _hit_keeps_trimmed_blocks(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "FullAttentionManager", "find_longest_cache_hit")
    # `for computed in computed_blocks: del computed[num_blocks:]` (0.26 on):
    # the hit length is cut for the EAGLE drop and the alignment; the blocks
    # past it no longer are.
    loop = exactly_one(
        [n for n in method.body
         if isinstance(n, ast.For) and isinstance(n.iter, ast.Name) and n.iter.id == "computed_blocks"
         and len(n.body) == 1 and isinstance(n.body[0], ast.Delete)],
        f"the loop `del computed[num_blocks:]` trimming the hit's blocks in {where}")
    return where, [src.replace(loop, "pass")]


def _mamba_hit_unpadded(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "MambaManager", "find_longest_cache_hit")
    # `computed.extend([block_pool.null_block] * i)`: the null blocks before
    # the one cached state, so a hit of h tokens holds cdiv(h, block) slots.
    pads = [n for n in walk(method.body)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and is_attr(n.value.func, "extend", "computed")
            and len(n.value.args) == 1 and isinstance(n.value.args[0], ast.BinOp)
            and "null_block" in ast.unparse(n.value.args[0])]
    if not pads:
        raise Missing(f"`computed.extend([block_pool.null_block] * i)` in {where}")
    return where, [src.replace(n, "pass") for n in pads]


def _mamba_state_slot_nulled(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "MambaManager", "allocate_new_blocks")
    # `[self._null_block for _ in range(prev_block_len, END)]`, the slots a
    # request skips in one step: one more, so the slot of the running state
    # is padded null and no block is allocated for it.
    end = exactly_one([n.args[1] for n in walk(method.body)
                       if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range"
                       and len(n.args) == 2 and isinstance(n.args[0], ast.Name) and n.args[0].id == "prev_block_len"
                       and isinstance(n.args[1], ast.Name)],
                      f"`range(prev_block_len, num_skipped_blocks)` (the null padding) in {where}")
    return where, [src.replace(end, f"{end.id} + 1")]


def _allocate_floors_partial_block(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "SingleTypeKVCacheManager", "allocate_new_blocks")
    assign = exactly_one(
        [n for n in walk(method.body)
         if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
         and n.targets[0].id == "num_required_blocks" and isinstance(n.value, ast.Call)
         and isinstance(n.value.func, ast.Name) and n.value.func.id == "cdiv" and len(n.value.args) == 2],
        f"`num_required_blocks = cdiv(num_tokens, self.block_size)` in {where}")
    tokens, block = (ast.unparse(a) for a in assign.value.args)
    return where, [src.replace(assign.value, f"{tokens} // {block}")]


def _local_hit_untouched(src: Source) -> tuple[str, list[Edit]]:
    # The method that takes a lookup's hit blocks into the request's table:
    # add_local_computed_blocks from 0.26, allocate_new_computed_blocks before.
    cls = find_class(src.tree, "SingleTypeKVCacheManager")
    for name in ("add_local_computed_blocks", "allocate_new_computed_blocks"):
        method = find_method(cls, name)
        if method is not None:
            break
    else:
        raise Missing("SingleTypeKVCacheManager.add_local_computed_blocks")
    where = f"SingleTypeKVCacheManager.{name}"
    call = exactly_one(
        [n for n in walk(method.body)
         if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and is_attr(n.value.func, "touch")
         and is_attr(n.value.func.value, "block_pool", "self")],
        f"`self.block_pool.touch(new_computed_blocks)` in {where}")
    return where, [src.replace(call, "pass")]


def _free_keeps_cached_count(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "SingleTypeKVCacheManager", "pop_blocks_for_free")
    call = exactly_one(
        [n for n in method.body
         if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
         and is_attr(n.value.func, "pop") and is_attr(n.value.func.value, "num_cached_block", "self")],
        f"`self.num_cached_block.pop(request_id, None)` in {where}")
    return where, [src.replace(call, "pass")]


def _free_cached_to_head(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "BlockPool", "free_blocks")
    call = exactly_one([n for n in walk(method.body) if _is_queue_call(n, "append_n")],
                       f"`self.free_block_queue.append_n(...)` in {where}")
    return where, [src.replace(call.value.func, "self.free_block_queue.prepend_n")]


def _free_head_first(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "SingleTypeKVCacheManager", "free")
    # `free_blocks(reversed(...))` (0.26 on) or `ordered_blocks = reversed(req_blocks)` (before).
    call = exactly_one([n for n in walk(method.body) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                        and n.func.id == "reversed" and len(n.args) == 1],
                       f"`reversed(...)` in {where}")
    return where, [src.replace(call, src.segment(call.args[0]))]


def _allocate_from_queue_tail(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "BlockPool", "get_new_blocks")
    call = exactly_one([n for n in walk(method.body)
                        if isinstance(n, ast.Call) and is_attr(n.func, "popleft_n")
                        and is_attr(n.func.value, "free_block_queue", "self")],
                       f"`self.free_block_queue.popleft_n(num_blocks)` in {where}")
    # The same number of blocks, taken from the tail (the most recently freed
    # first), each removed from the queue as the head's would be.
    count = src.segment(call.args[0])
    return where, [src.replace(call, "[(self.free_block_queue.remove(b), b)[1] for b in "
                                     f"self.free_block_queue.get_all_free_blocks()[::-1][:{count}]]")]


def _zeroing_ids_undrained(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "SingleTypeKVCacheManager", "take_new_block_ids")
    reset = exactly_one([n for n in method.body
                         if isinstance(n, ast.Assign) and len(n.targets) == 1
                         and is_attr(n.targets[0], "new_block_ids", "self")],
                        f"`self.new_block_ids = []` in {where}")
    return where, [src.replace(reset, "pass")]


def _skipped_slots_deleted(src: Source) -> tuple[str, list[Edit]]:
    # The loop nulling the slots of skipped blocks: `_remove_blocks_in_range`
    # (0.25 on), `remove_skipped_blocks` before; the base class's only.
    cls = find_class(src.tree, "SingleTypeKVCacheManager")
    method = find_method(cls, "_remove_blocks_in_range") or find_method(cls, "remove_skipped_blocks")
    if method is None:
        raise Missing("SingleTypeKVCacheManager.remove_skipped_blocks")
    where = f"SingleTypeKVCacheManager.{method.name}"
    stmt = exactly_one([n for n in walk(method.body)
                        if isinstance(n, ast.Assign) and len(n.targets) == 1
                        and isinstance(n.targets[0], ast.Subscript) and is_name(n.targets[0].value, "blocks")
                        and is_attr(n.value, "_null_block", "self")],
                       f"`blocks[i] = self._null_block` in {where}")
    return where, [src.replace(stmt, f"del {src.segment(stmt.targets[0])}")]


def _window_frees_early(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "SlidingWindowManager", "get_num_skipped_tokens")
    # `return max(0, num_computed_tokens - self.sliding_window + 1 [- extra])`: one block more skipped.
    call = exactly_one([n.value for n in walk(method.body)
                        if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)
                        and isinstance(n.value.func, ast.Name) and n.value.func.id == "max"
                        and len(n.value.args) == 2 and is_const(n.value.args[0], 0)],
                       f"`return max(0, ...)` in {where}")
    return where, [src.replace(call.args[1], f"({src.segment(call.args[1])}) + self.block_size")]



def _lookup_touches_hit(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "KVCacheManager", "get_computed_blocks")
    assign = exactly_one(
        [n for n in walk(method.body)
         if isinstance(n, ast.Assign) and len(n.targets) == 1 and is_name(n.targets[0], "blocks")
         and isinstance(n.value, ast.Call) and is_attr(n.value.func, "create_kv_cache_blocks", "self")
         and len(n.value.args) == 1 and isinstance(n.value.args[0], ast.Name)],
        f"`blocks = self.create_kv_cache_blocks(computed_blocks)` in {where}")
    # The hit blocks pinned at the lookup (so nothing evicts them before
    # allocate_slots adopts them), which touches them again: a lookup takes a
    # reference, and one whose request is not admitted keeps it.
    hit, indent = assign.value.args[0].id, " " * assign.col_offset
    return where, [src.replace(assign, f"{src.segment(assign)}\n{indent}for group_blocks in {hit}:\n"
                                       f"{indent}    self.block_pool.touch(group_blocks)")]


def _unitary_hit_limit_decremented(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "UnitaryKVCacheCoordinator", "find_longest_cache_hit")
    # `max_length=max_cache_hit_length`: its caller already keeps the last
    # token back (num_tokens - 1); one more, so a prompt one token past a
    # block boundary loses its last cached block (clamped at 0: unclamped, a
    # one-token prompt crashes the lookup first).
    limit = exactly_one([k.value for n in walk(method.body) if isinstance(n, ast.Call) for k in n.keywords
                         if k.arg == "max_length" and is_name(k.value, "max_cache_hit_length")],
                        f"`max_length=max_cache_hit_length` in {where}")
    return where, [src.replace(limit, f"max(0, {limit.id} - 1)")]


def _lookup_counts_partial_block(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "FullAttentionManager", "find_longest_cache_hit")
    # `itertools.islice(full_block_hashes, max_length // block_size)`: the
    # blocks a hit may cover, rounded up instead of down.
    bound = exactly_one(
        [n.args[1] for n in walk(method.body)
         if isinstance(n, ast.Call) and is_attr(n.func, "islice") and len(n.args) == 2
         and isinstance(n.args[1], ast.BinOp) and isinstance(n.args[1].op, ast.FloorDiv)
         and is_name(n.args[1].left, "max_length")],
        f"`islice(..., max_length // block_size)` in {where}")
    return where, [src.replace(bound, f"cdiv(max_length, {src.segment(bound.right)})")]


def _zeroing_ids_overwritten(src: Source) -> tuple[str, list[Edit]]:
    where, method = _method(src, "SingleTypeKVCacheManager", "allocate_new_blocks")
    # `self.new_block_ids.extend(b.block_id for b in new_blocks)`: assigned
    # instead, so the blocks recorded earlier in the step (another request's)
    # are dropped before take_new_block_ids hands them out.
    call = exactly_one(
        [n for n in walk(method.body)
         if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and is_attr(n.value.func, "extend")
         and is_attr(n.value.func.value, "new_block_ids", "self") and len(n.value.args) == 1
         and isinstance(n.value.args[0], ast.GeneratorExp)],
        f"`self.new_block_ids.extend(b.block_id for b in new_blocks)` in {where}")
    generator = call.value.args[0]
    if len(generator.generators) != 1 or generator.generators[0].ifs:
        raise Missing(f"`self.new_block_ids.extend(b.block_id for b in new_blocks)` in {where}")
    loop = generator.generators[0]
    return where, [src.replace(call, f"self.new_block_ids = [{src.segment(generator.elt)} for "
                                     f"{src.segment(loop.target)} in {src.segment(loop.iter)}]")]


STATE_MUTANTS: tuple[MutationOperator, ...] = (
    MutationOperator(
        "touch_keeps_free_block",
        "BlockPool.touch takes a reference on a hit block without removing it from the free queue "
        "(a referenced block can be handed to another request)",
        "", _touch_keeps_free, BLOCK_POOL_FILE, side="state"),
    MutationOperator(
        "reset_ignores_held_blocks",
        "BlockPool.reset_prefix_cache clears the cache while requests still hold blocks",
        "", _reset_ignores_held, BLOCK_POOL_FILE, side="state"),
    MutationOperator(
        "free_leaks_cached_blocks",
        "BlockPool.free_blocks never returns cached blocks to the free queue (the pool leaks)",
        "", _free_leaks_cached, BLOCK_POOL_FILE, side="state"),
    MutationOperator(
        "free_cached_to_head",
        "BlockPool.free_blocks puts freed cached blocks at the head of the free queue instead of its tail "
        "(the most recently used cached blocks are evicted first: LRU eviction broken, hit rate falls)",
        "", _free_cached_to_head, BLOCK_POOL_FILE, side="state"),
    MutationOperator(
        "free_head_first",
        "SingleTypeKVCacheManager.free returns a request's blocks in table order instead of reversed (the "
        "shared prefix is evicted before the request's own tail)",
        "", _free_head_first, MANAGER_FILE, side="state"),
    MutationOperator(
        "window_frees_early",
        "SlidingWindowManager.get_num_skipped_tokens counts one block more than the tokens before the window "
        "(the block holding the window's first tokens is freed while the next step still reads it)",
        "", _window_frees_early, MANAGER_FILE, side="state"),
    MutationOperator(
        "allocate_from_queue_tail",
        "BlockPool.get_new_blocks takes its blocks from the free queue's tail instead of its head (the most "
        "recently freed cached blocks are evicted first: LRU eviction broken, hit rate falls)",
        "", _allocate_from_queue_tail, BLOCK_POOL_FILE, side="state"),
    MutationOperator(
        "zeroing_ids_undrained",
        "SingleTypeKVCacheManager.take_new_block_ids returns the blocks recorded for zeroing without draining "
        "them: every later step hands them out to be zeroed again, wiping KV computed since (layouts with "
        "Mamba layers, where vLLM zeroes new attention blocks)",
        "", _zeroing_ids_undrained, MANAGER_FILE, side="state"),
    MutationOperator(
        "skipped_slots_deleted",
        "SingleTypeKVCacheManager deletes the block-table slots of blocks no longer attended to (a sliding "
        "window's) instead of nulling them: a running request's table shrinks and every later block shifts "
        "onto an earlier token's slot",
        "", _skipped_slots_deleted, MANAGER_FILE, side="state"),
    MutationOperator(
        "new_block_double_ref",
        "BlockPool.get_new_blocks hands blocks out with a reference count of 2 (freed blocks never free)",
        "", _new_block_double_ref, BLOCK_POOL_FILE, side="state"),
    MutationOperator(
        "free_cached_block_misses",
        "BlockPool.get_cached_block misses a cached block no request holds (in the free queue): the cache "
        "serves only prefixes shared by requests running together, and hit rate falls silently",
        "", _free_cached_block_misses, BLOCK_POOL_FILE, side="state"),
    MutationOperator(
        "evict_skips_held_blocks",
        "BlockPool.evict_blocks evicts only free blocks: a failed KV load's blocks still held by a request "
        "keep their hash, so a later request hits KV that never loaded (killed through the engine, where "
        "kvspec's connector fails loads)",
        "", _evict_skips_held_blocks, BLOCK_POOL_FILE, side="state"),
    MutationOperator(
        "trim_first_group_only",
        "HybridKVCacheCoordinator.find_longest_cache_hit trims only the first full-attention group to the "
        "reconciled hit (the 0.23-0.28 shape)",
        "", _trim_first_group_only, COORDINATOR_FILE, side="state"),
    MutationOperator(
        "free_keeps_cached_count",
        "SingleTypeKVCacheManager.pop_blocks_for_free forgets to drop the request's count of cached blocks "
        "(a resumed request skips registering)",
        "", _free_keeps_cached_count, MANAGER_FILE, side="state"),
    MutationOperator(
        "hit_keeps_trimmed_blocks",
        "FullAttentionManager.find_longest_cache_hit cuts the hit length for the EAGLE drop but keeps the "
        "block past it (the request is handed a cached block it will write; one-group models, where no "
        "coordinator trims after the manager)",
        "", _hit_keeps_trimmed_blocks, MANAGER_FILE, side="state"),
    MutationOperator(
        "mamba_hit_unpadded",
        "MambaManager.find_longest_cache_hit returns the cached state without the null blocks before it "
        "(a hit of h tokens no longer holds cdiv(h, block) slots)",
        "", _mamba_hit_unpadded, MANAGER_FILE, side="state"),
    MutationOperator(
        "mamba_state_slot_nulled",
        "MambaManager.allocate_new_blocks pads one slot too many with null blocks when a step skips "
        "blocks, so the slot of the running state holds the null block and none is allocated for it",
        "", _mamba_state_slot_nulled, MANAGER_FILE, side="state"),
    MutationOperator(
        "allocate_floors_partial_block",
        "SingleTypeKVCacheManager.allocate_new_blocks floors the blocks a request needs instead of "
        "rounding up (no slot for a partial last block)",
        "", _allocate_floors_partial_block, MANAGER_FILE, side="state"),
    MutationOperator(
        "local_hit_untouched",
        "SingleTypeKVCacheManager.add_local_computed_blocks puts the lookup's hit blocks in the table "
        "without taking a reference on them (they stay free, to be evicted under the request)",
        "", _local_hit_untouched, MANAGER_FILE, side="state"),
    MutationOperator(
        "lookup_touches_hit",
        "KVCacheManager.get_computed_blocks takes a reference on its hit blocks (to keep them from eviction "
        "until allocate_slots), which takes one again: a lookup changes the pool, and a hit block keeps a "
        "reference no block table holds",
        "", _lookup_touches_hit, KV_CACHE_MANAGER_FILE, side="state"),
    MutationOperator(
        "unitary_hit_limit_decremented",
        "UnitaryKVCacheCoordinator.find_longest_cache_hit keeps back one token more than the num_tokens - 1 its "
        "caller passes: a prompt one token past a block boundary loses its last cached block (one-group models)",
        "", _unitary_hit_limit_decremented, COORDINATOR_FILE, side="state"),
    MutationOperator(
        "lookup_counts_partial_block",
        "FullAttentionManager.find_longest_cache_hit rounds the blocks a hit may cover up instead of down "
        "(cdiv(max_length, block)): on a fully cached block-aligned prompt full attention hits every token "
        "(a one-group model's schedule() then asserts; a hybrid's coordinator settles on a hit off the block "
        "boundary, the prompt less one token)",
        "", _lookup_counts_partial_block, MANAGER_FILE, side="state"),
    MutationOperator(
        "zeroing_ids_overwritten",
        "SingleTypeKVCacheManager.allocate_new_blocks assigns the blocks it records for zeroing instead of "
        "extending the list: an earlier allocation's blocks in the same step (another request's) are never "
        "zeroed (layouts with Mamba layers)",
        "", _zeroing_ids_overwritten, MANAGER_FILE, side="state"),
)
