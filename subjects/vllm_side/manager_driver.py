"""The manager driver (stdlib + vLLM only): vLLM's ``KVCacheManager`` built
for a case's geometry and driven one request at a time, as vLLM's scheduler
drives it.

What it observes, per ``allocate_slots`` call of a case (``run``): the
coordinator's ``cache_blocks`` argument, the ``num_tokens`` each group
manager's ``cache_blocks`` receives (an instance-level wrapper: the most
version-stable observation point), the hashed tokens at the call, and each
manager's registered full-block count afterwards; plus the effective regime
the coordinator chose (partial hash hits, per-manager EAGLE flags).  Besides,
the hit-rate replay (``open_session`` / ``session_actions``: one manager, many
requests) and vLLM's prefill chunking of a Mamba "align" layout for the MTP
search (``prefill_chunks``).
"""

import inspect
import json
import os

from .errors import Rejected, Unsupported
from .introspection import introspect

__all__ = ["Driver", "RecordedManager", "SchedulerStandIn", "prefill_chunks"]


class Driver:
    def __init__(self):
        import torch
        import vllm
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1 import kv_cache_interface
        from vllm.v1.request import Request

        try:
            from vllm.utils.hashing import sha256
        except ImportError:  # older layout
            from vllm.utils import sha256
        self.torch = torch
        self.vllm = vllm
        self.SamplingParams = SamplingParams
        self.KVCacheManager = KVCacheManager
        self.Request = Request
        self.iface = kv_cache_interface
        self.utils = kv_cache_utils
        self.sha256 = sha256
        self.utils.init_none_hash(sha256)
        self.hashers = {}
        self.sampling = {}  # max_tokens -> SamplingParams
        # A case's manager is reused by the next case of the same geometry
        # (see _recorded_manager); KVSPEC_FRESH_MANAGERS=1 builds one per case.
        self.reuse_managers = os.environ.get("KVSPEC_FRESH_MANAGERS") != "1"
        self.spares = {}  # geometry key -> RecordedManager, least recently kept first
        self.serial = 0  # cases run
        self.managers_built = 0  # for those cases
        self.capabilities = introspect()
        self.allocate_params = set(inspect.signature(KVCacheManager.allocate_slots).parameters)
        self.machine = None  # the stateful differential's manager (open_machine)
        self.engine = None  # the engine differential's real Scheduler (open_engine)
        self.manager_params = set(self.capabilities["manager_keywords"])
        self.request_params = set(self.capabilities["request_keywords"])

    # -- building vLLM objects ------------------------------------------------
    def _spec(self, group):
        torch = self.torch
        kind, block = group["kind"], group["block_size"]
        if kind == "full_attention":
            return self.iface.FullAttentionSpec(
                block_size=block, num_kv_heads=1, head_size=8, dtype=torch.float16)
        if kind == "sliding_window":
            return self.iface.SlidingWindowSpec(
                block_size=block, num_kv_heads=1, head_size=8, dtype=torch.float16,
                sliding_window=group["sliding_window"])
        if kind == "mamba_align":
            return self.iface.MambaSpec(
                block_size=block, shapes=((4, 4),), dtypes=(torch.float16,),
                mamba_cache_mode="align", **group.get("mamba_spec", {}))
        raise ValueError(f"unknown group kind {kind!r}")

    def _manager(self, case):
        groups = case["groups"]
        max_tokens = case["max_model_len"]
        num_blocks = case["num_blocks"]
        group_specs = []
        for i, group in enumerate(groups):
            kwargs = {}
            if self.capabilities["per_group_eagle"]:
                kwargs["is_eagle_group"] = bool(group["eagle"])
            group_specs.append(self.iface.KVCacheGroupSpec([f"layer{i}"], self._spec(group), **kwargs))
        extra = {}
        if case.get("retention_field") is not None:
            extra["prefix_cache_retention_interval"] = case["retention_field"]
        config = self.iface.KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=group_specs, **extra)
        wanted = {
            "kv_cache_config": config,
            "max_model_len": max_tokens,
            "scheduler_block_size": case["scheduler_block_size"],
            "hash_block_size": case["hash_block_size"],
            "enable_caching": case["enable_caching"],
            # Lookahead hashes (0.33) replace the EAGLE drop, as vLLM's scheduler does.
            "use_eagle": any(g["eagle"] for g in groups) and not self._hash_lookahead(case),
            "num_prefill_lookahead": case["num_prefill_lookahead"],
            "num_hash_lookahead_tokens": self._hash_lookahead(case),
            "dcp_world_size": case["dcp_world_size"],
            "max_num_batched_tokens": max_tokens,
            "max_in_flight_tokens": max_tokens,
            "log_stats": False,
        }
        if case["num_prefill_lookahead"] and "num_prefill_lookahead" not in self.manager_params:
            raise Unsupported("this vLLM has no num_prefill_lookahead (added in 0.28)")
        return self.KVCacheManager(**{k: v for k, v in wanted.items() if k in self.manager_params})

    def _hash_lookahead(self, case):
        """Tokens past each block its hash covers (``num_hash_lookahead_tokens``;
        0: legacy hashes): from the configuration's hash scheme
        (``model.domain.HashScheme``), or set by the MTP search."""
        lookahead = case.get("num_hash_lookahead_tokens", 0)
        if lookahead and not self.capabilities["lookahead_block_hashes"]:
            raise Unsupported("this vLLM has no lookahead block hashes (added in 0.33)")
        return lookahead

    def _request(self, case, token_ids, request_id="kvspec-0"):
        key = (case["hash_block_size"], self._hash_lookahead(case))
        if key not in self.hashers:
            extra = (key[1],) if key[1] else ()
            self.hashers[key] = self.utils.get_request_block_hasher(key[0], self.sha256, *extra)
        wanted = {
            "request_id": request_id,
            "prompt_token_ids": token_ids,
            "sampling_params": self._sampling_params(case["max_model_len"]),
            "pooling_params": None,
            "block_hasher": self.hashers[key],
            "eos_token_id": None,
            "arrival_time": 0.0,
        }
        return self.Request(**{k: v for k, v in wanted.items() if k in self.request_params})

    def _sampling_params(self, max_tokens):
        # A Request only reads its SamplingParams, so equal ones are shared.
        if max_tokens not in self.sampling:
            self.sampling[max_tokens] = self.SamplingParams(max_tokens=max_tokens)
        return self.sampling[max_tokens]

    # -- one request's scheduler steps (shared by run and the replay session) --
    def _lookup(self, manager, request):
        """The request's prefix-cache lookup: the state its first step starts from."""
        found = manager.get_computed_blocks(request)
        return {"blocks": found[0], "hit": found[1], "computed": found[1], "first": True}

    def _allocate_step(self, manager, request, state, step):
        """``allocate_slots`` for one scheduler step: a prefill chunk, or one
        decode token plus drafts, the rejected drafts rolled back after."""
        if step["kind"] == "prefill":
            new = step["tokens"]
            drafts = 0
        else:
            drafts = step["drafts"]
            if hasattr(request, "spec_token_ids"):
                request.spec_token_ids = [7] * drafts
            else:
                drafts = 0
            new = request.num_tokens + drafts - state["computed"]
        first = state["first"]
        out = manager.allocate_slots(
            request, new,
            num_new_computed_tokens=state["hit"] if first else 0,
            new_computed_blocks=state["blocks"] if first else None,
            num_lookahead_tokens=0,
        )
        if out is None:
            raise RuntimeError(f"allocate_slots found no free blocks at step {step} (free {manager.block_pool.get_num_free_blocks()}, computed {state['computed']}, tokens {request.num_tokens}, hit {state['hit']})")
        state["first"] = False
        state["computed"] += new
        if step["kind"] == "decode":
            state["computed"] -= drafts - step["accepted"]
            if hasattr(request, "spec_token_ids"):
                request.spec_token_ids = []
        request.num_computed_tokens = state["computed"]

    # -- the hit-rate replay: one manager, many requests ----------------------
    def open_session(self, case):
        """A fresh manager for a multi-request replay (``oracles.hitrate``
        schedules it); its pool is sized by the caller so nothing is evicted."""
        manager = self._manager(case)
        handed = {}  # request id -> per-group num_tokens of its latest cache_blocks

        def record_group(index, original):
            def wrapper(request, num_tokens, *args, **kwargs):
                handed.setdefault(request.request_id, {})[index] = num_tokens
                return original(request, num_tokens, *args, **kwargs)
            return wrapper

        for i, m in enumerate(manager.coordinator.single_type_managers):
            m.cache_blocks = record_group(i, m.cache_blocks)
        self.session = {"case": case, "manager": manager, "requests": {}, "handed": handed}
        return {"ok": True, "groups": len(manager.coordinator.single_type_managers)}

    def session_actions(self, actions):
        """Apply scheduler actions in order: ``new_step`` (what vLLM's
        scheduler tells the manager as a step begins), ``start`` (a request looks up),
        ``step`` (``allocate_slots``, then the given output tokens appended),
        ``free``.  Answers each start with its hit and each step with the
        ``n`` that reached ``cache_blocks``."""
        session = self.session
        manager, requests = session["manager"], session["requests"]
        answers = []
        for action in actions:
            if action["do"] == "new_step":  # the scheduler's per-step bookkeeping
                if hasattr(manager, "new_step_starts"):
                    manager.new_step_starts()
                answers.append({})
                continue
            rid = action["id"]
            if action["do"] == "start":
                request = self._request(session["case"], action["tokens"], request_id=f"r{rid}")
                state = self._lookup(manager, request)
                requests[rid] = (request, state)
                answers.append({"hit": state["hit"], "tokens": request.num_tokens})
            elif action["do"] == "step":
                request, state = requests[rid]
                self._allocate_step(manager, request, state, action["step"])
                for token in action["outputs"]:
                    request.append_output_token_ids(token)
                latest = session["handed"].pop(request.request_id, {})
                answers.append({"computed": state["computed"],
                                "num_tokens": [latest.get(i) for i in range(len(session["case"]["groups"]))]})
            else:
                request, _ = requests.pop(rid)
                manager.free(request)
                answers.append({})
        return {"ok": True, "answers": answers}

    # -- one example ----------------------------------------------------------
    def _recorded_manager(self, case):
        """A manager in its initial state for this case's geometry, with
        recorders on ``cache_blocks``: the previous case's when it had the
        same geometry and was reset cleanly (a fuzzing batch shares one
        configuration, and building a KVCacheManager is a quarter of a case's
        cost), else a new one."""
        key = json.dumps({k: v for k, v in case.items() if k not in _PER_REQUEST_FIELDS},
                         sort_keys=True)
        spare = self.spares.pop(key, None)  # whatever happens next, it is used at most once
        if spare is not None:
            return spare
        try:
            manager = self._manager(case)
        except Unsupported:
            raise
        except BaseException as exc:
            # vLLM's constructor rejected the geometry: a precondition finding.
            raise Rejected(f"{type(exc).__name__}: {exc}") from exc
        self.managers_built += 1
        return RecordedManager(key, manager, case["hash_block_size"])

    def _keep_for_reuse(self, recorded, request):
        """Free the request and clear the prefix cache; keep the manager for
        the next case only if that leaves it as a new one would be: every
        block free, no cached hash, no per-request state in any group."""
        if not self.reuse_managers or not hasattr(recorded.manager, "reset_prefix_cache"):
            return
        recorded.manager.free(request)
        if recorded.manager.reset_prefix_cache() and recorded.is_pristine():
            self.spares[recorded.key] = recorded
            while len(self.spares) > _SPARE_MANAGERS:  # the least recently kept goes
                del self.spares[next(iter(self.spares))]

    def run(self, case):
        recorded = self._recorded_manager(case)
        manager, coordinator, managers = recorded.manager, recorded.coordinator, recorded.managers
        calls = recorded.calls = []
        self.serial += 1  # request ids never repeat on a reused manager
        prompt = [1000 + i for i in range(case["prompt_len"])]
        request = self._request(case, prompt, request_id=f"kvspec-{self.serial}")
        state = self._lookup(manager, request)
        next_token = 5000
        for step in case["steps"]:
            self._allocate_step(manager, request, state, step)
            if step["kind"] == "decode":
                emitted = step["accepted"] + 1
            else:
                emitted = 1 if state["computed"] >= request.num_tokens else 0
            for _ in range(emitted):
                request.append_output_token_ids(next_token)
                next_token += 1
        regime = {
            "coordinator": type(coordinator).__name__,
            "partial_hash_hits": bool(getattr(coordinator, "enable_partial_hash_hits", False)),
            "use_eagle": [bool(getattr(m, "use_eagle", False)) for m in managers],
            "block_sizes": [m.block_size for m in managers],
            "num_reprefillable_tokens": getattr(coordinator, "num_reprefillable_tokens", 0),
        }
        reply = {"calls": calls, "regime": regime}
        probe = case.get("probe")
        if probe:
            # A later request sharing the writer's first tokens looks up while
            # the writer is still running (its blocks are cached, not freed).
            writer_tokens = list(request.all_token_ids)
            shared = writer_tokens[:probe["shared"]]
            later = self._request(case, shared + [90000 + i for i in range(probe["extra"])],
                                  request_id=f"kvspec-{self.serial}-later")
            found = manager.get_computed_blocks(later)
            reply["probe"] = {"hit": found[1], "writer_tokens": len(writer_tokens),
                              "later_tokens": later.num_tokens,
                              "group_blocks": [len(group) for group in getattr(found[0], "blocks", ())]}
        self._keep_for_reuse(recorded, request)
        return reply

