"""The KV-cache manager's observable state, and the rules it keeps after every operation.

The registration differential sees two numbers per request; bugs in this code
live in the *state*: per-group block tables, blocks shared between requests
and with the prefix cache, reference counts, the free-block queue, the hash
map.  ``ManagerState`` is what a worker reads of vLLM's ``KVCacheManager``
after an operation (``subjects/vllm_side/state_machine.py``, ``Machine.snapshot``);
``INVARIANTS`` are the rules, each written once, each with its scope: exact
where vLLM's own contract is exact, and the weaker statement kvspec does check
where the model is not exact (sliding-window and Mamba tables, eviction
order, registrations under sparse retention).

Every check is a function ``(transition) -> list of violations`` over
observations only; it never asks vLLM what vLLM should have done.  A
violation is its words and, where the rule names them, the kinds of the
groups that broke it (``Violation``): the mechanism a known vLLM bug is
recognised by (``model.known``), as data rather than read back from words.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from typing import Any, Callable, Iterable

import attrs

from .arith import INT
from .capabilities import Capabilities, ExpectedRegime
from .domain import CoordinatorConfig, GroupKind, KVCacheGroup
from .finding import Category
from .lookup import hit_blocks
from .retention import RETENTION_SCOPE

__all__ = ["Allocation", "Block", "Table", "ManagerState", "Lookup", "Transition", "Invariant", "INVARIANTS",
           "OUT_OF_SCOPE", "Violation", "check_transition", "scope_text", "groups_over_estimate",
           "over_estimate_kinds", "named_group_kinds"]


@attrs.frozen
class Block:
    """One physical block of the pool."""

    id: int
    ref_cnt: int
    keys: tuple[int, ...] = ()  # the hash-map keys the block says it owns (opaque ids)


@attrs.frozen
class Table:
    """One request's block table in one KV-cache group."""

    request: str
    group: int
    blocks: tuple[int, ...]  # block ids; a replaced slot holds the null block
    cached: int = 0  # blocks already offered for registration (num_cached_block)


@attrs.frozen
class ManagerState:
    null_block: int
    num_free: int  # the pool's own counter
    free_queue: tuple[int, ...]  # the free queue, head first
    blocks: tuple[Block, ...]  # indexed by block id, as vLLM's pool is
    hash_map: tuple[tuple[int, int], ...]  # every (key id, block id) entry of the map
    tables: tuple[Table, ...]
    # Blocks the scheduler holds outside every table (vLLM's deferred frees
    # while a step is in flight), each occurrence one reference.
    held_elsewhere: tuple[int, ...] = ()
    # The blocks referenced or keyed, when the maker knows them (the compact
    # snapshot lists exactly these); every other block is idle.  Only a
    # shortcut: the rules read the same facts either way.
    listed: tuple[Block, ...] | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], previous: "ManagerState | None" = None,
                  same: Iterable[str] = ()) -> "ManagerState":
        """From the worker's compact snapshot (``Machine.snapshot``): blocks
        left out are unreferenced and keyless; the free queue comes head
        first as [first, last] runs of consecutive ids, ascending or
        descending (first > last).  The parts named in ``same`` are those of
        ``previous`` (read from the same data before), not parsed again."""
        same = set(same) if previous is not None and previous.listed is not None else set()
        if "blocks" in same and len(previous.blocks) == data["num_blocks"]:
            blocks_t, listed_t = previous.blocks, previous.listed
        else:
            blocks = list(_idle_pool(data["num_blocks"]))
            listed = []
            # Blocks are immutable values: one unchanged since ``previous`` is reused.
            known = {b.id: b for b in previous.listed} if previous is not None and previous.listed else {}
            for block_id, ref_cnt, keys in data["blocks"]:
                block = known.get(block_id)
                if block is None or block.ref_cnt != ref_cnt or list(block.keys) != keys:
                    block = Block(block_id, ref_cnt, tuple(keys))
                if 0 <= block_id < len(blocks):
                    blocks[block_id] = block
                listed.append(block)
            blocks_t, listed_t = tuple(blocks), tuple(listed)
        queue = previous.free_queue if "free_runs" in same else _queue(data["free_runs"])
        hash_map = previous.hash_map if "hash_map" in same else tuple((k, b) for k, b in data["hash_map"])
        tables = previous.tables if "tables" in same else tuple(
            Table(t[0], t[1], tuple(t[2]), t[3]) for t in data["tables"])
        return cls(null_block=data["null_block"], num_free=data["num_free"], free_queue=queue, blocks=blocks_t,
                   hash_map=hash_map, tables=tables, held_elsewhere=tuple(data.get("held_elsewhere", ())),
                   listed=listed_t)

    def active(self) -> tuple[Block, ...] | list[Block]:
        """The blocks referenced (either way) or keyed; the rest are idle:
        reference count 0, no key."""
        if self.listed is not None:
            return self.listed
        return [b for b in self.blocks if b.ref_cnt or b.keys]

    def idle_ids(self) -> set[int]:
        return set(range(len(self.blocks))) - {b.id for b in self.active()}

    def keyed(self) -> list[Block]:
        """The blocks that own a key."""
        return [b for b in self.active() if b.keys]

    def held(self) -> Counter:
        """How many table slots (and holds outside the tables) hold each block."""
        held = Counter(b for t in self.tables for b in t.blocks)
        held.update(self.held_elsewhere)
        return held

    def tables_of(self, request: str) -> list[Table]:
        return [t for t in self.tables if t.request == request]


def _queue(runs: list[list[int]]) -> tuple[int, ...]:
    out: list[int] = []
    for first, last in runs:
        out.extend(range(first, last + 1) if first <= last else range(first, last - 1, -1))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _idle_pool(num_blocks: int) -> tuple[Block, ...]:
    """A pool of unreferenced, keyless blocks (immutable values, made once per size)."""
    return tuple(Block(i, 0) for i in range(num_blocks))


