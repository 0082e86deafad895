"""The subject-side driver: runs inside a vLLM runtime, drives vLLM's own code.

Started by ``subjects/process.py`` as ``python -I worker.py`` with the
subject tree in ``KVSPEC_SUBJECT_TREE`` (put first on ``sys.path`` here, never
through ``PYTHONPATH``).  It imports only the standard library and vLLM (it
must run on any supported release), reads one JSON request per line on
stdin and answers one JSON line on a private pipe: vLLM's logging and any
print go to stderr, so they can never corrupt the protocol
(``subjects/protocol.py`` lists the messages).

What it observes, per ``allocate_slots`` call: the coordinator's
``cache_blocks`` argument, the ``num_tokens`` each group manager's
``cache_blocks`` receives (an instance-level wrapper: the most
version-stable observation point), the hashed tokens at the call, and each
manager's registered full-block count afterwards; plus the effective regime
the coordinator chose (partial hash hits, per-manager EAGLE flags).

Importing this module has no side effects: the symbolic harness reuses
``introspect`` in the same runtime.
"""

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import time
import traceback

_PROTOCOL = None  # the private copy of stdout, set up by main()


def _send(message):
    _PROTOCOL.write(json.dumps(message) + "\n")
    _PROTOCOL.flush()


def load_kvspec_namespace():
    """Make ``kvspec.subjects.vllm_side`` importable here: the runtime has no
    kvspec installed, so a bare ``kvspec`` namespace is pointed at the folder
    holding this file's package (the checkout's root, or the installed
    ``kvspec`` folder).  A process that set one up already keeps it."""
    import types

    if "kvspec" not in sys.modules:
        namespace = types.ModuleType("kvspec")
        namespace.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        sys.modules["kvspec"] = namespace


def use_subject_tree():
    """Put the tree kvspec names first on sys.path (before vLLM is imported)."""
    tree = os.environ.get("KVSPEC_SUBJECT_TREE")
    if tree:
        sys.path.insert(0, tree)


def introspect():
    """What this vLLM can do, found in its code (kvspec.model.capabilities
    names the fields), and where it was imported from."""
    import vllm
    from vllm.v1 import kv_cache_interface
    from vllm.v1.core import kv_cache_coordinator, single_type_kv_cache_manager
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.request import Request

    manager_params = set(inspect.signature(KVCacheManager.__init__).parameters) - {"self"}
    request_params = set(inspect.signature(Request.__init__).parameters) - {"self"}
    group_fields = {f.name for f in dataclasses.fields(kv_cache_interface.KVCacheGroupSpec)}
    hybrid = getattr(kv_cache_coordinator, "HybridKVCacheCoordinator", None)
    hybrid_source = inspect.getsource(hybrid) if hybrid is not None else ""
    stm = single_type_kv_cache_manager.SingleTypeKVCacheManager
    path = os.path.dirname(os.path.abspath(vllm.__file__))
    return {
        "vllm_version": getattr(vllm, "__version__", "unknown"),
        "vllm_path": path,
        "git_commit": _git_commit(path),
        "hybrid_coordinator": hybrid is not None,
        "scheduler_block_size": "scheduler_block_size" in manager_params,
        "partial_hash_hits": "enable_partial_hash_hits" in hybrid_source,
        "reprefillable_tokens": "num_prefill_lookahead" in manager_params,
        "per_group_eagle": "is_eagle_group" in group_fields,
        "fine_grained_lookup_fallback": hasattr(stm, "supports_fine_grained_hash_lookup"),
        "get_num_cacheable_tokens": hasattr(hybrid, "get_num_cacheable_tokens"),
        "lookahead_block_hashes": "num_hash_lookahead_tokens" in manager_params,
        **_deployment_features(hybrid_source, kv_cache_interface, kv_cache_coordinator),
        "manager_keywords": sorted(manager_params),
        "request_keywords": sorted(request_params),
    }