# -- vLLM's prefill chunking of a Mamba "align" layout (the MTP search) ----------------

def _mtp_scheduler(manager, case):
    """What ``_mamba_block_aligned_split`` and ``_reserve_prefill_lookahead``
    read of their scheduler, derived as the release's ``Scheduler.__init__``
    derives it from the manager (the strict stand-in the stateful machine
    uses: an attribute kvspec does not know is refused)."""
    from vllm.v1.kv_cache_interface import MambaSpec

    coordinator = manager.coordinator
    specs = [g.kv_cache_spec for g in manager.kv_cache_config.kv_cache_groups
             if isinstance(g.kv_cache_spec, MambaSpec)]
    S, H = case["scheduler_block_size"], case["hash_block_size"]
    use_eagle = any(getattr(m, "use_eagle", False) for m in coordinator.single_type_managers)
    partial = bool(specs) and H < S and bool(getattr(coordinator, "enable_partial_hash_hits", False))
    return SchedulerStandIn({
        "cache_config": SchedulerStandIn({"block_size": specs[0].block_size if specs else S,
                                           "mamba_cache_mode": "align",
                                           "enable_prefix_caching": case["enable_caching"]}),
        "scheduler_config": SchedulerStandIn({"long_prefill_token_threshold": 0}),
        "block_size": S, "hash_block_size": H, "use_eagle": use_eagle, "use_eagle_block_drop": use_eagle,
        "num_hash_lookahead_tokens": case.get("num_hash_lookahead_tokens", 0),
        "num_prefill_lookahead": case["num_prefill_lookahead"],
        "max_num_scheduled_tokens": 1 << 16, "need_mamba_block_aligned_split": True,
        "scheduler_block_size": S, "mamba_partial_cache_hit": partial,
        "mamba_prefill_checkpoint_alignment": next(
            (getattr(spec, "prefill_checkpoint_alignment", None) for spec in specs), None),
        "mamba_has_prefill_checkpoint_blocks": bool(specs) and all(
            getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0 for spec in specs),
        "mamba_fine_grained_prefix_cache": False, "mamba_shared_prefix_checkpoint": False,
    })