@attrs.frozen
class Lookup:
    """What ``get_computed_blocks`` answered for one request."""

    request: str
    hit: int
    group_blocks: tuple[tuple[int, ...], ...]  # per group, the hit's blocks
    num_tokens: int
    # (ref counts, free count, number of keys) before and after the lookup:
    # a lookup takes no reference and registers nothing.
    before: tuple[Any, ...] = ()
    after: tuple[Any, ...] = ()
    external: int = 0  # tokens a KV connector gave the request past the hit
    # One-group models: whether the map held each of the request's block
    # hashes when the lookup started (None: not observed).
    mapped: tuple[bool, ...] | None = None
    # The least hit retention owes this lookup (model.retention; engine
    # programs only) and why; 0: nothing owed or not predicted.
    owed: int = 0
    owed_why: str = ""
    # With a KV connector on a hybrid (0.27+ get_computed_blocks_for_connector),
    # the groups' hits may end at different points: the hit is full
    # attention's, and a lagging group may hold fewer blocks (the scheduler
    # reconciles, or a connector's load supplies the rest).
    diverged: bool = False


@attrs.frozen
class Transition:
    """One operation on the manager and what was observed around it."""

    op: str  # model.program.OPERATIONS
    request: str | None  # the request the operation names, if any
    before: ManagerState | None
    after: ManagerState
    config: CoordinatorConfig
    regime: ExpectedRegime
    capabilities: Capabilities
    running: dict[str, int]  # running requests -> computed tokens, after the op
    lookups: tuple[Lookup, ...] = ()  # in the order the step made them
    gone: tuple[str, ...] = ()  # requests freed or preempted by the operation
    reset_succeeded: bool | None = None
    handed_for_zeroing: tuple[int, ...] = ()
    # Each allocate_slots the operation made (the engine driver observes them):
    # the groups' last block estimates, and the free blocks before and after.
    allocations: tuple["Allocation", ...] = ()
    # The block ids the manager's evict_blocks was given during the operation
    # (the engine driver observes the calls: a failed KV load).
    evicted: tuple[int, ...] = ()
    # Waiting requests holding blocks for a KV load in flight, after the op.
    loading: tuple[str, ...] = ()
    # Running requests -> the most computed tokens each had since it last
    # started running (the oracle carries it; absent: its ``running`` count).
    peaks: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class Allocation:
    request: str
    estimates: tuple[int | None, ...]  # per group, the last get_num_blocks_to_allocate (None: not asked)
    free_before: int
    free_after: int | None  # None: allocate_slots raised
    # Per group, the blocks it asked the pool for (get_new_blocks) in the
    # allocation, all taken unless the allocation raised (empty: not observed).
    taken: tuple[int, ...] = ()


@attrs.frozen
class Violation:
    """One broken rule: its words, and the kinds of the groups the rule names
    as breaking it (empty: it names none)."""

    message: str
    group_kinds: tuple[GroupKind, ...] = ()


@attrs.frozen
class Invariant:
    name: str
    category: Category
    statement: str  # what is checked, in words
    # Violations in words, or as ``Violation`` where the rule names the groups.
    check: Callable[[Transition], list[str | Violation]]
    exact: bool = True  # False: the weaker statement that kvspec checks, said in ``statement``
    # For a rule over the state after the operation alone: the fields it
    # reads.  When they are the very values of a state already held to it,
    # the answer is known (``check_transition(..., before_checked=True)``).
    reads: tuple[str, ...] = ()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- the pool ----------------------------------------------------------------------

def _free_list(t: Transition) -> list[str]:
    s = t.after
    out = []
    if len(s.free_queue) != s.num_free:
        out.append(f"the free-block counter says {s.num_free}, the free queue holds {len(s.free_queue)}")
    twice = [b for b, n in Counter(s.free_queue).items() if n > 1] if len(set(s.free_queue)) < len(s.free_queue) else []
    if twice:
        out.append(f"block {twice[0]} is in the free queue {Counter(s.free_queue)[twice[0]]} times")
    if s.null_block in s.free_queue:
        out.append("the null block is in the free queue")
    return out


def _free_iff_unreferenced(t: Transition) -> list[str]:
    s = t.after
    queued = set(s.free_queue)
    leaked = "has no reference and is not in the free queue (leaked)"
    # Idle blocks (count 0, no key) by set arithmetic, the others one by one.
    found = [(i, f"block {i} {leaked}") for i in s.idle_ids() - queued - {s.null_block}]
    for b in s.active():
        if b.id == s.null_block:
            continue
        if b.ref_cnt == 0 and b.id not in queued:
            found.append((b.id, f"block {b.id} {leaked}"))
        elif b.ref_cnt > 0 and b.id in queued:
            found.append((b.id, f"block {b.id} is referenced {b.ref_cnt} times and also in the free queue"))
        elif b.ref_cnt < 0:
            found.append((b.id, f"block {b.id} has a negative reference count {b.ref_cnt}"))
    return [message for _, message in sorted(found)[:3]]


def _ref_counts(t: Transition) -> list[str]:
    s = t.after
    held = s.held()
    out = []
    pool = len(s.blocks)
    # An idle block (count 0) breaks the rule only if a slot holds it.
    suspects = {i for i in ({b.id for b in s.active()} | set(held)) if 0 <= i < pool}
    for b in (s.blocks[i] for i in sorted(suspects)):
        if b.id != s.null_block and b.ref_cnt != held.get(b.id, 0):
            out.append(f"block {b.id} has reference count {b.ref_cnt}, {held.get(b.id, 0)} table slots hold it")
    return out[:3]


