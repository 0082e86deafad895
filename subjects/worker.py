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
        config = self.iface.KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=group_specs)
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
                              "later_tokens": later.num_tokens}
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


class _SchedulerStandIn:
    """The attributes ``Scheduler._mamba_block_aligned_split`` and
    ``_reserve_prefill_lookahead`` read, set as ``Scheduler.__init__`` sets
    them from the manager kvspec built (kvspec's model of that constructor;
    the two methods themselves are vLLM's, called unbound)."""

    def __init__(self, manager, case):
        import types

        coordinator = manager.coordinator
        mamba = [m.kv_cache_spec for m in coordinator.single_type_managers
                 if type(m.kv_cache_spec).__name__ == "MambaSpec"]
        drop = any(getattr(m, "use_eagle", False) for m in coordinator.single_type_managers)
        H, S = case["hash_block_size"], case["scheduler_block_size"]
        self.cache_config = types.SimpleNamespace(block_size=mamba[0].block_size if mamba else S)
        self.block_size = S
        self.hash_block_size = H
        partial = bool(getattr(coordinator, "enable_partial_hash_hits", False))
        self.mamba_partial_cache_hit = bool(mamba) and H < S and partial
        self.use_eagle = self.use_eagle_block_drop = drop
        self.mamba_fine_grained_prefix_cache = False
        self.mamba_has_prefill_checkpoint_blocks = bool(mamba) and all(
            getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0 for spec in mamba)
        self.mamba_prefill_checkpoint_alignment = getattr(mamba[0], "prefill_checkpoint_alignment", None) \
            if mamba else None
        self.mamba_shared_prefix_checkpoint = False
        self.max_num_scheduled_tokens = 1 << 16
        self.scheduler_config = types.SimpleNamespace(long_prefill_token_threshold=0)
        self.num_hash_lookahead_tokens = case.get("num_hash_lookahead_tokens", 0)
        self.num_prefill_lookahead = case["num_prefill_lookahead"]


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
    scheduler = _SchedulerStandIn(manager, case)
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


class Unsupported(Exception):
    pass


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
                 "traceback": traceback.format_exc()}
    reply["seconds"] = time.perf_counter() - started
    return reply


def _prefill_chunks_op(driver, request):
    try:
        return prefill_chunks(driver, request)
    except Unsupported as exc:
        return {"ok": False, "unsupported": True, "error": str(exc)}
    except BaseException as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def _session_op(driver, request):
    try:
        if request["op"] == "open_session":
            return driver.open_session(request["case"])
        return driver.session_actions(request["actions"])
    except Unsupported as exc:
        return {"ok": False, "unsupported": True, "error": str(exc)}
    except BaseException as exc:  # a vLLM exception mid-replay is reported whole
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


if __name__ == "__main__":
    sys.exit(main())