def _deployment_features(hybrid_source, kv_cache_interface, kv_cache_coordinator):
    """Features a deployment can switch on that kvspec's differential does
    not drive (``Capabilities.not_covered`` words them): partial hash hits
    under DCP > 1, the prefix-cache retention interval, replay boundaries
    handed to ``cache_blocks``, groups that opt out of prefix caching."""
    from vllm.v1.core import kv_cache_utils

    rule = hybrid_source
    if hasattr(kv_cache_utils, "partial_hash_hits_enabled"):
        rule += inspect.getsource(kv_cache_utils.partial_hash_hits_enabled)
    config_fields = {f.name for f in dataclasses.fields(kv_cache_interface.KVCacheConfig)}
    try:
        import vllm.envs as envs
        retention_env = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" in inspect.getsource(envs)
    except Exception:
        retention_env = False
    return {
        "dcp_partial_hash_hits": "block_size >= hash_block_size" in rule,
        "retention_interval": "prefix_cache_retention_interval" in config_fields or retention_env,
        "replay_boundaries": "replay_boundaries" in inspect.getsource(kv_cache_coordinator),
        "per_group_caching": hasattr(kv_cache_interface.KVCacheSpec, "prefix_cacheable"),
    }


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

def mamba_layer_checkpoint_fields():
    """The prefill-checkpoint fields vLLM's own Mamba2 layer gives its
    MambaSpec in this release ({} where it declares none), read from the
    layer's source text (importing the model layers is not needed)."""
    import vllm

    path = os.path.join(os.path.dirname(vllm.__file__), "model_executor", "layers", "mamba", "mamba_mixer2.py")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return {}
    if "num_prefill_checkpoint_blocks=1" in text and "prefill_checkpoint_alignment=1" in text:
        return {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1}
    return {}


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
    return _SchedulerStandIn({
        "cache_config": _SchedulerStandIn({"block_size": specs[0].block_size if specs else S,
                                           "mamba_cache_mode": "align",
                                           "enable_prefix_caching": case["enable_caching"]}),
        "scheduler_config": _SchedulerStandIn({"long_prefill_token_threshold": 0}),
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


def prefill_chunks(driver, request):
    """vLLM's scheduler chunking of each prompt length for one geometry:
    ``_mamba_block_aligned_split`` then ``_reserve_prefill_lookahead`` in
    ``schedule()``'s order, until the prompt is computed (a step that
    schedules nothing is a stall, reported as such)."""
    import types

    from vllm.v1.core.sched.scheduler import Scheduler

    case = request["case"]
    split = getattr(Scheduler, "_mamba_block_aligned_split", None)
    reserve = getattr(Scheduler, "_reserve_prefill_lookahead", None)
    if split is None:
        return {"ok": False, "unsupported": True, "error": "this vLLM's scheduler has no _mamba_block_aligned_split"}
    manager = driver._manager(case)
    scheduler = _mtp_scheduler(manager, case)
    out = []
    for prompt in request["prompts"]:
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
        def wrapper(request, num_computed_tokens, *args, **kwargs):
            call = {"n": num_computed_tokens, "hashed_tokens": len(request.block_hashes) * H,
                    "num_tokens": [None] * len(self.managers)}
            self.calls.append(call)
            result = original(request, num_computed_tokens, *args, **kwargs)
            call["registered_blocks"] = [
                m.num_cached_block.get(request.request_id, 0) for m in self.managers]
            return result
        return wrapper

    def _record_group(self, index, original):
        def wrapper(request, num_tokens, *args, **kwargs):
            if self.calls:
                self.calls[-1]["num_tokens"][index] = num_tokens
            return original(request, num_tokens, *args, **kwargs)
        return wrapper

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


class _SchedulerStandIn:
    """What vLLM's ``Scheduler._mamba_block_aligned_split`` reads of its
    scheduler, derived from the manager: the method itself is vLLM's own,
    called unmodified.  An attribute kvspec does not know is refused, never
    guessed."""

    def __init__(self, values):
        self.__dict__.update(values)

    def __getattr__(self, name):
        raise Unsupported(f"vLLM's Mamba-aligned prefill split reads scheduler.{name}, which kvspec does "
                          "not know how to derive")


def StateReader(manager):
    from kvspec.subjects.vllm_side.state_reader import StateReader as reader

    return reader(manager)


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
        # test replays exactly these (``kvspec.report.stateful_test``).
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
        stand_in = _SchedulerStandIn({
            "cache_config": _SchedulerStandIn({"block_size": mamba[0], "mamba_cache_mode": "align",
                                               "enable_prefix_caching": self.case["enable_caching"]}),
            "scheduler_config": _SchedulerStandIn({"long_prefill_token_threshold": 0}),
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


class Unsupported(Exception):
    pass


class BadOperation(Exception):
    """An operation kvspec should not have sent (a request that is not there)."""


class Rejected(Exception):
    """vLLM refused to build a manager for this configuration."""


def _git_commit(path):
    try:
        out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def main():
    global _PROTOCOL
    # The protocol gets a private copy of stdout; fd 1 then points at stderr.
    _PROTOCOL = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    use_subject_tree()
    load_kvspec_namespace()
    try:
        driver = Driver()
    except Exception as exc:  # the subject cannot even be imported
        _send({"ok": False, "fatal": True, "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()})
        return 1
    _send({"ok": True, "capabilities": driver.capabilities})
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "quit":
            break
        if request.get("op") == "stream":
            # One line per case as soon as it is done, so the caller compares
            # case i while this process drives case i + 1; then an end marker.
            for case in request["cases"]:
                _send(_run_one(driver, case))
            _send({"ok": True, "done": True})
        elif request.get("op") in ("open_session", "session_actions"):
            _send(_session_op(driver, request))
        elif request.get("op") == "prefill_chunks":
            _send(_prefill_chunks_op(driver, request))
        elif request.get("op") == "mamba_layer_checkpoint_fields":
            _send({"ok": True, "fields": mamba_layer_checkpoint_fields()})
        elif request.get("op") in ("open_machine", "machine_ops", "machine_trace"):
            _send(_machine_op(driver, request))
        elif request.get("op") in ("open_engine", "engine_ops"):
            _send(_engine_op(driver, request))
        elif request.get("op") == "stats":
            _send({"ok": True, "cases": driver.serial, "managers_built": driver.managers_built,
                   "reuse_managers": driver.reuse_managers})
        else:
            _send(_run_one(driver, request["case"]))
    return 0


def _run_one(driver, case):
    started = time.perf_counter()
    try:
        reply = {"ok": True, **driver.run(case)}
    except Unsupported as exc:
        reply = {"ok": False, "unsupported": True, "error": str(exc)}
    except Rejected as exc:
        reply = {"ok": False, "phase": "construct", "error": str(exc),
                 "traceback": traceback.format_exc()}
    except BaseException as exc:  # a vLLM exception is a finding, reported whole
        reply = {"ok": False, "phase": "drive", "error": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc(), **exception_origin(exc)}
    reply["seconds"] = time.perf_counter() - started
    return reply


def exception_origin(exc):
    """Whose code raised ``exc``: the innermost traceback frame that is in
    either vLLM's package or this file decides ("vllm" or "kvspec"; frames of
    other libraries, such as torch under vLLM, are passed over), and where."""
    vllm = sys.modules.get("vllm")
    roots = [os.path.realpath(p) + os.sep for p in getattr(vllm, "__path__", ())]
    # kvspec's own code on this side: this file and the vllm_side package beside it.
    ours = os.path.dirname(os.path.realpath(__file__)) + os.sep
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        path = os.path.realpath(frame.f_code.co_filename)
        if any(path.startswith(root) for root in roots):
            return {"origin": "vllm", "where": f"{os.path.basename(path)}:{line} in {frame.f_code.co_name}"}
        if path.startswith(ours):
            return {"origin": "kvspec", "where": f"{os.path.basename(path)}:{line} in {frame.f_code.co_name}"}
    return {"origin": "unknown"}


def _prefill_chunks_op(driver, request):
    try:
        return prefill_chunks(driver, request)
    except Unsupported as exc:
        return {"ok": False, "unsupported": True, "error": str(exc)}
    except BaseException as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def _machine_op(driver, request):
    """The stateful differential: a manager opened, then operations applied in
    order, each answered with what it returned and the state after it.  A vLLM
    exception stops the batch and is reported whole with the operation's index."""
    if request["op"] == "machine_trace":
        if driver.machine is None:
            return {"ok": False, "kvspec_error": "no machine is open", "no_machine": True}
        return {"ok": True, "trace": driver.machine.trace}
    if request["op"] == "machine_ops" and driver.machine is None:  # kvspec's error (a fresh worker), not vLLM's
        return {"ok": False, "kvspec_error": "no machine is open on this worker", "no_machine": True}
    if request["op"] == "open_machine":
        try:
            driver.machine = Machine(driver, request["case"])
        except Unsupported as exc:
            return {"ok": False, "unsupported": True, "error": str(exc)}
        except ImportError as exc:  # the runtime lacks a module vLLM imports: the machine's, not vLLM's
            return {"ok": False, "environment": True, "error": f"{type(exc).__name__}: {exc}"}
        except BaseException as exc:  # vLLM refused the configuration
            return {"ok": False, "phase": "construct", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(), **exception_origin(exc)}
        machine = driver.machine
        return {"ok": True, "state": machine.snapshot(), "groups": len(machine.groups),
                # What this vLLM lets the machine do, and the retention it took.
                "operations": {"evict": hasattr(machine.manager, "evict_blocks"),
                               "reset": hasattr(machine.manager, "reset_prefix_cache")},
                "retention_interval": getattr(machine.coordinator, "retention_interval", None)}
    answers = []
    for index, op in enumerate(request["ops"]):
        try:
            answers.append(driver.machine.apply(op, request.get("observe", True)))
        except Unsupported as exc:
            return {"ok": False, "unsupported": True, "error": str(exc), "answers": answers}
        except BadOperation as exc:
            return {"ok": False, "kvspec_error": str(exc), "index": index, "answers": answers}
        except BaseException as exc:  # a vLLM exception mid-sequence is a finding, reported whole
            return {"ok": False, "phase": "drive", "index": index, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(), "answers": answers, **exception_origin(exc)}
    return {"ok": True, "answers": answers}


def _engine_op(driver, request):
    """The engine differential: a real Scheduler built (``open_engine``), then
    operations applied in order, each answered with what the step observed and
    the manager's state after it.  An exception raised in vLLM's frames stops
    the batch and is reported whole (a finding); one raised in kvspec's own
    frames is kvspec's error, never vLLM's."""
    from kvspec.subjects.vllm_side.engine import EngineMachine, Unsupported as EngineUnsupported

    if request["op"] == "open_engine":
        driver.engine = None
        try:
            driver.engine = EngineMachine(request["setup"])
        except (Unsupported, EngineUnsupported) as exc:
            return {"ok": False, "unsupported": True, "error": str(exc)}
        except ImportError as exc:
            return {"ok": False, "environment": True, "error": f"{type(exc).__name__}: {exc}"}
        except BaseException as exc:  # vLLM's configuration code refused the setup
            return {"ok": False, "phase": "construct", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(), **exception_origin(exc)}
        engine = driver.engine
        return {"ok": True, "derived": engine.derived, "state": engine.reader.snapshot()}
    if getattr(driver, "engine", None) is None:
        return {"ok": False, "kvspec_error": "no engine is open (the worker was restarted, or none was built)"}
    answers = []
    for index, op in enumerate(request["ops"]):
        try:
            answers.append(driver.engine.apply(op, request.get("observe", True)))
        except BaseException as exc:
            origin = exception_origin(exc)
            reply = {"ok": False, "index": index, "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc(), "answers": answers, **origin}
            if origin["origin"] == "vllm":
                reply["phase"] = "drive"
                reply["allocations"] = driver.engine.allocations
            else:
                reply["kvspec_error"] = f"{type(exc).__name__}: {exc}"
            return reply
    return {"ok": True, "answers": answers}


def _session_op(driver, request):
    try:
        if request["op"] == "open_session":
            return driver.open_session(request["case"])
        return driver.session_actions(request["actions"])
    except Unsupported as exc:
        return {"ok": False, "unsupported": True, "error": str(exc)}
    except BaseException as exc:  # a vLLM exception mid-replay is reported whole
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                **exception_origin(exc)}


if __name__ == "__main__":
    sys.exit(main())