def _one_group(t: Transition) -> list[str]:
    # Groups share the pool's block ids, not blocks: a block id names memory
    # in every group's layers, so one held by two groups at once aliases them.
    owner: dict[int, int] = {}
    null = t.after.null_block
    for table in t.after.tables:
        for block in table.blocks:
            if block == null:
                continue
            first = owner.setdefault(block, table.group)
            if first != table.group:
                return [f"block {block} is held by group {first} and group {table.group} at once"]
    return []


def _hash_map(t: Transition) -> list[str]:
    s = t.after
    by_block: dict[int, set[str]] = {}
    for key, block in s.hash_map:
        by_block.setdefault(block, set()).add(key)
    out = []
    pool = len(s.blocks)
    # Only blocks that own a key or that the map names can break the rule.
    for block_id in sorted(set(by_block) | {b.id for b in s.keyed()}):
        if not 0 <= block_id < pool:
            continue
        b = s.blocks[block_id]
        mapped = by_block.get(block_id, set())
        if block_id == s.null_block and (mapped or b.keys):
            out.append("the null block is registered in the hash map")
        elif mapped != set(b.keys):
            extra, missing = sorted(mapped - set(b.keys)), sorted(set(b.keys) - mapped)
            out.append(f"block {b.id}: the map has {len(extra)} key(s) the block does not own and the block "
                       f"owns {len(missing)} key(s) the map does not have")
    unknown = sorted(b for b in by_block if not 0 <= b < pool)
    if unknown:
        out.append(f"the hash map points at block {unknown[0]}, which is not in the pool")
    if not t.config.enable_caching and (s.hash_map or s.keyed()):
        out.append(f"prefix caching is off, yet {len(s.hash_map)} hash map entries and {len(s.keyed())} keyed "
                   f"blocks exist")
    return out[:3]



def _free_order(t: Transition) -> list[str]:
    # vLLM's queue (FreeKVCacheBlockQueue) changes only by: allocation popping
    # the head, a cache hit removing ("touching") a block where it lies, and
    # free_blocks putting blocks that reach count 0 at the tail (keyed ones:
    # the LRU order) or, from 0.26, at the head (keyless ones), each call in
    # the order it is given -- reversed table order when a request is freed.
    if t.before is None:
        return []
    q0, q1 = t.before.free_queue, t.after.free_queue
    if q0 is q1 or q0 == q1 or len(set(q1)) < len(q1):  # a duplicate is free_list's finding
        return []
    where = {b: i for i, b in enumerate(q1)}
    touched = {b for lk in t.lookups for blocks in lk.group_blocks for b in blocks}
    rest = [b for b in q0 if b not in touched]
    ambiguous = touched & set(q0)  # a hit left in place, or touched and freed again: either
    # Allocation took the head: at least everything up to the last block gone.
    k_min = max((i + 1 for i, b in enumerate(rest) if b not in where), default=0)
    # Only an allocation pops, and only a scheduler step allocates; a block it
    # took may be freed again before the step ends (a preemption, a Mamba
    # state block passed over, a copy-on-write block released at the step's
    # end; the last two unseen in any table, so any step on a layout with a
    # sliding-window or Mamba group may have freed).
    frees = bool(t.gone) or _released(t) or any(g.kind is not GroupKind.FULL_ATTENTION for g in t.config.groups)
    may_return = t.op == "schedule" and frees
    if not may_return or not rest or rest[-1] not in where:
        return _split_order(t, rest, k_min, where, ambiguous, may_return)[:3]
    # Such a block is back at an end, where it may look unmoved, so how much
    # of the head was taken is not observed: the queue keeps the order if some
    # split of the old queue into a head taken and survivors explains it.
    # Reported: the split whose survivors are the longest tail of the old
    # queue found in order (the likeliest).
    run = [b for b in q1 if b not in ambiguous]
    p, matched = run.index(rest[-1]), 0
    while matched <= p and matched < len(rest) and run[p - matched] == rest[-1 - matched]:
        matched += 1
    likeliest = max(k_min, len(rest) - matched)
    first = _split_order(t, rest, likeliest, where, ambiguous, may_return)
    if not first:
        return []
    for k in range(k_min, len(rest) + 1):
        if k != likeliest and not _split_order(t, rest, k, where, ambiguous, may_return):
            return []
    return first[:3]


def _split_order(t: Transition, rest: list[int], k: int, where: dict[int, int], ambiguous: set[int],
                 may_return: bool) -> list[str]:
    """What breaks the order if the operation took ``rest[:k]`` (the old
    queue less hits) from the head and ``rest[k:]`` stayed free."""
    q0, q1 = t.before.free_queue, t.after.free_queue
    popped, kept = rest[:k], rest[k:]
    back = [b for b in popped if b in where]  # taken and freed again within the operation
    out = []
    if back and not may_return:
        out.append(f"block {back[0]} left the free queue's head while block {rest[k - 1]}, behind it, was taken "
                   "(allocation pops from the head), and the operation freed nothing it could have come back by")
    positions = [where[b] for b in kept]
    for a, b, pa, pb in zip(kept, kept[1:], positions, positions[1:]):
        if pb < pa:
            out.append(f"blocks {a} and {b} stayed free but changed their order in the queue")
            break
    if not positions:
        return out
    lo, hi = min(positions), max(positions)
    survivors = set(kept)
    inside = [b for b in q1[lo:hi + 1] if b not in survivors and b not in ambiguous]
    if inside:
        out.append(f"block {inside[0]}, newly free, lies among blocks that stayed free (freed blocks go to the "
                   "head or the tail of the queue)")
    # A free block never gains a key, so one keyed now was keyed when freed.
    blocks = t.after.blocks
    early = [b for b in q1[:lo] if b not in ambiguous and 0 <= b < len(blocks) and blocks[b].keys]
    if early and t.op not in ("reset", "evict"):
        out.append(f"block {early[0]}, newly free and cached, lies ahead of blocks that stayed free (a freed "
                   "cached block joins the tail: least recently used first)")
    return out + _freed_tail_first(t, where, set(q0) - set(back))


