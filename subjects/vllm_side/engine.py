"""vLLM's engine, as far as the KV-cache manager sees it: a real ``Scheduler``
built by the release's own configuration code and driven as ``EngineCore``
drives it, the model's forward pass replaced by drawn outputs.

Built (in ``EngineCore.__init__``'s order, every step vLLM's code unless said):
``EngineArgs(...).create_engine_config()`` on a directory holding only a
small ``config.json`` (the release's defaults for everything not given:
retention interval, async scheduling, chunked prefill, the admission gate);
the platform's ``update_block_size_for_backend`` (the platform is the SM90
stand-in, modelled: ``platform.PLATFORM_NOTE``); each layer's own
``get_kv_cache_spec`` on attribute-only layers (the layer layout is read from
the config fields by kvspec, modelled); the release's KV-cache planning with
``num_gpu_blocks_override`` choosing the pool; the engine's post-planning
(``num_gpu_blocks``, ``block_size``, ``resolve_kv_cache_block_sizes``, the
hash block on the config); ``StructuredOutputManager``; the scheduler class
the config names (``AsyncScheduler`` under async scheduling); the request
block hasher ``EngineCore`` makes.

Driven: ``add_request`` of a ``Request`` with that hasher; a step is
``EngineCore.step`` (``schedule()``, ``update_from_output()``, then draft
tokens) or, under async scheduling, ``step_with_batch_queue`` (a batch queue
of ``max_concurrent_batches``; a step's output is processed only when the
queue is full or nothing more is scheduled); ``finish_requests`` (abort);
``reset_prefix_cache``.  The model runner's part (sampled tokens, partial
prefills sampling nothing, drafts accepted) comes from the operation.

Observed, never judged here: every ``get_computed_blocks`` the scheduler
makes (its hit and blocks, the pool before and after), the blocks
``take_new_block_ids`` hands out for zeroing, each group's block estimate
against the blocks it then takes, and the manager's state after each
operation (``state_reader``).  The rules are kvspec's (``model.state``).
"""

import inspect
import json
import os
import tempfile

from .planning import Unsupported, attention_spec, mamba_spec, mixer_class, scheduler_groups, spec_kind
from .platform import install_sm90_platform, preimport
from .state_reader import StateReader

__all__ = ["EngineMachine", "build_engine", "PREIMPORT", "Unsupported"]

PREIMPORT = (
    "vllm.model_executor.models.llama", "vllm.model_executor.models.llama_eagle3",
    "vllm.model_executor.models.nemotron_h", "vllm.model_executor.models.falcon_h1",
    "vllm.model_executor.models.gpt_oss", "vllm.model_executor.models.gemma3",
    "vllm.model_executor.models.qwen3_next", "vllm.model_executor.models.qwen3_next_mtp",
    "vllm.model_executor.layers.mamba.mamba_mixer2",
    "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
    "vllm.model_executor.layers.attention.attention",
)

_PLATFORM = None


def _platform():
    global _PLATFORM
    if _PLATFORM is None:
        # vLLM imports this compiled module on the CUDA path; nothing the
        # scheduler runs needs it (as in the deployment probe).
        import sys
        import types

        sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
        try:
            import vllm.platforms.cuda  # noqa: F401
        except ModuleNotFoundError as exc:
            # Up to 0.23 the CUDA platform module imports the compiled ops
            # themselves at import time; the scheduler calls none of them.
            if exc.name != "vllm._C":
                raise
            sys.modules["vllm._C"] = types.ModuleType("vllm._C")
        preimport(PREIMPORT)
        _PLATFORM = install_sm90_platform()
    return _PLATFORM


def _write_config(folder, config):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle)
    return folder


def _engine_args(setup, target_dir, draft_dir):
    from vllm.engine.arg_utils import EngineArgs

    kwargs = dict(setup["engine_args"])
    kwargs.update(model=target_dir, skip_tokenizer_init=True)
    spec = kwargs.get("speculative_config")
    if spec is not None:
        spec = dict(spec)
        if draft_dir is not None:
            spec["model"] = draft_dir
        kwargs["speculative_config"] = spec
    accepted = set(inspect.signature(EngineArgs.__init__).parameters)
    dropped = sorted(k for k in kwargs if k not in accepted)
    if dropped:
        raise Unsupported(f"EngineArgs of this release takes no {', '.join(dropped)}")
    return EngineArgs(**kwargs)