def prefill_chunks(driver, case, prompts):
    """vLLM's scheduler chunking of each prompt length for one geometry:
    ``_mamba_block_aligned_split`` then ``_reserve_prefill_lookahead`` in
    ``schedule()``'s order, until the prompt is computed (a step that
    schedules nothing is a stall, reported as such)."""
    import types

    from vllm.v1.core.sched.scheduler import Scheduler

    split = getattr(Scheduler, "_mamba_block_aligned_split", None)
    reserve = getattr(Scheduler, "_reserve_prefill_lookahead", None)
    if split is None:
        raise Unsupported("this vLLM's scheduler has no _mamba_block_aligned_split")
    manager = driver._manager(case)
    scheduler = _mtp_scheduler(manager, case)
    out = []
    for prompt in prompts:
        req = types.SimpleNamespace(num_computed_tokens=0, num_prompt_tokens=prompt, num_tokens=prompt,
                                    shared_prefix_boundary=0)
        chunks, computed = [], 0
        while computed < prompt:
            new = split(scheduler, req, prompt - computed)
            if reserve is not None:
                new = reserve(scheduler, req, computed, new)
            if new <= 0:
                break
            chunks.append(new)
            computed += new
            req.num_computed_tokens = computed
        out.append({"prompt": prompt, "chunks": chunks, "stalled_at": None if computed >= prompt else computed})
    return {"ok": True, "results": out, "reserve": reserve is not None,
            "checkpoint_blocks": scheduler.mamba_has_prefill_checkpoint_blocks}