def _released(t: Transition) -> bool:
    """Whether a block held before the operation is held less after it."""
    before, after = t.before.held() if t.before else Counter(), t.after.held()
    return any(after.get(b, 0) < n for b, n in before.items() if b != t.after.null_block)


def _freed_tail_first(t: Transition, where: dict[int, int], stayed: set[int]) -> list[str]:
    # A freed request's full-attention blocks held by it alone reach count 0
    # in one free_blocks call given in reverse slot order; keyed and keyless
    # ones may go to different ends, each end in that order.  (Sliding-window
    # and Mamba groups may free part of a table earlier in the same operation,
    # a separate call, so their order is not checked here.)
    null, held, blocks = t.after.null_block, t.before.held(), t.after.blocks
    for request in t.gone:
        for table in t.before.tables_of(request):
            if t.config.groups[table.group].kind is not GroupKind.FULL_ATTENTION:
                continue
            for keyed in (True, False):
                order = [(where[b], slot, b) for slot, b in enumerate(table.blocks)
                         if b != null and held.get(b) == 1 and b in where and b not in stayed
                         and bool(blocks[b].keys) is keyed]
                order.sort()
                for (_, s1, b1), (_, s2, b2) in zip(order, order[1:]):
                    if s2 > s1:
                        return [f"request {request}, group {table.group}: freed block {b1} (slot {s1}) lies ahead "
                                f"of block {b2} (slot {s2}) in the free queue; a freed request's blocks join it "
                                "tail first (reverse slot order)"]
    return []

# -- per-request tables --------------------------------------------------------------

def _append_only(t: Transition) -> list[str]:
    if t.before is None:
        return []
    before = {(x.request, x.group): x.blocks for x in t.before.tables}
    out = []
    for table in t.after.tables:
        old = before.get((table.request, table.group))
        if old is None or table.request in t.gone:
            continue
        if len(table.blocks) < len(old):
            out.append(f"request {table.request}, group {table.group}: the table shrank from {len(old)} to "
                       f"{len(table.blocks)} slots while it ran")
            continue
        for slot, (was, now) in enumerate(zip(old, table.blocks)):
            if now != was and now != t.after.null_block:
                out.append(f"request {table.request}, group {table.group}: slot {slot} changed from block "
                           f"{was} to block {now} (a slot may only turn null)")
                break
    return out[:3]


def _covers_computed(t: Transition) -> list[str]:
    out = []
    for table in t.after.tables:
        if table.request not in t.running:
            continue
        group = t.config.groups[table.group]
        if group.kind is not GroupKind.FULL_ATTENTION:
            continue
        need = _cdiv(t.running[table.request], group.block_size)
        real = [b for b in table.blocks[:need] if b != t.after.null_block]
        if len(table.blocks) < need or len(real) < need:
            out.append(f"request {table.request}, group {table.group} (full attention, block "
                       f"{group.block_size}): {t.running[table.request]} computed tokens need {need} blocks, "
                       f"the table holds {len(real)} real ones")
        if table.cached > len(table.blocks):
            out.append(f"request {table.request}, group {table.group}: {table.cached} blocks counted as "
                       f"offered for registration, the table has {len(table.blocks)}")
    return out[:3]


def _window_held(t: Transition) -> list[str]:
    # vLLM frees a sliding-window table's slots below the window of the
    # tokens it counts as processed (get_num_skipped_tokens: computed - W + 1,
    # less retained extra tokens from 0.28), never more.  A request's count
    # can fall (rejected drafts, a failed load truncating it) after slots were
    # freed for a larger one, so the window is taken from its peak: weaker,
    # never a false alarm for that.
    out = []
    null = t.after.null_block
    for table in t.after.tables:
        computed = t.running.get(table.request)
        group = t.config.groups[table.group]
        if not computed or group.kind is not GroupKind.SLIDING_WINDOW:
            continue
        peak = max(computed, t.peaks.get(table.request, 0))
        first, end = max(0, peak - group.sliding_window + 1) // group.block_size, _cdiv(computed, group.block_size)
        gone = [i for i in range(first, end) if i >= len(table.blocks) or table.blocks[i] == null]
        if gone:
            out.append(f"request {table.request}, group {table.group} (sliding window {group.sliding_window}, block "
                       f"{group.block_size}): {computed} computed tokens (at most {peak} while running), the next "
                       f"step reads slots {first}..{end - 1}, slot {gone[0]} is "
                       f"{'missing' if gone[0] >= len(table.blocks) else 'the null block'}")
    return out[:3]


def _mamba_state_held(t: Transition) -> list[str]:
    # In 'align' mode vLLM keeps a request's running Mamba state in the block
    # of its last computed token, slot cdiv(computed, block) - 1: allocate_slots
    # places it for the tokens scheduled, and remove_skipped_blocks frees only
    # state blocks of earlier steps (below that slot).  Not on layouts with
    # drafts (an EAGLE group): vLLM then gives Mamba groups speculative
    # blocks that move the state, and draft tokens are counted as computed
    # (kvspec's hand-built layouts give none).  A request whose count fell
    # since it started running (a failed load) is not checked: the slot then
    # lies in what was allocated for more.
    if t.config.any_eagle:
        return []
    out = []
    null = t.after.null_block
    for table in t.after.tables:
        computed = t.running.get(table.request)
        group = t.config.groups[table.group]
        if not computed or group.kind is not GroupKind.MAMBA_ALIGN or t.peaks.get(table.request, 0) > computed:
            continue
        slot = _cdiv(computed, group.block_size) - 1
        if slot >= len(table.blocks) or table.blocks[slot] == null:
            out.append(f"request {table.request}, group {table.group} (mamba_align, block {group.block_size}): "
                       f"{computed} computed tokens keep their state in slot {slot}, which is "
                       f"{'missing' if slot >= len(table.blocks) else 'the null block'}")
    return out[:3]