def build_engine(setup):
    """The real scheduler for one engine setup, and what vLLM derived for it
    (the groups, block sizes, hash scheme and the settings in force)."""
    import vllm
    from vllm.v1.core import kv_cache_utils as utils

    platform, backend = _platform()
    with tempfile.TemporaryDirectory(prefix="kvspec-engine-") as tmp:
        target_dir = _write_config(os.path.join(tmp, "target"), setup["hf_config"])
        drafter = setup.get("drafter")
        draft_dir = None
        if drafter and drafter.get("hf_config"):
            draft_dir = _write_config(os.path.join(tmp, "draft"), drafter["hf_config"])
        vc = _engine_args(setup, target_dir, draft_dir).create_engine_config()
    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    if hasattr(platform, "update_block_size_for_backend"):
        platform.update_block_size_for_backend(vc)
    num_kv_heads, head_size = mc.get_num_kv_heads(pc), mc.get_head_size()
    specs = {}
    layers = setup["layers"]
    if any(k == "mamba" for k in layers):
        model_cls, _ = mc.registry.resolve_model_cls(mc.architectures, mc)
        mixer = mixer_class(setup["mixer"])
    for index, kind in enumerate(layers):
        if kind == "mamba":
            specs[f"model.layers.{index}.mixer"] = mamba_spec(vc, model_cls, mixer)
        elif kind == "full":
            specs[f"model.layers.{index}.self_attn.attn"] = attention_spec(vc, backend, num_kv_heads, head_size)
        else:  # "sliding:W"
            window = int(kind.split(":")[1])
            specs[f"model.layers.{index}.self_attn.attn"] = attention_spec(
                vc, backend, num_kv_heads, head_size, sliding_window=window)
    if drafter:
        # The drafter's attention geometry where its config.json says one
        # (an EAGLE3 drafter's own heads), else the target's (MTP modules).
        d_heads = drafter.get("num_kv_heads") or num_kv_heads
        d_head = drafter.get("head_dim") or head_size
        for j in range(drafter.get("draft_layers", 1)):
            specs[f"drafter.layers.{j}.self_attn.attn"] = attention_spec(vc, backend, d_heads, d_head, draft=True)
    _, config = scheduler_groups(vc, specs, backend)
    # EngineCore._initialize_kv_caches, after planning.
    cc.num_gpu_blocks = config.num_blocks
    groups = config.kv_cache_groups
    if groups:
        cacheable = [g.kv_cache_spec.block_size for g in groups if getattr(g.kv_cache_spec, "prefix_cacheable", True)]
        cc.block_size = min(cacheable or [g.kv_cache_spec.block_size for g in groups])
    if hasattr(vc, "validate_block_size"):
        vc.validate_block_size()
    S, H = utils.resolve_kv_cache_block_sizes(config, vc)
    if hasattr(config, "hash_block_size"):
        config.hash_block_size = H
    resolve_alignment = getattr(utils, "resolve_cache_hit_alignment_tokens", None)
    if resolve_alignment is not None and hasattr(config, "cache_hit_alignment_tokens"):
        config.cache_hit_alignment_tokens = resolve_alignment(config, vc, S, H)
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler_cls = vc.scheduler_config.get_scheduler_cls()
    wanted = dict(vllm_config=vc, kv_cache_config=config, structured_output_manager=StructuredOutputManager(vc),
                  include_finished_set=False, log_stats=False, block_size=S, hash_block_size=H)
    # AsyncScheduler takes *args, **kwargs: the keywords are the first named ones in its MRO.
    named = next(c.__init__ for c in scheduler_cls.__mro__
                 if "vllm_config" in inspect.signature(c.__init__).parameters)
    accepted = set(inspect.signature(named).parameters)
    scheduler = scheduler_cls(**{k: v for k, v in wanted.items() if k in accepted})
    hasher = None
    if cc.enable_prefix_caching:
        from vllm.utils.hashing import get_hash_fn_by_name

        hash_fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
        utils.init_none_hash(hash_fn)
        extra = (vc.num_hash_lookahead_tokens,) if getattr(vc, "num_hash_lookahead_tokens", 0) else ()
        hasher = utils.get_request_block_hasher(H, hash_fn, *extra)
    manager = scheduler.kv_cache_manager
    coordinator = manager.coordinator
    sc = vc.speculative_config
    derived = {
        "vllm_version": vllm.__version__,
        "scheduler_class": type(scheduler).__name__,
        # "eagle": whether the group's manager drops the EAGLE block, as the
        # scheduler built it (0.28 passes use_eagle for every group, 0.33+ turns
        # it off under lookahead hashes); "eagle_group": the group's own flag.
        "groups": [{"kind": spec_kind(g.kv_cache_spec), "block_size": g.kv_cache_spec.block_size,
                    "eagle": bool(getattr(m, "use_eagle", False)),
                    "eagle_group": bool(getattr(g, "is_eagle_group", False)),
                    "sliding_window": getattr(g.kv_cache_spec, "sliding_window", None) or 0,
                    # The granularity the group's retention floors boundaries to.
                    "alignment": getattr(m, "cache_hit_alignment_tokens", None) or S,
                    "layers": len(g.layer_names),
                    # A Mamba layer's prefill checkpoint (0.30+; MambaMixer2
                    # declares one from 0.32): whether the scheduler splits a
                    # prefill at block boundaries or the state is exported
                    # from inside the chunk.  Scheduling depends on it, so an
                    # upstream script or test builds its spec with these.
                    **(_checkpoint_fields(g.kv_cache_spec) if spec_kind(g.kv_cache_spec).startswith("mamba") else {})}
                   for g, m in zip(groups, coordinator.single_type_managers)],
        "scheduler_block_size": S, "hash_block_size": H,
        "num_blocks": config.num_blocks,
        "enable_caching": bool(cc.enable_prefix_caching),
        "partial_hash_hits": bool(getattr(coordinator, "enable_partial_hash_hits", False)),
        # What the scheduler passed its manager (0.28+: the scheduler's own
        # attribute; 0.31+ reads it from VllmConfig.num_prefill_lookahead_tokens).
        "num_prefill_lookahead": int(getattr(scheduler, "num_prefill_lookahead", None)
                                     or getattr(vc, "num_prefill_lookahead_tokens", 0) or 0),
        # SpeculativeConfig.use_multi_module_mtp (0.27+; None: no speculative
        # decoding, or a release without it).
        "multi_module_mtp": bool(sc.use_multi_module_mtp()) if sc is not None and hasattr(
            sc, "use_multi_module_mtp") else None,
        "num_hash_lookahead_tokens": getattr(vc, "num_hash_lookahead_tokens", 0) or 0,
        "retention_interval": getattr(config, "prefix_cache_retention_interval", None),
        "async_scheduling": bool(vc.scheduler_config.async_scheduling),
        "max_concurrent_batches": int(getattr(vc, "max_concurrent_batches", 1) or 1),
        "chunked_prefill": bool(vc.scheduler_config.enable_chunked_prefill),
        "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": vc.scheduler_config.max_num_seqs,
        "reserve_full_isl": bool(getattr(vc.scheduler_config, "scheduler_reserve_full_isl", False)),
        "max_model_len": mc.max_model_len,
        "speculative_method": getattr(sc, "method", None),
        "num_speculative_tokens": getattr(sc, "num_speculative_tokens", 0) or 0,
        "use_eagle_block_drop": bool(getattr(manager, "use_eagle", False)),
        "mamba_cache_mode": getattr(cc, "mamba_cache_mode", None),
        "kv_connector": None if scheduler.connector is None else type(scheduler.connector).__name__,
        "kv_load_failure_policy": getattr(vc.kv_transfer_config, "kv_load_failure_policy", None)
        if scheduler.connector is not None else None,
    }
    return scheduler, hasher, derived