# What a case says about its request rather than about the manager's geometry.
_PER_REQUEST_FIELDS = ("prompt_len", "steps", "probe")
# Reset managers kept for reuse, one per geometry: a batch has one, but the
# reducer and the sweeps move back and forth between a few.
_SPARE_MANAGERS = 4


def record_call(original, H, managers, calls, with_request=False):
    """The coordinator's ``cache_blocks`` recording each call into
    ``calls()``: its ``n``, the hashed tokens, the ``num_tokens`` each group
    manager receives (filled in by ``record_group``) and each group's
    registered full blocks afterwards (``with_request``: the request's id
    too; the engine records several requests' calls)."""
    def wrapper(request, num_computed_tokens, *args, **kwargs):
        call = {"n": num_computed_tokens, "hashed_tokens": len(request.block_hashes) * H,
                "num_tokens": [None] * len(managers)}
        if with_request:
            call["request"] = request.request_id
        calls().append(call)
        result = original(request, num_computed_tokens, *args, **kwargs)
        call["registered_blocks"] = [m.num_cached_block.get(request.request_id, 0) for m in managers]
        return result
    return wrapper


def record_group(index, original, calls):
    """A group manager's ``cache_blocks`` noting the ``num_tokens`` it
    receives in the latest call ``record_call`` recorded."""
    def wrapper(request, num_tokens, *args, **kwargs):
        recorded = calls()
        if recorded:
            recorded[-1]["num_tokens"][index] = num_tokens
        return original(request, num_tokens, *args, **kwargs)
    return wrapper


