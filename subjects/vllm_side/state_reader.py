"""Reading a KVCacheManager's observable state (the pool, the free queue, the
hash map, every group's block tables) as the compact snapshot
``kvspec.model.state.ManagerState.from_dict`` reads.  The worker's machine
and the engine driver read the same way (stdlib + vLLM only)."""

import operator

__all__ = ["StateReader", "queue_runs"]


class StateReader:
    """Reads one manager's state after every operation; what the reader
    remembers between reads (key ids, memos, the last answer) only makes
    reads cheaper, never changes what they say."""

    def __init__(self, manager):
        self.manager = manager
        self.coordinator = manager.coordinator
        self.pool = manager.block_pool
        self.groups = list(self.coordinator.single_type_managers)
        self._key_ids = {}
        self._sent = None  # the last snapshot answered, for deltas
        self._keys_memo = {}  # block id -> ((hash, extra keys), key ids)
        self._free_memo = (None, None)  # the free ids in queue order, and their runs
        self._columns = None  # the last read's hashes, ref counts and blocks part
        self._make_key = None  # vLLM's make_block_hash_with_group_id (False: this vLLM has none)

    def _key(self, key):
        # Keys are opaque: only their identity matters to the rules, so each
        # distinct key gets a small number, first seen first.
        found = self._key_ids.get(key)
        if found is None:
            found = self._key_ids[key] = len(self._key_ids)
        return found

    def _block_keys(self, block):
        primary = getattr(block, "block_hash", None)
        if primary is None:
            primary = getattr(block, "_block_hash", None)
        keys = [] if primary is None else [self._key(primary)]
        extra = getattr(self.pool, "cached_block_hashes_by_block", {}).get(block.block_id, ())
        keys += [self._key(k) for k in extra]
        return sorted(set(keys))

    def _hash_map(self):
        cache = getattr(self.pool.cached_block_hash_to_block, "_cache", {})
        dups = getattr(self.pool.cached_block_hash_to_block, "_dup_ids", {})
        entries = []
        for key, value in cache.items():
            k = self._key(key)
            if isinstance(value, int):
                entries.append((k, value))
            elif isinstance(value, dict):
                entries += [(k, block_id) for block_id in value]
            else:
                entries.append((k, value.block_id))
            if dups and key in dups:
                entries += [(k, block_id) for block_id in dups[key] if (k, block_id) not in entries]
        return sorted(entries)

    def _free_runs(self):
        ids = self._free_queue()
        if ids != self._free_memo[0]:
            self._free_memo = (ids, queue_runs(ids))
        return self._free_memo[1]

    def _free_queue(self):
        queue = self.pool.free_block_queue
        if hasattr(queue, "get_all_free_blocks"):
            return [b.block_id for b in queue.get_all_free_blocks()]
        out, node = [], queue.fake_free_list_head.next_free_block
        while node is not None and node is not queue.fake_free_list_tail:
            out.append(node.block_id)
            node = node.next_free_block
        return out

    # The parts of a snapshot an answer may leave out when they equal the
    # previous answer's (the caller reads every answer in order).
    _DELTA_PARTS = ("free_runs", "blocks", "hash_map", "tables")

    def snapshot(self, delta=False):
        """The manager's observable state, compact: blocks neither referenced
        nor keyed are left out (``num_blocks`` says how many there are), the
        free queue is sent head first as runs [first, last] of consecutive
        ids, ascending or descending (first > last): its order is checked.  With ``delta``, a part
        equal to the one last sent is named in ``same`` instead: the whole
        state is still read and compared every time, only not re-sent."""
        tables = []
        for index, group in enumerate(self.groups):
            cached = getattr(group, "num_cached_block", {})
            for rid, blocks in getattr(group, "req_to_blocks", {}).items():
                tables.append([rid, index, [b.block_id for b in blocks], cached.get(rid, 0)])
        extra = self._extra_keyed()
        # Every release keeps a block's hash in ``_block_hash`` (``block_hash``
        # is a property over it); read the field directly where it is one.
        field = "_block_hash" if hasattr(self.pool.null_block, "_block_hash") else "block_hash"
        pool_blocks = self.pool.blocks
        # Two passes at C speed pick the blocks worth a look: referenced or keyed.
        hashes = list(map(operator.attrgetter(field), pool_blocks))
        refs = list(map(operator.attrgetter("ref_cnt"), pool_blocks))
        columns = self._columns
        if not extra and columns is not None and columns[1] == refs and columns[0] == hashes:
            # Every block's count and hash read again and equal to the last
            # read's: the part is the list built from them then.
            blocks = columns[2]
        else:
            blocks = self._blocks_part(pool_blocks, hashes, refs, extra)
        self._columns = None if extra else (hashes, refs, blocks)
        full = {
            "null_block": self.pool.null_block.block_id,
            "num_free": self.pool.get_num_free_blocks(),
            "num_blocks": len(self.pool.blocks),
            "free_runs": self._free_runs(),
            "blocks": blocks,
            "hash_map": self._hash_map(),
            "tables": sorted(tables),
        }
        sent, self._sent = self._sent, full
        if not delta or sent is None:
            return full
        same = [part for part in self._DELTA_PARTS if sent[part] == full[part]]
        if not same:
            return full
        out = {k: v for k, v in full.items() if k not in same}
        out["same"] = same
        return out

    def _blocks_part(self, pool_blocks, hashes, refs, extra):
        """[id, ref count, key ids] of every block referenced or keyed."""
        blocks = []
        memo, seen = self._keys_memo, {}
        picked = [i for i, h, r in zip(range(len(refs)), hashes, refs) if r or h is not None]
        if not extra:  # the common case, kept lean: a block's one key is its hash's
            key = self._key
            for i in picked:
                block_id, primary = pool_blocks[i].block_id, hashes[i]
                if primary is None:
                    blocks.append([block_id, refs[i], []])
                    continue
                cached = memo.get(block_id)
                keys = cached[1] if cached is not None and cached[0] == primary else [key(primary)]
                seen[block_id] = (primary, keys)
                blocks.append([block_id, refs[i], keys])
            self._keys_memo = seen
            return blocks
        if extra:
            picked = sorted(set(picked) | {i for i, b in enumerate(pool_blocks) if b.block_id in extra})
        for i in picked:
            b = pool_blocks[i]
            primary = hashes[i]
            if primary is None and b.block_id not in extra:
                blocks.append([b.block_id, b.ref_cnt, []])
                continue
            # A block's keys change only with its hash or its extra keys.
            stamp = (primary, tuple(extra.get(b.block_id, ())))
            cached = memo.get(b.block_id)
            keys = cached[1] if cached is not None and cached[0] == stamp else self._block_keys(b)
            seen[b.block_id] = (stamp, keys)
            if b.ref_cnt or keys:
                blocks.append([b.block_id, b.ref_cnt, keys])
        self._keys_memo = seen
        return blocks

    def _extra_keyed(self):
        return getattr(self.pool, "cached_block_hashes_by_block", {})

    def digest(self):
        # A fingerprint is enough: the rule compares before with after.
        size = self.pool.cached_block_hash_to_block
        keys = len(size) if hasattr(size, "__len__") else len(self._hash_map())
        return [hash(tuple(b.ref_cnt for b in self.pool.blocks)), self.pool.get_num_free_blocks(), keys]

    def mapped(self, request):
        """On a one-group model: for each of the request's block hashes, in
        order, whether the hash map holds it (as the group's key) when the
        lookup starts.  What a hit should be is kvspec's rule; this is only
        what the map held."""
        if self._make_key is None:  # looked up once per machine, not per lookup
            from vllm.v1.core import kv_cache_utils

            self._make_key = getattr(kv_cache_utils, "make_block_hash_with_group_id", False)
        make = self._make_key
        cache = getattr(self.pool.cached_block_hash_to_block, "_cache", None)
        if not make or cache is None:
            return None
        return [make(h, 0) in cache for h in request.block_hashes]


def queue_runs(ids):
    """The queue, head first, as [first, last] runs of ids each one above
    (ascending) or below (descending, first > last) the one before; a
    repeated id starts a new run, so the order, the count and any duplicate
    survive.  Freed tables come back reversed, so both directions are common."""
    runs = []
    step = 0  # the direction of the last run: +1, -1, or 0 (one id so far)
    for block_id in ids:
        if runs:
            run = runs[-1]
            delta = block_id - run[1]
            if delta in (1, -1) and step in (0, delta):
                run[1], step = block_id, delta
                continue
        runs.append([block_id, block_id])
        step = 0
    return runs