def _checkpoint_fields(spec):
    """A Mamba spec's prefill-checkpoint fields as vLLM built them (a release
    whose MambaSpec has none: 0 blocks, no alignment, its only behaviour), and
    the state blocks its layer keeps for speculative decoding (the manager
    allocates them; an upstream script builds the spec with them)."""
    alignment = getattr(spec, "prefill_checkpoint_alignment", None)
    return {"prefill_checkpoint_blocks": int(getattr(spec, "num_prefill_checkpoint_blocks", 0) or 0),
            "prefill_checkpoint_alignment": None if alignment is None else int(alignment),
            "speculative_blocks": int(getattr(spec, "num_speculative_blocks", 0) or 0)}


class _CountingPool:
    """A group's view of the shared block pool that counts the blocks the
    group asks for (``get_new_blocks``) into ``taken[index]``; everything
    else is the pool's own."""

    def __init__(self, pool, taken: list, index: int) -> None:
        self._pool, self._taken, self._index = pool, taken, index

    def get_new_blocks(self, num_blocks, *args, **kwargs):
        # Counted as asked: an allocation that raises ("Cannot get N free
        # blocks") still says which group asked for more than it estimated.
        self._taken[self._index] += num_blocks
        return self._pool.get_new_blocks(num_blocks, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._pool, name)