def _forgets(t: Transition) -> list[str]:
    out = []
    for request in t.gone:
        if request in t.running or request in t.loading:
            continue  # admitted again within the step (running, or holding blocks for a new KV load)
        left = t.after.tables_of(request)
        if left:
            out.append(f"request {request} was freed, yet group {left[0].group} still holds a table for it "
                       f"({len(left[0].blocks)} blocks, {left[0].cached} offered)")
    return out[:3]


# -- lookups ---------------------------------------------------------------------------

def _lookup_pure(t: Transition) -> list[str]:
    for lk in t.lookups:
        if lk.before and lk.before != lk.after:
            return [f"get_computed_blocks for request {lk.request} changed the pool (reference counts, free "
                    "blocks or keys): a lookup must take nothing"]
    return []


def _hit_bounds(t: Transition) -> list[str]:
    out = []
    unit = t.config.hash_block_size if t.regime.partial_hash_hits else t.config.scheduler_block_size
    for lk in t.lookups:
        if lk.hit and not t.config.enable_caching:
            out.append(f"request {lk.request}: a hit of {lk.hit} tokens with prefix caching off")
        if not 0 <= lk.hit <= max(0, lk.num_tokens - 1):
            out.append(f"request {lk.request}: a hit of {lk.hit} tokens for a {lk.num_tokens}-token request "
                       f"(at most {lk.num_tokens - 1}: one token must be computed)")
        if lk.hit % unit:
            out.append(f"request {lk.request}: a hit of {lk.hit} tokens is not a multiple of {unit} (the "
                       f"{'hash' if t.regime.partial_hash_hits else 'scheduler'} block)")
    return out[:3]


def _hit_groups(t: Transition) -> list[str | Violation]:
    out = []
    # A hit may be a block registered earlier in the same step: either side counts.
    state = t.before or t.after
    keyed = {b.id for s in (t.before, t.after) if s is not None for b in s.keyed()}
    for lk in t.lookups:
        for index, (group, blocks) in enumerate(zip(t.config.groups, lk.group_blocks)):
            need = hit_blocks(INT, lk.hit, group.block_size)
            if lk.diverged and group.kind is not GroupKind.FULL_ATTENTION and len(blocks) <= need:
                continue  # a group lagging the connector lookup's full-attention hit
            if len(blocks) < need and group.kind is GroupKind.FULL_ATTENTION:
                # Tokens counted as computed whose attention KV no block of the
                # request holds: the step computes past them, never them.
                whose = "the connector lookup's hit (its deepest group's)" if lk.diverged else "the hit"
                out.append(Violation(
                    f"request {lk.request}: group {index} ({group.label()}) holds {len(blocks)} blocks, short of "
                    f"{whose} of {lk.hit} tokens, which needs cdiv(hit, {group.block_size}) = {need}: "
                    f"{lk.hit - len(blocks) * group.block_size} tokens counted computed without their KV",
                    (group.kind,)))
            elif len(blocks) != need:
                out.append(Violation(
                    f"request {lk.request}: group {index} ({group.label()}) returned {len(blocks)} blocks for a hit "
                    f"of {lk.hit} tokens; every group must hold cdiv(hit, {group.block_size}) = {need}",
                    (group.kind,)))
            elif group.kind is GroupKind.FULL_ATTENTION:
                bad = [b for b in blocks if b == state.null_block or b not in keyed]
                if bad:
                    out.append(f"request {lk.request}: group {index} ({group.label()}): hit block {bad[0]} is "
                               f"{'the null block' if bad[0] == state.null_block else 'not registered'}")
    return out[:3]


