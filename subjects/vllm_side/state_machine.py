"""The state machine (stdlib + vLLM only): the scheduler's moves on one
``KVCacheManager`` for the stateful differential, and what the manager's
state is after each (``state_reader``).  The rules are kvspec's
(``model.state``), never checked here."""

import dataclasses
import os

from .errors import BadOperation, Unsupported
from .manager_driver import SchedulerStandIn
from .state_reader import StateReader

__all__ = ["Machine"]


class Machine:
    """The scheduler's moves on one KVCacheManager, for the stateful
    differential: requests admitted (lookup, then a first chunk), stepped
    (prefill chunks split where Mamba needs them, decodes with drafts and
    rejections), freed, preempted and resumed, the prefix cache reset, blocks
    evicted as a failed KV load does.  After every operation it reads the
    manager's observable state (``snapshot``); the rules are kvspec's
    (``model.state``), never checked here."""

    def __init__(self, driver, case):
        self.driver, self.case = driver, case
        retention = case.get("retention_interval")
        self.manager = self._build(retention)
        self.coordinator = self.manager.coordinator
        self.pool = self.manager.block_pool
        self.groups = list(self.coordinator.single_type_managers)
        self.block_sizes = [g["block_size"] for g in case["groups"]]
        self.running = {}  # request id -> Request
        self.waiting = {}  # request id -> Request, queued or preempted, in order
        self.external = {}  # request id -> tokens a KV connector offers it
        self.max_tokens = case["max_model_len"]  # the step's token budget unless an op names one
        self.token = 100_000  # output tokens: ids no prompt uses
        self.split = self._mamba_split()
        # Every call the machine makes on vLLM's objects, in order, with what
        # it returned where the rest depends on it: an emitted regression
        # test replays exactly these (``kvspec.emit.stateful_test``).
        self.trace = []
        self.reader = StateReader(self.manager)

    def _build(self, retention):
        """The manager, with the retention interval where this release takes
        it: a KVCacheConfig field from 0.29, the environment before."""
        if retention is None:
            return self.driver._manager(self.case)
        fields = {f.name for f in dataclasses.fields(self.driver.iface.KVCacheConfig)}
        if "prefix_cache_retention_interval" in fields:
            return self.driver._manager({**self.case, "retention_field": retention})
        old = os.environ.get("VLLM_PREFIX_CACHE_RETENTION_INTERVAL")
        os.environ["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] = str(retention)
        try:
            return self.driver._manager(self.case)
        finally:
            if old is None:
                os.environ.pop("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", None)
            else:
                os.environ["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] = old

    def _mamba_split(self):
        """vLLM's own Mamba-aligned prefill split, or None without a Mamba
        group.  What the method reads of its scheduler is derived as the
        release's ``Scheduler.__init__`` derives it, from the same vLLM
        objects (the manager, its coordinator, the groups' specs)."""
        mamba = [g["block_size"] for g in self.case["groups"] if g["kind"] == "mamba_align"]
        if not mamba:
            return None
        from vllm.v1.core.sched import scheduler
        from vllm.v1.kv_cache_interface import MambaSpec

        method = getattr(scheduler.Scheduler, "_mamba_block_aligned_split", None)
        if method is None:
            raise Unsupported("this vLLM's scheduler has no _mamba_block_aligned_split to chunk a Mamba prefill")
        S, H = self.case["scheduler_block_size"], self.case["hash_block_size"]
        specs = [g.kv_cache_spec for g in self.manager.kv_cache_config.kv_cache_groups
                 if isinstance(g.kv_cache_spec, MambaSpec)]
        use_eagle = bool(getattr(self.manager, "use_eagle", False))
        # Scheduler.block_size is the scheduler block; the split's
        # cache_config.block_size is the Mamba block (one per model in vLLM).
        partial = H < S and bool(getattr(self.coordinator, "enable_partial_hash_hits", False))
        stand_in = SchedulerStandIn({
            "cache_config": SchedulerStandIn({"block_size": mamba[0], "mamba_cache_mode": "align",
                                               "enable_prefix_caching": self.case["enable_caching"]}),
            "scheduler_config": SchedulerStandIn({"long_prefill_token_threshold": 0}),
            "block_size": S, "hash_block_size": H, "use_eagle": use_eagle, "use_eagle_block_drop": use_eagle,
            "num_hash_lookahead_tokens": self.case.get("num_hash_lookahead_tokens", 0),
            "max_num_scheduled_tokens": self.case["max_model_len"],
            "need_mamba_block_aligned_split": True, "scheduler_block_size": S,
            "mamba_partial_cache_hit": partial,
            "mamba_prefill_checkpoint_alignment": next(
                (getattr(spec, "prefill_checkpoint_alignment", None) for spec in specs), None),
            "mamba_has_prefill_checkpoint_blocks": all(
                getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0 for spec in specs),
            "mamba_fine_grained_prefix_cache": partial and bool(
                getattr(self.manager, "mamba_fine_grained_prefix_cache", False)),
            "mamba_shared_prefix_checkpoint": partial and bool(
                getattr(self.manager, "mamba_shared_prefix_checkpoint", False)),
        })
        return lambda request, num_new, local=0, external=0: method(stand_in, request, num_new, local, external)

    # -- reading the state: vllm_side.state_reader ---------------------------------
    def snapshot(self, delta=False):
        return self.reader.snapshot(delta)

    def _digest(self):
        return self.reader.digest()

    # -- the scheduler's moves ---------------------------------------------------
    def _drain(self):
        """What the scheduler does at the end of a step: take the blocks to
        zero, run the copy-on-write copies and release their sources."""
        handed = []
        if hasattr(self.manager, "take_new_block_ids"):
            self.trace.append({"call": "take_new_block_ids"})
            handed = list(self.manager.take_new_block_ids())
        if hasattr(self.manager, "take_kv_cache_block_copies"):
            self.trace.append({"call": "take_kv_cache_block_copies"})
            _, retained = self.manager.take_kv_cache_block_copies()
            if retained:
                self.pool.free_blocks(retained)
        return handed

    def _allocate(self, request, num_new, **kwargs):
        params = self.driver.allocate_params
        kwargs = {k: v for k, v in kwargs.items() if k in params}
        # Traced before the call (a call that raises is the one a test must make).
        entry = {"call": "allocate_slots", "id": request.request_id, "num_new_tokens": num_new,
                 "kwargs": {k: ("computed" if k == "new_computed_blocks" else v) for k, v in kwargs.items()},
                 "allocated": None}
        self.trace.append(entry)
        out = self.manager.allocate_slots(request, num_new, **kwargs)
        entry["allocated"] = out is not None
        return out

    def _chunk(self, request, budget, local_computed=0, external=0):
        """A prefill chunk within the step's token budget, split where vLLM's
        scheduler splits it for Mamba."""
        start = request.num_computed_tokens + local_computed + external
        n = max(0, min(budget, request.num_tokens - start))
        if self.split is not None and n > 0:
            n = self.split(request, n, local_computed, external)
        return n

    def _admit(self, request, budget):
        """The scheduler's waiting path: look up; with a KV connector, add
        the tokens it offers past the block-aligned local hit (dropping a
        local sub-block tail the remote hit supersedes, as the scheduler
        does); then schedule a first chunk."""
        before = self._digest()
        mapped = self._mapped(request)
        entry = {"call": "get_computed_blocks", "id": request.request_id, "hit": None}
        self.trace.append(entry)
        found = self.manager.get_computed_blocks(request)
        after = self._digest()
        entry["hit"] = found[1]
        blocks, hit = found[0], found[1]
        if len(found) > 2 and hasattr(request, "shared_prefix_boundary"):
            request.shared_prefix_boundary = found[2]
            self.trace.append({"call": "set_shared_prefix_boundary", "id": request.request_id})
        lookup = {"request": request.request_id, "hit": hit, "num_tokens": request.num_tokens,
                  "group_blocks": [[b.block_id for b in group] for group in getattr(blocks, "blocks", ())],
                  "before": before, "after": after}
        if mapped is not None:
            lookup["mapped"] = mapped
        external = self._external_tokens(request, hit)
        if external:
            tail = hit % self.case["scheduler_block_size"]
            if tail and external > tail and hasattr(self.manager, "truncate_computed_blocks"):
                self.trace.append({"call": "truncate_computed_blocks", "id": request.request_id,
                                   "tokens": hit - tail})
                blocks = self.manager.truncate_computed_blocks(blocks, hit - tail)
                hit -= tail
            elif tail:
                external = 0
            lookup["external"] = external
        n = self._chunk(request, budget, hit, external)
        if n <= 0:
            return lookup, 0
        # As the scheduler admits a waiting request: the full-prompt gate when
        # --scheduler-reserve-full-isl is on (vLLM's default), the watermark
        # when others are already scheduled.
        out = self._allocate(request, n, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                             num_external_computed_tokens=external, num_lookahead_tokens=0,
                             full_sequence_must_fit=self.case.get("full_sequence_must_fit", True),
                             has_scheduled_reqs=bool(self.running))
        if out is None:
            return lookup, None
        self._set_computed(request, hit + external + n)
        self._emit_if_prefilled(request)
        return lookup, n

    def _mapped(self, request):
        if len(self.groups) != 1 or not self.case["enable_caching"]:
            return None
        return self.reader.mapped(request)

    def _external_tokens(self, request, local_hit):
        """What the (simulated) KV connector offers: the request's
        ``external`` tokens past the block-aligned local hit, leaving one
        token to compute; 0 on a vLLM whose allocate_slots takes none."""
        offered = self.external.get(request.request_id, 0)
        if not offered or "num_external_computed_tokens" not in self.driver.allocate_params:
            return 0
        aligned = local_hit - local_hit % self.case["scheduler_block_size"]
        return max(0, min(aligned + offered, request.num_tokens - 1) - aligned)

    def _emit_if_prefilled(self, request):
        if request.num_computed_tokens >= request.num_tokens:
            self._append_output(request, 1)

    def _set_computed(self, request, value):
        request.num_computed_tokens = value
        self.trace.append({"call": "set_computed", "id": request.request_id, "value": value})

    def _append_output(self, request, count):
        tokens = [self.next_token() for _ in range(count)]
        for token in tokens:
            request.append_output_token_ids(token)
        self.trace.append({"call": "append_output", "id": request.request_id, "tokens": tokens})

    def _set_drafts(self, request, count):
        request.spec_token_ids = [7] * count
        self.trace.append({"call": "set_drafts", "id": request.request_id, "count": count})

    def _set_status(self, request, name):
        if hasattr(request, "status"):
            request.status = getattr(type(request.status), name)
            self.trace.append({"call": "set_status", "id": request.request_id, "status": name})

    def _free(self, request):
        self.trace.append({"call": "free", "id": request.request_id})
        self.manager.free(request)

    def next_token(self):
        self.token += 1
        return self.token

    def _advance(self, request, budget, drafts):
        """One running request's slots for this step, by the scheduler's one
        rule (the tokens it has, plus drafts, minus the computed ones): a
        prefill chunk, or the next token plus drafts.  Returns (tokens
        scheduled, drafts among them), or None when the pool cannot give
        the slots."""
        decode = request.num_tokens - request.num_computed_tokens == 1 and len(request.output_token_ids) > 0
        if not decode:
            n = self._chunk(request, budget)
            if n <= 0:
                return 0, 0, False
            if self._allocate(request, n, num_lookahead_tokens=0) is None:
                return None
            self._set_computed(request, request.num_computed_tokens + n)
            self._emit_if_prefilled(request)
            return n, 0, False
        # The scheduler keeps every position below max_model_len (drafts
        # included): "min(num_new_tokens, max_model_len - 1 - num_computed_tokens)".
        room = self.case["max_model_len"] - 1 - request.num_computed_tokens
        if room < 1:
            return 0, 0, False
        drafts = max(0, min(drafts, budget - 1, room - 1)) if hasattr(request, "spec_token_ids") else 0
        if drafts:
            self._set_drafts(request, drafts)
        out = self._allocate(request, 1 + drafts, num_lookahead_tokens=0)
        if drafts:
            self._set_drafts(request, 0)
        if out is None:
            return None
        return 1 + drafts, drafts, True

    def _preempt(self, request):
        """Free and put back at the head of the waiting queue, as the
        scheduler's _preempt_request does."""
        self._free(request)
        self._set_computed(request, 0)
        if getattr(request, "spec_token_ids", None):
            self._set_drafts(request, 0)
        self._set_status(request, "PREEMPTED")
        del self.running[request.request_id]
        self.waiting = {request.request_id: request, **self.waiting}

    def _schedule(self, op):
        """One scheduler step, in the order vLLM's scheduler takes it: the
        step begins; running requests first (when the pool is short, the last
        running request is preempted and the allocation retried); then, if no
        one was preempted, waiting requests in order until one does not fit;
        then the step's zeroing and copy-on-write work; then rejected drafts
        roll back and accepted tokens are appended."""
        if hasattr(self.manager, "new_step_starts"):
            self.trace.append({"call": "new_step_starts"})
            self.manager.new_step_starts()
        budget = op.get("budget", self.max_tokens)
        drafts, accepted = op.get("drafts", 0), op.get("accepted", 0)
        scheduled, preempted, lookups, decodes = {}, [], [], []
        for rid in list(self.running):
            if rid not in self.running or budget <= 0:
                continue
            request = self.running[rid]
            while True:
                got = self._advance(request, budget, drafts)
                if got is not None:
                    break
                victim = self.running[list(self.running)[-1]]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            if got is None:
                continue
            n, used, decode = got
            budget -= n
            scheduled[rid] = n
            if decode:
                decodes.append((request, n, used))
        if not preempted:
            for rid in list(self.waiting):
                if budget <= 0:
                    break
                request = self.waiting[rid]
                lookup, n = self._admit(request, budget)
                lookups.append(lookup)
                if n is None:
                    break
                if n == 0:
                    continue
                self._set_status(request, "RUNNING")
                del self.waiting[rid]
                self.running[rid] = request
                budget -= n
                scheduled[rid] = n
        handed = self._drain()
        for request, n, used in decodes:
            kept = min(accepted, used)
            self._set_computed(request, request.num_computed_tokens + n - (used - kept))
            self._append_output(request, kept + 1)
        return {"scheduled": scheduled, "preempted": preempted, "lookups": lookups}, handed

    def _target(self, op):
        """The running request ``op`` names; a wrong name is kvspec's mistake,
        never reported as vLLM's."""
        if op.get("id") not in self.running:
            raise BadOperation(f"{op['do']} names request {op.get('id')!r}, which is not running")
        return self.running[op["id"]]

    def apply(self, op, observe=True):
        """Apply one operation; its answer carries the state after it unless
        ``observe`` is off (the benchmark's unchecked baseline)."""
        kind = op["do"]
        result, handed = {}, []
        self.trace.append({"call": "op", "op": op})
        if kind == "arrive":
            if op["id"] in self.running or op["id"] in self.waiting:
                raise BadOperation(f"arrive reuses request id {op['id']!r}")
            self.waiting[op["id"]] = self.driver._request(self.case, op["tokens"], request_id=op["id"])
            self.trace.append({"call": "request", "id": op["id"], "tokens": list(op["tokens"])})
            if op.get("external"):
                self.external[op["id"]] = op["external"]
        elif kind == "schedule":
            result, handed = self._schedule(op)
        elif kind == "finish":
            request = self._target(op)
            del self.running[op["id"]]
            self._set_status(request, "FINISHED_STOPPED")
            self._free(request)
        elif kind == "preempt":
            self._preempt(self._target(op))
        elif kind == "reset":
            entry = {"call": "reset_prefix_cache", "returned": None}
            self.trace.append(entry)
            result = {"reset": bool(self.manager.reset_prefix_cache())}
            entry["returned"] = result["reset"]
        elif kind == "evict":
            # A failed KV load under the "fail" policy: the named block and every
            # later one of the request lose their hashes, and its computed
            # tokens are truncated to the first invalid block.
            request = self._target(op)
            table = self.groups[0].req_to_blocks.get(op["id"], [])
            start = min(op.get("from_block", 0), len(table))
            ids = {b.block_id for b in table[start:] if not b.is_null}
            self.trace.append({"call": "evict_blocks", "ids": sorted(ids)})
            self.manager.evict_blocks(ids)
            self._set_computed(request, min(request.num_computed_tokens, start * self.block_sizes[0]))
            result = {"evicted": sorted(ids)}
        else:
            raise BadOperation(f"unknown machine operation {kind!r}")
        running = {rid: r.num_computed_tokens for rid, r in self.running.items()}
        return {"result": result, "handed_for_zeroing": handed, "running": running,
                "waiting": list(self.waiting), "state": self.snapshot(delta=True) if observe else None}