class EngineMachine:
    """One engine: requests added, steps taken, requests aborted, the cache
    reset; after every operation the state and what the step observed."""

    def __init__(self, setup):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request, RequestStatus

        self.setup = setup
        self.scheduler, self.hasher, self.derived = build_engine(setup)
        self.manager = self.scheduler.kv_cache_manager
        self.reader = StateReader(self.manager)
        self.Request, self.RequestStatus, self.SamplingParams = Request, RequestStatus, SamplingParams
        self.request_params = set(inspect.signature(Request.__init__).parameters)
        self.async_queue = [] if self.derived["async_scheduling"] else None
        self.queue_size = max(1, self.derived["max_concurrent_batches"])
        self.token = 100_000
        self.lookups = []
        self.registrations = []  # every cache_blocks call this operation (per group: tokens, blocks registered)
        self.observe = True
        self.scheduled = None
        self.handed = []
        self.allocations = []
        self.evicted = []  # block ids each evict_blocks call named, this operation
        self.released = []  # requests whose blocks the manager's free gave back, this operation
        # Per request, how often the manager gave its blocks back (free, or
        # pop_blocks_for_free for a deferred free) since the engine was built:
        # each cache_blocks call carries it (``life``), so the registration
        # bound starts a request afresh after a preemption or a failed load.
        self.lives = {}
        # kvspec's connector's loads the "worker" runs: asynchronous ones
        # pending (steps left before finished_recving), in start order.
        self.pending_loads = []
        self._observe()

    # -- observation points: instance-level wrappers, forwarding everything ----
    def _observe(self):
        manager, reader = self.manager, self.reader
        lookup, take = manager.get_computed_blocks, getattr(manager, "take_new_block_ids", None)
        # 0.27+: with a KV connector the scheduler looks up through
        # get_computed_blocks_for_connector, whose groups may end at different
        # points (``diverged``: full attention's hit, a lagging group holding
        # less); it may call get_computed_blocks itself, recorded once, as its.
        connector_lookup = getattr(manager, "get_computed_blocks_for_connector", None)
        inside = []

        def observed(call, request, args, kwargs, read):
            if inside:
                return call(*args, **kwargs)
            before = reader.digest()
            mapped = reader.mapped(request) if len(reader.groups) == 1 and self.derived["enable_caching"] else None
            inside.append(True)
            try:
                found = call(*args, **kwargs)
            finally:
                inside.pop()
            group_blocks, hit, junction, diverged = read(found)
            entry = {"request": request.request_id, "hit": hit, "num_tokens": request.num_tokens,
                     "group_blocks": group_blocks, "before": before, "after": reader.digest()}
            if mapped is not None:
                entry["mapped"] = mapped
            # 0.30+: the shared-prefix junction the scheduler pins on the
            # request (sparse retention keeps its state for siblings).
            if junction is not None:
                entry["junction"] = junction
            if diverged:
                entry["diverged"] = True
            self.lookups.append(entry)
            return found

        def read_lookup(found):
            blocks = [[b.block_id for b in g] for g in getattr(found[0], "blocks", ())]
            junction = found[2] if len(found) > 2 and isinstance(found[2], int) else None
            return blocks, found[1], junction, len(found) > 3 and bool(found[3])

        manager.get_computed_blocks = lambda request, *a, **k: observed(
            lookup, request, (request, *a), k, read_lookup)
        if connector_lookup is not None:
            manager.get_computed_blocks_for_connector = lambda request, *a, **k: observed(
                connector_lookup, request, (request, *a), k, read_lookup)
        # 0.24-0.26: with a KV connector on a Mamba hybrid the scheduler looks
        # up each group on its own through the coordinator and takes the
        # deepest group's hit as the local hit; the groups may end at
        # different points (``diverged``).  Called with the request's block
        # hashes, which name the request.
        coordinator = manager.coordinator
        per_group = getattr(coordinator, "find_longest_cache_hit_per_group", None)
        if per_group is not None:
            def read_per_group(found):
                blocks, hits = found
                hit = max(hits, default=0)
                return [[b.block_id for b in g] for g in blocks], hit, None, min(hits, default=0) < hit

            def per_group_lookup(block_hashes, *a, **k):
                request = next((r for r in self.scheduler.requests.values() if r.block_hashes is block_hashes),
                               None)
                if request is None:  # not a request's lookup: not the scheduler's
                    return per_group(block_hashes, *a, **k)
                return observed(per_group, request, (block_hashes, *a), k, read_per_group)

            coordinator.find_longest_cache_hit_per_group = per_group_lookup
        # Each cache_blocks call as the registration differential records it
        # (one recorder: manager_driver's), with the request it was for.
        from .manager_driver import record_call, record_group

        group_managers = list(coordinator.single_type_managers)
        recorded = record_call(coordinator.cache_blocks, self.derived["hash_block_size"], group_managers,
                               lambda: self.registrations, with_request=True)

        def cache_blocks(request, *args, **kwargs):
            # Also each group's blocks counted registered before the call: a
            # request's first call finds those its allocation counted (a hit's,
            # and the null blocks standing for the skipped blocks of a KV
            # connector's load), which no cache_blocks call registered.
            calls = self.registrations
            first = len(calls)
            before = [m.num_cached_block.get(request.request_id, 0) for m in group_managers]
            try:
                return recorded(request, *args, **kwargs)
            finally:
                if len(calls) > first:
                    calls[first]["life"] = self.lives.get(request.request_id, 0)
                    calls[first]["registered_before"] = before

        coordinator.cache_blocks = cache_blocks
        for index, group_manager in enumerate(group_managers):
            group_manager.cache_blocks = record_group(index, group_manager.cache_blocks, lambda: self.registrations)
        if take is not None:
            def take_new_block_ids(*args, **kwargs):
                out = take(*args, **kwargs)
                self.handed.extend(out or ())
                return out

            manager.take_new_block_ids = take_new_block_ids
        allocate, pool, groups = manager.allocate_slots, manager.block_pool, reader.groups

        def allocate_slots(request, *args, **kwargs):
            # Each group's last estimate (the admission gate asks first for the
            # whole prompt, then for this allocation) against the free blocks
            # the allocation then takes: the seam's own contract.  Each group
            # reaches the pool through its own ``block_pool`` attribute: a
            # counting view there says which group took the blocks (a broken
            # estimate's identity is its group's kind).
            estimates = [None] * len(groups)
            taken = [0] * len(groups)
            for index, g in enumerate(groups):
                original = g.get_num_blocks_to_allocate

                def recorded(*a, _original=original, _index=index, **k):
                    n = _original(*a, **k)
                    estimates[_index] = n
                    return n

                g.get_num_blocks_to_allocate = recorded
                g.block_pool = _CountingPool(pool, taken, index)
            entry = {"request": request.request_id, "estimates": estimates, "taken": taken,
                     "free_before": pool.get_num_free_blocks(), "free_after": None}
            self.allocations.append(entry)
            try:
                out = allocate(request, *args, **kwargs)
            finally:
                for g in groups:
                    del g.get_num_blocks_to_allocate
                    g.block_pool = pool
            entry["allocated"] = out is not None
            entry["free_after"] = pool.get_num_free_blocks()
            return out

        manager.allocate_slots = allocate_slots
        connector = self.scheduler.connector
        if connector is not None:
            offer = connector.get_num_new_matched_tokens

            def get_num_new_matched_tokens(request, *args, **kwargs):
                # The connector tokens a lookup's request is given (the state
                # rules leave such requests' zeroing to the load): asked right
                # after that request's lookup, so the latest lookup is its.
                out = offer(request, *args, **kwargs)
                for entry in reversed(self.lookups):
                    if entry["request"] == request.request_id:
                        entry["external"] = int(out[0] or 0)
                        break
                return out

            connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        evict = getattr(manager, "evict_blocks", None)
        if evict is not None:
            def evict_blocks(block_ids, *args, **kwargs):
                self.evicted.append(sorted(int(b) for b in block_ids))
                return evict(block_ids, *args, **kwargs)

            manager.evict_blocks = evict_blocks
        release = manager.free

        def free(request, *args, **kwargs):
            # Blocks given back while the request stays with the scheduler
            # (e.g. an asynchronous load that failed with nothing valid: vLLM
            # frees it and admits it again, maybe within the same step).
            self.released.append(request.request_id)
            self.lives[request.request_id] = self.lives.get(request.request_id, 0) + 1
            return release(request, *args, **kwargs)

        manager.free = free
        pop = getattr(manager, "pop_blocks_for_free", None)
        if pop is not None:
            def pop_blocks_for_free(request, *args, **kwargs):
                # A deferred free (0.33+): the request's bookkeeping goes now,
                # its blocks join the pool once the step in flight ends.
                self.lives[request.request_id] = self.lives.get(request.request_id, 0) + 1
                return pop(request, *args, **kwargs)

            manager.pop_blocks_for_free = pop_blocks_for_free

    # -- operations -------------------------------------------------------------
    def _arrive(self, op):
        params = {"max_tokens": op.get("max_tokens", 16), "ignore_eos": True}
        if op.get("load"):
            # The plan rides in the request's kv_transfer_params, as a client's
            # per-request connector parameters do (kvspec's connector reads it).
            from .connector import PLAN_KEY

            params["extra_args"] = {"kv_transfer_params": {PLAN_KEY: dict(op["load"])}}
        wanted = {
            "request_id": op["id"], "prompt_token_ids": list(op["tokens"]),
            "sampling_params": self.SamplingParams(**params),
            "pooling_params": None, "block_hasher": self.hasher, "eos_token_id": None, "arrival_time": 0.0,
        }
        request = self.Request(**{k: v for k, v in wanted.items() if k in self.request_params})
        self.scheduler.add_request(request)
        return {}

    def _samples(self, scheduler_output):
        """Per request, the tokens the model runner may sample for this step,
        read right after its schedule() (under async scheduling a later
        schedule() moves the request on before this output is processed):
        none for a partial prefill, else one plus the drafts scheduled."""
        spec = scheduler_output.scheduled_spec_decode_tokens
        allotted = {}
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.scheduler.requests.get(req_id)
            partial = request is None or getattr(
                request, "is_prefill_chunk",
                request.num_computed_tokens < request.num_tokens + getattr(request, "num_output_placeholders", 0))
            allotted[req_id] = 0 if partial else 1 + len(spec.get(req_id, ()))
        return allotted

    def _transfers(self, scheduler_output):
        """What the worker side of kvspec's connector reports for a step it
        executes (read at its schedule(): the worker runs the step then):
        the loads the step's metadata starts begin; a synchronous one that
        fails reports its failing block in this step's ``invalid_block_ids``;
        an asynchronous one finishes (``finished_recving``, with its failing
        block if any) in the output of the step its drawn delay names."""
        from .connector import KvspecConnectorMetadata

        meta = getattr(scheduler_output, "kv_connector_metadata", None)
        if not isinstance(meta, KvspecConnectorMetadata) and not self.pending_loads:
            return None
        invalid, finished = set(), set()
        for load in getattr(meta, "loads", ()):
            if load["async"]:
                self.pending_loads.append(dict(load, remaining=load["delay"]))
            elif load["failing"] is not None:
                invalid.add(load["failing"])
        still = []
        for load in self.pending_loads:
            if load["remaining"] > 0:
                still.append(dict(load, remaining=load["remaining"] - 1))
                continue
            finished.add(load["request"])
            if load["failing"] is not None:
                invalid.add(load["failing"])
        self.pending_loads = still
        if not invalid and not finished:
            return None
        return {"invalid_block_ids": invalid, "finished_recving": finished}

    def _outputs(self, scheduler_output, allotted, accepted, transfers=None):
        """What the model runner returns for a step: one sampled token per
        request whose step completes its prompt or decodes, plus the drafts
        accepted; nothing for a partial prefill (never more than the step
        allotted); and what kvspec's connector's worker side reports."""
        from vllm.v1.outputs import ModelRunnerOutput

        req_ids, sampled = [], []
        for req_id in scheduler_output.num_scheduled_tokens:
            req_ids.append(req_id)
            room = allotted.get(req_id, 0)
            sampled.append([self._next() for _ in range(min(accepted + 1, room))])
        wanted = {"req_ids": req_ids, "req_id_to_index": {r: i for i, r in enumerate(req_ids)},
                  "sampled_token_ids": sampled}
        fields = set(inspect.signature(ModelRunnerOutput).parameters)
        if transfers:
            from vllm.v1.outputs import KVConnectorOutput

            if "kv_connector_output" not in fields:
                raise Unsupported("this release's ModelRunnerOutput carries no kv_connector_output")
            wanted["kv_connector_output"] = KVConnectorOutput(**transfers)
        return ModelRunnerOutput(**{k: v for k, v in wanted.items() if k in fields})

    def _next(self):
        self.token += 1
        return self.token

    def _process(self, scheduled, accepted):
        scheduler_output, allotted, transfers = scheduled
        outputs = self.scheduler.update_from_output(scheduler_output,
                                                    self._outputs(scheduler_output, allotted, accepted, transfers))
        finished = set()
        for engine_outputs in (outputs or {}).values():
            for out in getattr(engine_outputs, "outputs", ()):
                if getattr(out, "finish_reason", None) is not None:
                    finished.add(out.request_id)
        return finished

    def _drafts(self, scheduler_output, drafts):
        """EngineCore.post_step: the drafter's proposals for the next step
        (synchronous scheduling; async scheduling's drafts stay in the worker)."""
        if not drafts or not self.derived["num_speculative_tokens"]:
            return
        from vllm.v1.outputs import DraftTokenIds

        k = min(drafts, self.derived["num_speculative_tokens"])
        ids = [r for r in scheduler_output.num_scheduled_tokens if r in self.scheduler.requests]
        self.scheduler.update_draft_token_ids(DraftTokenIds(ids, [[7] * k for _ in ids]))

    def _schedule(self, result):
        """``schedule()``, then the state it leaves: the step's lookups,
        allocations and zeroing belong to it, checked before the outputs are
        processed (an output can free what the schedule placed)."""
        running_before = {r.request_id for r in self.scheduler.running}
        so = self.scheduler.schedule()
        result["scheduled"] = dict(so.num_scheduled_tokens)
        result["preempted"] = sorted(getattr(so, "preempted_req_ids", None) or ())
        self.scheduled = self._answer({"scheduled": dict(so.num_scheduled_tokens), "preempted": result["preempted"]},
                                      running_before)
        self.lookups, self.handed, self.allocations, self.registrations = [], [], [], []
        return so, self._samples(so), self._transfers(so)

    def _step(self, op):
        accepted, drafts = op.get("accepted", 0), op.get("drafts", 0)
        scheduler = self.scheduler
        result = {"scheduled": {}, "preempted": [], "finished": []}
        if self.async_queue is None:
            if not scheduler.has_requests():
                return result
            scheduled = self._schedule(result)
            result["finished"] = sorted(self._process(scheduled, accepted))
            if scheduled[0].total_num_scheduled_tokens > 0:
                self._drafts(scheduled[0], drafts)
            return result
        # EngineCore.step_with_batch_queue
        queue = self.async_queue
        if scheduler.has_requests():
            scheduled = self._schedule(result)
            executed = scheduled[0].total_num_scheduled_tokens > 0
            queue.insert(0, scheduled)
            if len(queue) < self.queue_size and (executed or scheduler.has_requests()):
                return result
        elif not queue:
            return result
        result["finished"] = sorted(self._process(queue.pop(), accepted))
        return result

    def _abort(self, op):
        aborted = self.scheduler.finish_requests(op["id"], self.RequestStatus.FINISHED_ABORTED)
        # Requests (0.24+) or (request id, client index) pairs (0.23).
        return {"finished": [r[0] if isinstance(r, tuple) else r.request_id for r in (aborted or ())]}

    def _reset(self, op):
        return {"reset": bool(self.scheduler.reset_prefix_cache())}

    def _answer(self, result, running_before):
        running = {r.request_id: r.num_computed_tokens for r in self.scheduler.running}
        if not self.observe:  # the benchmark's unchecked baseline: nothing read
            return {"result": {}, "running": running, "waiting": [], "state": None}
        result["lookups"] = self.lookups
        result["allocations"] = self.allocations
        result["registrations"] = self.registrations
        if self.evicted:
            result["evicted"] = sorted({b for call in self.evicted for b in call})
        # Requests whose blocks the scheduler gave back (gone from its
        # requests, or preempted): no table may stay.  A finished request a
        # connector still reads keeps its blocks until the transfer ends.
        requests = self.scheduler.requests
        result["freed"] = sorted({r for r in running_before - set(running)
                                  if r not in requests or requests[r].status == self.RequestStatus.PREEMPTED}
                                 | set(self.released))
        waiting = [r.request_id for r in requests.values() if r.request_id not in running]
        # Waiting requests that hold blocks for a KV load in flight.
        remote = getattr(self.RequestStatus, "WAITING_FOR_REMOTE_KVS", None)
        result["loading"] = sorted(r.request_id for r in requests.values() if r.status == remote)
        state = self.reader.snapshot(delta=True)
        # Blocks the scheduler holds outside the tables until an in-flight step
        # ends, and (0.27.1-0.28) the copy-on-write blocks the manager pins for
        # a KV connector's partial-tail offload until the request is freed.
        held = [b.block_id for _, blocks in getattr(self.scheduler, "deferred_frees", ()) for b in blocks]
        pins = getattr(self.scheduler.kv_cache_manager, "_partial_tail_pins", None) or {}
        held += [b.block_id for blocks in pins.values() for b in blocks]
        state["held_elsewhere"] = sorted(held)
        return {"result": result, "handed_for_zeroing": list(self.handed), "running": running,
                "waiting": sorted(waiting), "state": state}

    def apply(self, op, observe=True):
        """One operation's answer; a step's carries ``scheduled``, the answer
        for its ``schedule()`` alone, read before its outputs were processed.
        ``observe`` off (the benchmark's unchecked baseline only): no state read."""
        self.observe = observe
        self.lookups, self.handed, self.allocations, self.evicted, self.released = [], [], [], [], []
        self.registrations = []
        self.scheduled = None
        kind = op["do"]
        running_before = {r.request_id for r in self.scheduler.running}
        if kind == "arrive":
            result = self._arrive(op)
        elif kind == "step":
            result = self._step(op)
        elif kind == "abort":
            result = self._abort(op)
        elif kind == "reset":
            result = self._reset(op)
        else:
            raise ValueError(f"unknown engine operation {kind!r}")
        if self.scheduled is not None:
            running_before = set(self.scheduled["running"])
        answer = self._answer({k: v for k, v in result.items() if k not in ("scheduled", "preempted")},
                              running_before)
        if self.scheduled is not None:
            answer["scheduled"] = self.scheduled
        return answer