class RecordedManager:
    """A KVCacheManager whose coordinator and group managers record, per
    ``cache_blocks`` call of the current case (``calls``): the coordinator's
    ``n``, the hashed tokens, the ``num_tokens`` each group manager receives
    (an instance-level wrapper: the most version-stable observation point)
    and each group's registered full blocks afterwards."""

    def __init__(self, key, manager, hash_block_size):
        self.key = key
        self.manager = manager
        self.coordinator = manager.coordinator
        self.managers = list(self.coordinator.single_type_managers)
        self.calls = []
        self.coordinator.cache_blocks = self._record_call(self.coordinator.cache_blocks, hash_block_size)
        for index, group_manager in enumerate(self.managers):
            group_manager.cache_blocks = self._record_group(index, group_manager.cache_blocks)

    def _record_call(self, original, H):
        return record_call(original, H, self.managers, lambda: self.calls)

    def _record_group(self, index, original):
        return record_group(index, original, lambda: self.calls)

    def is_pristine(self):
        """After ``free`` and ``reset_prefix_cache``: as a new manager would be
        (attributes a release lacks count as not pristine: never reused)."""
        pool = getattr(self.coordinator, "block_pool", None)
        if pool is None or not hasattr(pool, "num_gpu_blocks"):
            return False
        if pool.get_num_free_blocks() != pool.num_gpu_blocks - 1:  # the null block is always in use
            return False
        for m in self.managers:
            for state in ("req_to_blocks", "num_cached_block"):
                if getattr(m, state, None):
                    return False
        return True


class SchedulerStandIn:
    """What vLLM's ``Scheduler._mamba_block_aligned_split`` reads of its
    scheduler, derived from the manager: the method itself is vLLM's own,
    called unmodified.  An attribute kvspec does not know is refused, never
    guessed."""

    def __init__(self, values):
        self.__dict__.update(values)

    def __getattr__(self, name):
        raise Unsupported(f"vLLM's Mamba-aligned prefill split reads scheduler.{name}, which kvspec does "
                          "not know how to derive")