def _hit_length(t: Transition) -> list[str | Violation]:
    # One full-attention group (vLLM's unitary coordinator), its block the
    # hash block: the hit is the leading run of registered blocks, at most
    # (tokens - 1) / block of them (one token is always computed), one block
    # less under EAGLE (its last block is recomputed).
    groups = t.config.groups
    if (len(groups) != 1 or groups[0].kind is not GroupKind.FULL_ATTENTION or not t.config.enable_caching
            or groups[0].block_size != t.config.hash_block_size):
        return []
    block = groups[0].block_size
    # The EAGLE drop runs only where the scheduler builds the manager with it:
    # an EAGLE group under legacy hashes (lookahead hashes replace the drop).
    drop = t.config.effective_eagle[0]
    out = []
    for lk in t.lookups:
        if lk.mapped is None:
            continue
        run = 0
        for held in lk.mapped[:max(0, lk.num_tokens - 1) // block]:
            if not held:
                break
            run += 1
        if drop and run:
            run -= 1
        if lk.hit != run * block:
            # The rule is the one full-attention group's: it names that group.
            out.append(Violation(f"request {lk.request}: a hit of {lk.hit} tokens; the map held its first {run} "
                                 f"blocks {'(less the one EAGLE recomputes) ' if drop else ''}at the lookup, a hit "
                                 f"of {run * block}", (GroupKind.FULL_ATTENTION,)))
    return out[:3]


# -- maintenance ------------------------------------------------------------------------

def _reset(t: Transition) -> list[str]:
    if t.op != "reset" or t.before is None:
        return []
    held = any(b.ref_cnt > 0 for b in t.before.active() if b.id != t.before.null_block)
    out = []
    if t.reset_succeeded and held:
        out.append("reset_prefix_cache succeeded while requests held blocks")
    if t.reset_succeeded is False and not held:
        out.append("reset_prefix_cache failed with no block held")
    if t.reset_succeeded and (t.after.hash_map or t.after.keyed()):
        out.append(f"after a successful reset the hash map still holds {len(t.after.hash_map)} entries")
    return out


def _no_leak(t: Transition) -> list[str]:
    if t.running or t.after.tables or t.after.held_elsewhere:
        return []
    total = len(t.after.blocks) - 1
    if t.after.num_free != total:
        return [f"no request holds a block, yet {total - t.after.num_free} of {total} blocks are not free"]
    return []


def _zeroing(t: Transition) -> list[str]:
    if not t.handed_for_zeroing:
        return []
    # A block may be freed and placed again within one operation (a
    # sliding-window slot dropped, the block reused at once), so what counts
    # is the slot: one that is new, or holds another block than before.
    before = {(x.request, x.group, i): b for x in (t.before.tables if t.before else ()) for i, b in enumerate(x.blocks)}
    placed = {b for x in t.after.tables for i, b in enumerate(x.blocks) if before.get((x.request, x.group, i)) != b}
    odd = [b for b in t.handed_for_zeroing if b == t.after.null_block or b not in placed]
    if odd:
        return [f"block {odd[0]} was handed out for zeroing but is not a block this operation placed"]
    return []


def _zeroing_missed(t: Transition) -> list[str | Violation]:
    # vLLM zeroes new attention blocks on layouts with Mamba layers
    # (KVCacheConfig.needs_kv_cache_zeroing); since #51749 (0.28) sliding-window
    # ones too.  A block a lookup gave the request holds cached data and is
    # not zeroed; a request given connector tokens is left out (vLLM may skip
    # zeroing blocks a load will write).
    if t.op != "schedule" or not any(g.kind is GroupKind.MAMBA_ALIGN for g in t.config.groups):
        return []
    hits: dict[tuple[str, int], set[int]] = {}
    for lk in t.lookups:
        for group, blocks in enumerate(lk.group_blocks):
            hits.setdefault((lk.request, group), set()).update(blocks)
    loaded = {lk.request for lk in t.lookups if lk.external}
    before = {(x.request, x.group): x.blocks for x in (t.before.tables if t.before else ())}
    handed, null = set(t.handed_for_zeroing), t.after.null_block
    out = []
    for table in t.after.tables:
        if t.config.groups[table.group].kind is GroupKind.MAMBA_ALIGN or table.request in loaded:
            continue
        old, hit = before.get((table.request, table.group), ()), hits.get((table.request, table.group), set())
        for slot, block in enumerate(table.blocks):
            fresh = block != null and (old[slot:slot + 1] != (block,)) and block not in hit
            if fresh and block not in handed:
                group = t.config.groups[table.group]
                out.append(Violation(f"request {table.request}, group {table.group} ({group.label()}): block "
                                     f"{block}, new in slot {slot} and not a cache hit, was not handed out for "
                                     f"zeroing", (group.kind,)))
                break
    return out[:3]


def _block_estimate(t: Transition) -> list[str | Violation]:
    # allocate_slots refuses when the groups' estimates exceed the free blocks,
    # then allocates: a group taking more than it estimated turns a refusal
    # into the pool's "Cannot get N free blocks" (vLLM #46892's mechanism).
    out = []
    for a in t.allocations:
        if a.free_after is None:
            continue
        estimated = sum(e for e in a.estimates if e is not None)
        taken = a.free_before - a.free_after
        if taken > estimated:
            groups = t.config.groups
            out.append(Violation(
                f"allocate_slots for request {a.request} took {taken} free blocks; the groups estimated "
                f"{estimated} ({', '.join('-' if e is None else str(e) for e in a.estimates)})"
                + groups_over_estimate(groups, a, "took"), over_estimate_kinds(groups, a)))
    return out[:3]


def _over_estimate(groups: tuple[KVCacheGroup, ...], a: Allocation) -> list[tuple[int, int, int]]:
    """(group, blocks taken or asked for, its estimate) for each group whose
    takes exceeded its estimate (none when the takes were not observed)."""
    return [(i, n, e or 0) for i, (n, e) in enumerate(zip(a.taken, a.estimates)) if i < len(groups) and n > (e or 0)]


def over_estimate_kinds(groups: tuple[KVCacheGroup, ...], a: Allocation) -> tuple[GroupKind, ...]:
    """The kinds of the groups that took (or asked the pool for) more blocks
    than they estimated: the mechanism a broken estimate is known by."""
    return tuple(groups[i].kind for i, _, _ in _over_estimate(groups, a))


def groups_over_estimate(groups: tuple[KVCacheGroup, ...], a: Allocation, verb: str) -> str:
    """The same groups in words ("took", or "asked for" in an allocation
    that raised), for the violation's text; empty when none did."""
    over = [f"group {i} ({groups[i].kind.value}) {verb} {n} against its estimate {e}"
            for i, n, e in _over_estimate(groups, a)]
    return "; " + ", ".join(over) if over else ""


# How the two formatters above and _hit_groups name a group, read back from a
# summary recorded before findings carried the kinds as data.
_NAMED_GROUP = re.compile(r"group \d+ \((\w+)\) (?:took|asked for) \d+ against its estimate"
                          r"|group \d+ \((\w+)\(block \d+[^)]*\)\) (?:returned|holds) \d+ blocks(?: for a hit|, short of)"
                          r"|group \d+ \((\w+)\(block \d+[^)]*\)\): block \d+, new in slot")


def named_group_kinds(summary: str) -> tuple[GroupKind, ...]:
    """The kinds of the groups a recorded summary names as breaking its rule."""
    kinds = []
    for named in _NAMED_GROUP.findall(summary):
        try:
            kinds.append(GroupKind(next(kind for kind in named if kind)))
        except ValueError:
            continue
    return tuple(kinds)


def _evicted_findable(t: Transition) -> list[str]:
    # vLLM's contract (BlockPool.evict_blocks, the same on every release
    # 0.22-0.34): each named block loses every hash it is cached under, in use
    # or free, so no later lookup can find the KV that failed to load.  The
    # scheduler calls it from _handle_invalid_blocks, for synchronously loaded
    # blocks from the first failing one on, under kv_load_failure_policy
    # "fail" (the default).  Nothing between that call and the operation's end
    # registers blocks (registration runs in the next schedule()).
    if not t.evicted:
        return []
    s = t.after
    named = {block for _, block in s.hash_map}
    out = []
    for block_id in sorted(set(t.evicted)):
        keys = s.blocks[block_id].keys if 0 <= block_id < len(s.blocks) else ()
        if keys or block_id in named:
            where = [f"owns {len(keys)} key(s)"] if keys else []
            where += ["the hash map names it"] if block_id in named else []
            out.append(f"block {block_id} was evicted (evict_blocks, after a failed KV load) yet "
                       f"{' and '.join(where)}: a later lookup can still hit it")
    return out[:3]


def _retention_hit(t: Transition) -> list[str]:
    # What an earlier request kept for resends and siblings (model.retention):
    # a lookup finding less lost hits sparse retention promised to keep.
    out = []
    for lk in t.lookups:
        if lk.owed and lk.hit < lk.owed:
            out.append(f"request {lk.request}: a hit of {lk.hit} tokens; retention owes at least {lk.owed}, "
                       f"{lk.owed_why}")
    return out[:3]


# A step looks requests up before it allocates, so a broken lookup is the
# earlier event: its rules come first, and a finding names it.
INVARIANTS: tuple[Invariant, ...] = (
    Invariant("lookup_pure", Category.STATE_LOOKUP_PURITY,
              "a lookup changes no reference count, free block or key", _lookup_pure),
    Invariant("hit_bounds", Category.STATE_HIT_BOUNDS,
              "a hit leaves at least one token to compute and lands on a multiple of the hash block under "
              "partial hash hits, of the scheduler block otherwise; with prefix caching off every lookup misses",
              _hit_bounds),
    Invariant("hit_groups", Category.STATE_HIT_GROUPS,
              "every group answers one hit: cdiv(hit, block) blocks each, the full-attention ones real and "
              "registered (a KV connector's lookup whose groups diverged: full attention's hit, the others at "
              "most theirs)", _hit_groups),
    Invariant("hit_length", Category.STATE_HIT_LENGTH,
              "on a one-group full-attention model (vLLM's unitary coordinator) the hit is the leading run of the "
              "request's blocks the hash map holds at the lookup, at most (tokens - 1) / block of them, one block "
              "less where the EAGLE drop runs (an EAGLE group under legacy hashes)", _hit_length),
    Invariant("free_list", Category.STATE_FREE_LIST,
              "the free queue holds no block twice and not the null block, and the pool's counter equals "
              "its length", _free_list, reads=("free_queue", "num_free", "null_block")),
    Invariant("free_iff_unreferenced", Category.STATE_FREE_BLOCKS,
              "a block other than the null block is in the free queue iff no one references it", _free_iff_unreferenced,
              reads=("blocks", "listed", "free_queue", "null_block")),
    Invariant("ref_counts", Category.STATE_REF_COUNT,
              "a block's reference count equals the table slots (every group, every request) holding it, "
              "once the step's copy-on-write sources are released as the scheduler does", _ref_counts,
              reads=("blocks", "listed", "tables", "held_elsewhere", "null_block")),
    Invariant("one_group", Category.STATE_ONE_GROUP,
              "a block other than the null block is held by one KV-cache group at a time (groups share the "
              "pool's block ids, not blocks)", _one_group, reads=("tables", "null_block")),
    Invariant("hash_map", Category.STATE_HASH_MAP,
              "the hash map's entries and the keys each block owns agree both ways; the null block owns none; "
              "with prefix caching off there are none",
              _hash_map, reads=("hash_map", "blocks", "listed", "null_block")),
    Invariant("append_only", Category.STATE_TABLE_APPEND_ONLY,
              "while a request runs, each table slot keeps its block or turns null (what sliding-window and "
              "Mamba groups do to slots they no longer need); a table never shrinks", _append_only),
    Invariant("covers_computed", Category.STATE_TABLE_COVERAGE,
              "a running request's full-attention table holds at least cdiv(computed, block) real blocks "
              "(at least, not exactly: drafts and lookahead allocate ahead), and no more blocks are counted "
              "as offered for registration than it holds", _covers_computed, exact=False),
    Invariant("window_held", Category.STATE_WINDOW,
              "a running request's sliding-window table holds real blocks in every slot from the window of its "
              "computed tokens (the first token its next step reads, computed - W + 1) up to its last computed "
              "token.  Weaker than exact: the window is taken from the most tokens the request had computed "
              "since it last started running (a count that fell back, by rejected drafts or a failed load, may "
              "have had slots freed for the larger one; that vLLM frees on the processed count is not checked), "
              "and that slots below the window are freed is not checked", _window_held, exact=False),
    Invariant("mamba_state_held", Category.STATE_MAMBA_STATE,
              "a running request's Mamba ('align') table holds a real block in slot cdiv(computed, block) - 1, "
              "where its running state is kept for its next step.  Weaker than exact: checked while the request's "
              "count has not fallen since it last started running, on layouts without drafts (no EAGLE group: "
              "speculative decoding gives Mamba groups speculative blocks that move the state); which earlier blocks (prefill checkpoints, states retention keeps) it holds is "
              "checked only through the hits retention owes", _mamba_state_held, exact=False),
    Invariant("forgets", Category.STATE_FORGET,
              "after free or preemption no group keeps a table for the request, unless the same operation admitted it "
              "again (running, or holding blocks for a new KV load)", _forgets),
    Invariant("reset", Category.STATE_RESET,
              "reset_prefix_cache succeeds iff no block is held, and then leaves no key", _reset),
    Invariant("free_order", Category.STATE_FREE_ORDER,
              "the free queue keeps vLLM's eviction order over each operation: the blocks taken from the queue, "
              "other than cache hits of the operation's lookups, are a head of it, and the blocks that stay free "
              "keep their order and form one run; newly free blocks join at the head or the tail, and a cached "
              "one at the tail; a freed or preempted request's full-attention blocks that it alone held join in "
              "reverse slot order (keyed and keyless ones each). Weaker than exact: a scheduler step that frees "
              "(on a layout with a sliding-window or Mamba group, any step) may take a block and free it again, "
              "back at an end where it may look unmoved, so how much of the head was taken is not observed and "
              "the rule holds if any split of the old queue into a head taken and survivors explains the new one; "
              "where keyless blocks go (head from 0.26, tail before) and the order of sliding-window and Mamba "
              "blocks freed are not predicted; a hit block still in the queue after the operation may lie anywhere", _free_order, exact=False),
    Invariant("no_leak", Category.STATE_LEAK,
              "when no request holds a block, every block but the null one is free", _no_leak),
    Invariant("zeroing", Category.STATE_ZEROING,
              "what is handed out for zeroing are blocks this operation placed in a table slot (new, or "
              "holding another block than before)", _zeroing,
              exact=False),
    Invariant("zeroing_missed", Category.STATE_ZEROING_MISSED,
              "on a layout with a Mamba group (vLLM zeroes new attention blocks there), every block a scheduler "
              "step newly places in a full-attention or sliding-window slot, other than a cache hit, is handed "
              "out for zeroing (requests given KV-connector tokens in the step are not checked)",
              _zeroing_missed, exact=False),
    Invariant("block_estimate", Category.STATE_BLOCK_ESTIMATE,
              "an allocation takes no more free blocks than the groups' block estimates the scheduler checked "
              "against the free pool (observed where the engine driver makes the allocations)", _block_estimate),
    Invariant("evicted_unfindable", Category.STATE_EVICTED_FINDABLE,
              "after an operation in which the manager's evict_blocks ran (a failed KV load), no block it named "
              "owns a key or is named by the hash map, in use or not (observed where the engine driver runs a "
              "connector whose loads fail)", _evicted_findable),
    Invariant("retention_hit", Category.STATE_RETENTION_HIT,
              "on engine programs, a request's first lookup hits at least the highest position every group can "
              "serve from blocks earlier requests whose prompts were computed kept under the engine's retention "
              "setting (replay boundaries and shared-prefix junctions, and under dense retention or a positive "
              "interval the kept sliding-window runs), each request's within the prefix it shares with the new "
              "prompt, several combined, counting requests not preempted before their prompts were computed and "
              "all of whose hash-map entries present at any point since they were first scheduled are still "
              "present (vLLM registers a block when its chunk is allocated, and a sliding window frees blocks "
              "that leave the window, which pool pressure may evict, before the prompt completes; a lower "
              "bound: model.retention)", _retention_hit, exact=False),
)

# What the state model does not decide, said with every verdict that uses it.
OUT_OF_SCOPE = (
    "the free queue's order when a KV connector frees cached blocks to its head (0.34's SimpleKVOffload "
    "lazy mode) or unpins blocks (HiSparse): neither is driven",
    "which blocks Mamba groups keep is checked only as tables that never change a slot except to null "
    "and for the block of the running state, and sliding-window groups only for the window the next step "
    "reads; under retention both only through the hits it owes (retention_hit, engine programs): "
    + RETENTION_SCOPE,
    "hit lengths on layouts of two or more groups are checked for their bounds and their agreement across "
    "groups, not predicted (they are predicted on one-group full-attention models; the hit-length "
    "differential predicts them per request on full-attention layouts)",
    "the null block's reference count is not checked (it drifts by design before 0.33)",
)


def check_transition(t: Transition, only: Iterable[str] | None = None,
                     before_checked: bool = False) -> list[tuple[Invariant, Violation]]:
    """Every violation of the invariants (or of the named ones) in ``t``.

    ``before_checked``: ``t.before`` broke no invariant (it was the state
    after the previous operation, checked), so a rule over the state alone
    whose fields are unchanged (the same objects, or equal numbers) holds
    again without being run."""
    chosen = set(only) if only is not None else None
    found = []
    for invariant in INVARIANTS:
        if chosen is not None and invariant.name not in chosen:
            continue
        if before_checked and invariant.reads and t.before is not None and _unchanged(t, invariant.reads):
            continue
        found += [(invariant, v if isinstance(v, Violation) else Violation(v)) for v in invariant.check(t)]
    return found


def _unchanged(t: Transition, fields: tuple[str, ...]) -> bool:
    for name in fields:
        was, now = getattr(t.before, name), getattr(t.after, name)
        if was is not now and not (isinstance(now, int) and was == now):
            return False
    return True


def scope_text() -> str:
    """The state model's scope, in one line for a verdict."""
    exact = ", ".join(i.name for i in INVARIANTS if i.exact)
    weak = ", ".join(i.name for i in INVARIANTS if not i.exact)
    return (f"checked after every operation: {exact} (exact); {weak} (the weaker statements); "
            f"not checked: {'; '.join(OUT_OF_SCOPE)}")
