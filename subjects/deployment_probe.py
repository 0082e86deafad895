"""What vLLM's scheduler would build for a deployment, from the release's own
configuration code (runs in a vLLM runtime; standard library and vLLM only).

Started by ``subjects/drivers/deployments.py`` as ``python -I
deployment_probe.py OPTIONS_JSON`` with the subject tree in
``KVSPEC_SUBJECT_TREE``, like the worker and the symbolic harness.  The
options carry the deployment profiles (``kvspec.model.deployments``, as
plain JSON: the published configuration fields, the layer layout, the
drafter, the knobs).  For each profile and each hash scheme asked for, the
probe answers one JSON line on stdout: the derivation, every step saying
whether the release's code was **called** or the step was **modelled** (a
stand-in or kvspec's own rule, named), and the values each step produced.

The steps, in the order the engine takes them:

1. ``engine_config`` (called): ``EngineArgs(...).create_engine_config()``
   on a directory holding only the profile's ``config.json`` (no weights, no
   tokenizer): the model's hybrid hooks (``verify_and_update_config``:
   mamba cache mode, Mamba block), the speculative config.
2. ``platform`` (modelled): a GPU platform stand-in, since a CPU cannot
   report one: vLLM's own ``CudaPlatformBase`` reporting an SM90 device, with
   the FlashAttention backend class (imported from the release) as the
   attention backend.
3. ``attention_block`` (called): ``Platform.update_block_size_for_backend``
   -- the backend's preferred block and the hybrid alignment that raises the
   attention block to the Mamba page.
4. ``layer_layout`` (modelled): which layer is attention, sliding window or
   Mamba, from the published fields (kvspec's catalog); a server reads it
   from the constructed model.
5. ``layer_specs`` (called): each layer's ``get_kv_cache_spec`` (vLLM's
   ``Attention`` / Mamba mixer methods) on an attribute-only stand-in layer.
6. ``drafter_layers`` (modelled): the drafter's attention layers and their
   ``is_draft`` mark, which the GPU model runner sets.
7. ``groups`` (called): the release's KV-cache grouping, page unification
   and scheduler config (``kv_cache_planning`` / ``kv_cache_utils``).
8. ``block_sizes`` (called): ``resolve_kv_cache_block_sizes`` after the
   engine's reset of ``cache_config.block_size`` to the smallest cacheable block.
9. ``speculative`` (called): ``SpeculativeConfig.use_eagle``,
   ``use_eagle_block_drop`` / ``needs_eagle_block_drop``, the prefill and hash
   lookahead from ``VllmConfig``.
10. ``scheduler_use_eagle`` (modelled): the scheduler passes
    ``use_eagle = <block drop> and not num_hash_lookahead_tokens`` (0.33+), or
    ``use_eagle_block_drop()`` (0.30-0.32), or ``use_eagle()`` (0.28-0.29).
11. ``manager`` (called): a real ``KVCacheManager`` with the scheduler's
    keywords: the coordinator's partial hash hits, EAGLE and drop groups,
    reprefillable tokens and each manager's block size.

Besides, the ``release_facts`` line reports the speculative-method
predicates of ``SpeculativeConfig`` for every method name (called on a
stand-in holding only ``method``), which kvspec's knob lines quote.
"""

import dataclasses
import inspect
import json
import os
import sys
import tempfile
import time
import traceback
import types

OPTIONS = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
_namespace = types.ModuleType("kvspec")
_namespace.__path__ = list(OPTIONS.get("kvspec_paths", ()))
sys.modules["kvspec"] = _namespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

from kvspec.subjects.worker import use_subject_tree  # noqa: E402
from kvspec.subjects.vllm_side.platform import PLATFORM_NOTE, install_sm90_platform, preimport  # noqa: E402
from kvspec.subjects.vllm_side import planning  # noqa: E402
from kvspec.subjects.vllm_side.planning import (Unsupported, attention_spec, mamba_spec, mixer_class,  # noqa: E402
                                                spec_kind)

use_subject_tree()

# vLLM imports this compiled module at import time on the CUDA path; nothing
# the probe calls needs it.
sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))

_OUT = sys.stdout
sys.stdout = sys.stderr  # vLLM's prints never reach the answer lines

METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark", "ngram", "draft_model", "suffix")


def _answer(message):
    _OUT.write(json.dumps(message, default=str) + "\n")
    _OUT.flush()


def _called(steps, name, where, value, note=""):
    steps.append({"step": name, "how": "called", "source": where, "value": value, "note": note})


def _modelled(steps, name, where, value, note=""):
    steps.append({"step": name, "how": "modelled", "source": where, "value": value, "note": note})


# -- one profile ------------------------------------------------------------------------

def _write_config(folder, config):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle)
    return folder


def _engine_args(profile, target_dir, draft_dir, legacy_hashes):
    from vllm.engine.arg_utils import EngineArgs

    knobs = profile["knobs"]
    kwargs = dict(model=target_dir, skip_tokenizer_init=True,
                  enable_prefix_caching=knobs["prefix_caching"],
                  max_model_len=knobs["max_model_len"], tensor_parallel_size=knobs["tp"])
    if knobs["dcp"] > 1:
        kwargs["decode_context_parallel_size"] = knobs["dcp"]
    if knobs.get("prefix_match_unit"):
        kwargs["prefix_match_unit"] = knobs["prefix_match_unit"]
    if knobs.get("block_size"):
        kwargs["block_size"] = knobs["block_size"]
    drafter = profile.get("drafter")
    if drafter:
        spec = {"method": drafter["method"], "num_speculative_tokens": drafter["num_speculative_tokens"]}
        if draft_dir is not None:
            spec["model"] = draft_dir
        if legacy_hashes:
            spec["disable_lookahead_block_hashes"] = True
        kwargs["speculative_config"] = spec
    if knobs.get("kv_connector"):
        kwargs["kv_transfer_config"] = {"kv_connector": knobs["kv_connector"], "kv_role": "kv_both"}
    accepted = set(inspect.signature(EngineArgs.__init__).parameters)
    dropped = sorted(k for k in kwargs if k not in accepted)
    if dropped:
        raise Unsupported(f"EngineArgs of this release takes no {', '.join(dropped)}")
    if drafter and legacy_hashes:
        from vllm.config.speculative import SpeculativeConfig

        fields = {f.name for f in dataclasses.fields(SpeculativeConfig)} if dataclasses.is_dataclass(
            SpeculativeConfig) else set(getattr(SpeculativeConfig, "model_fields", {}))
        if "disable_lookahead_block_hashes" not in fields:
            kwargs["speculative_config"].pop("disable_lookahead_block_hashes")
    return EngineArgs(**kwargs)


def _spec_summary(spec):
    name = type(spec).__name__
    return {"type": name, "block_size": spec.block_size,
            "sliding_window": getattr(spec, "sliding_window", None),
            "mamba_cache_mode": getattr(spec, "mamba_cache_mode", None),
            "dcp_sharded": getattr(spec, "dcp_sharded", None),
            "is_draft": getattr(spec, "is_draft", None),
            "page_size_bytes": spec.page_size_bytes,
            "num_prefill_checkpoint_blocks": getattr(spec, "num_prefill_checkpoint_blocks", None)}


def derive(profile, legacy_hashes):
    steps = []
    started = time.perf_counter()
    import vllm

    model = profile["model"]
    with tempfile.TemporaryDirectory(prefix="kvspec-probe-") as tmp:
        target_dir = _write_config(os.path.join(tmp, "target"), model["hf_config"])
        drafter = profile.get("drafter")
        draft_dir = None
        if drafter and drafter.get("hf_config"):
            draft_dir = _write_config(os.path.join(tmp, "draft"), drafter["hf_config"])
        args = _engine_args(profile, target_dir, draft_dir, legacy_hashes)
        # DSpark and DFlash drafters run on the V2 model runner only.
        v2 = profile["knobs"].get("v2_model_runner")
        previous = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
        if v2:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        try:
            vc = args.create_engine_config()
        finally:
            if v2:
                if previous is None:
                    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
                else:
                    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = previous
    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    sc = vc.speculative_config
    _called(steps, "engine_config", "vllm.engine.arg_utils.EngineArgs.create_engine_config", {
        "architecture": mc.architecture, "is_hybrid": bool(getattr(mc, "is_hybrid", False)),
        "mamba_cache_mode": getattr(cc, "mamba_cache_mode", None),
        "block_size_before_worker": cc.block_size,
        "speculative_method": getattr(sc, "method", None),
        "num_speculative_tokens": getattr(sc, "num_speculative_tokens", None)},
        "a directory with only config.json: no weights, no tokenizer")
    platform, backend = PLATFORM
    _modelled(steps, "platform", "kvspec: " + PLATFORM_NOTE.split(" (")[0],
              {"device_capability": "9.0", "attention_backend": backend.__name__},
              "a CPU cannot report a GPU; Blackwell (FA4) or FlashInfer GDN prefill could align blocks "
              "differently")
    if hasattr(platform, "update_block_size_for_backend"):
        platform.update_block_size_for_backend(vc)
        _called(steps, "attention_block", f"{type(platform).__mro__[1].__module__}."
                "Platform.update_block_size_for_backend",
                {"block_size": cc.block_size, "mamba_block_size": getattr(cc, "mamba_block_size", None),
                 "mamba_page_size_padded": getattr(cc, "mamba_page_size_padded", None)})
    else:
        _called(steps, "attention_block", "the model's verify_and_update_config (inside create_engine_config)",
                {"block_size": cc.block_size, "mamba_block_size": getattr(cc, "mamba_block_size", None)})
    layers = model["layers"]
    _modelled(steps, "layer_layout", "kvspec: model/deployments.py (from the published config fields)",
              {"layers": len(layers), "kinds": sorted(set(k if isinstance(k, str) else k[0] for k in layers))})
    num_kv_heads, head_size = mc.get_num_kv_heads(pc), mc.get_head_size()
    specs = {}
    model_cls = None
    mixer_cls = None
    if any(k == "mamba" for k in layers):
        model_cls, _ = mc.registry.resolve_model_cls(mc.architectures, mc)
        mixer_cls = mixer_class(model["mixer"])
    for index, kind in enumerate(layers):
        if kind == "mamba":
            specs[f"model.layers.{index}.mixer"] = mamba_spec(vc, model_cls, mixer_cls)
        elif kind == "full":
            specs[f"model.layers.{index}.self_attn.attn"] = attention_spec(vc, backend, num_kv_heads, head_size)
        else:  # ["sliding", window]
            specs[f"model.layers.{index}.self_attn.attn"] = attention_spec(
                vc, backend, num_kv_heads, head_size, sliding_window=kind[1])
    _called(steps, "layer_specs", "vllm.model_executor.layers.attention.attention.Attention.get_kv_cache_spec"
            + (f", {mixer_cls.__module__}.{mixer_cls.__name__}.get_kv_cache_spec" if mixer_cls else ""),
            sorted({json.dumps(_spec_summary(s), sort_keys=True) for s in specs.values()}),
            "on attribute-only stand-in layers")
    if drafter and drafter["method"] not in ("ngram", "suffix"):
        draft_layers = drafter["draft_layers"]
        d_heads = drafter.get("num_kv_heads") or num_kv_heads
        d_heads = max(1, d_heads // pc.tensor_parallel_size) if drafter.get("num_kv_heads") else d_heads
        d_head = drafter.get("head_dim") or head_size
        for j in range(draft_layers):
            specs[f"drafter.layers.{j}.self_attn.attn"] = attention_spec(
                vc, backend, d_heads, d_head, draft=True, replicated=drafter.get("replicated", False))
        _modelled(steps, "drafter_layers", "kvspec: model/deployments.py (the GPU model runner builds them)",
                  {"layers": draft_layers, "num_kv_heads_per_rank": d_heads, "head_dim": d_head,
                   "is_draft": True})
    groups, sched_config = planning.scheduler_groups(vc, specs, backend)
    _called(steps, "groups", planning.GROUPS_SOURCE, [
        {"kind": spec_kind(g.kv_cache_spec), "block_size": g.kv_cache_spec.block_size,
         "layers": len(g.layer_names), "is_eagle_group": bool(getattr(g, "is_eagle_group", False)),
         "sliding_window": getattr(g.kv_cache_spec, "sliding_window", None) or 0,
         "dcp_sharded": getattr(g.kv_cache_spec, "dcp_sharded", None)} for g in groups])
    from vllm.v1.core import kv_cache_utils as utils

    if groups:
        cacheable = [g.kv_cache_spec.block_size for g in groups
                     if getattr(g.kv_cache_spec, "prefix_cacheable", True)]
        cc.block_size = min(cacheable or [g.kv_cache_spec.block_size for g in groups])
    S, H = utils.resolve_kv_cache_block_sizes(sched_config, vc)
    _called(steps, "block_sizes", "vllm.v1.core.kv_cache_utils.resolve_kv_cache_block_sizes",
            {"scheduler_block_size": S, "hash_block_size": H})
    drop = False
    method_facts = {}
    if sc is not None:
        method_facts["use_eagle"] = bool(sc.use_eagle())
        if hasattr(sc, "needs_eagle_block_drop"):
            method_facts["needs_eagle_block_drop"] = bool(sc.needs_eagle_block_drop())
        if hasattr(sc, "use_eagle_block_drop"):
            method_facts["use_eagle_block_drop"] = bool(sc.use_eagle_block_drop())
            drop = method_facts["use_eagle_block_drop"]
        else:
            drop = method_facts["use_eagle"]
        if hasattr(sc, "use_multi_module_mtp"):
            method_facts["use_multi_module_mtp"] = bool(sc.use_multi_module_mtp())
    npl, npl_how = _prefill_lookahead(vc, sc)
    nhl = getattr(vc, "num_hash_lookahead_tokens", 0) or 0
    method_facts.update(num_prefill_lookahead=npl, num_hash_lookahead_tokens=nhl)
    _called(steps, "speculative", "vllm.config.speculative.SpeculativeConfig (use_eagle, "
            "use_eagle_block_drop/needs_eagle_block_drop, use_multi_module_mtp), "
            "VllmConfig.num_hash_lookahead_tokens" + ("" if npl_how == "called"
                                                     else "; num_prefill_lookahead modelled: " + npl_how),
            method_facts)
    use_eagle = bool(drop and not nhl)
    _modelled(steps, "scheduler_use_eagle", "kvspec: Scheduler.__init__ passes use_eagle = "
              "<the block drop> and not num_hash_lookahead_tokens", {"use_eagle": use_eagle})
    manager = _manager(vc, sched_config, S, H, use_eagle, nhl, npl)
    coordinator = manager.coordinator
    managers = list(coordinator.single_type_managers)
    _called(steps, "manager", "vllm.v1.core.kv_cache_manager.KVCacheManager", {
        "coordinator": type(coordinator).__name__,
        "partial_hash_hits": bool(getattr(coordinator, "enable_partial_hash_hits", False)),
        "eagle_group_ids": sorted(getattr(coordinator, "eagle_group_ids", ()) or ()),
        "drop_eagle_group_ids": sorted(getattr(coordinator, "drop_eagle_group_ids",
                                               getattr(coordinator, "eagle_group_ids", ())) or ()),
        "use_eagle": [bool(getattr(m, "use_eagle", False)) for m in managers],
        "manager_block_sizes": [m.block_size for m in managers],
        "num_reprefillable_tokens": getattr(coordinator, "num_reprefillable_tokens", 0)})
    return {"ok": True, "vllm_version": vllm.__version__, "steps": steps,
            "seconds": round(time.perf_counter() - started, 3)}


def _prefill_lookahead(vc, sc):
    if hasattr(type(vc), "num_prefill_lookahead_tokens"):
        return vc.num_prefill_lookahead_tokens, "called"
    if sc is None or not sc.use_eagle():
        return 0, "0: no EAGLE-family drafter (the 0.28-0.30 scheduler's own rule)"
    multi = hasattr(sc, "use_multi_module_mtp") and sc.use_multi_module_mtp()
    return (sc.num_speculative_tokens if multi else 1,
            "1, or num_speculative_tokens for multi-module MTP (the 0.28-0.30 scheduler's own rule)")


def _manager(vc, sched_config, S, H, use_eagle, nhl, npl):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    cc, pc = vc.cache_config, vc.parallel_config
    accepted = set(inspect.signature(KVCacheManager.__init__).parameters)
    wanted = dict(
        kv_cache_config=sched_config, max_model_len=vc.model_config.max_model_len,
        max_in_flight_tokens=getattr(vc, "max_in_flight_tokens", None) or vc.scheduler_config.max_num_batched_tokens,
        max_num_batched_tokens=vc.scheduler_config.max_num_batched_tokens,
        enable_caching=cc.enable_prefix_caching, use_eagle=use_eagle, num_hash_lookahead_tokens=nhl,
        num_prefill_lookahead=npl, log_stats=False, enable_kv_cache_events=False,
        dcp_world_size=pc.decode_context_parallel_size, pcp_world_size=1, scheduler_block_size=S,
        hash_block_size=H, metrics_collector=None,
        watermark=getattr(vc.scheduler_config, "watermark", 0.01),
        enable_mamba_shared_prefix_checkpoint=getattr(cc, "enable_mamba_shared_prefix_checkpoint", False),
        enable_mamba_fine_grained_prefix_cache=getattr(cc, "enable_mamba_fine_grained_prefix_cache", False))
    return KVCacheManager(**{k: v for k, v in wanted.items() if k in accepted})


# -- release facts ----------------------------------------------------------------------

def release_facts():
    """The speculative-method predicates of this release, per method name,
    called on a stand-in that holds only ``method`` and the switches."""
    from vllm.config.speculative import SpeculativeConfig

    facts = {}
    names = ("use_eagle", "needs_eagle_block_drop", "use_eagle_block_drop")
    for method in METHODS:
        holder = types.SimpleNamespace(method=method, disable_eagle_block_drop=False,
                                       disable_lookahead_block_hashes=False)
        for helper in ("use_dflash", "use_dspark", "use_eagle", "needs_eagle_block_drop"):
            if hasattr(SpeculativeConfig, helper):
                setattr(holder, helper, getattr(SpeculativeConfig, helper).__get__(holder))
        row = {}
        for name in names:
            if hasattr(SpeculativeConfig, name):
                try:
                    row[name] = bool(getattr(SpeculativeConfig, name)(holder))
                except Exception as exc:  # a predicate that reads more than the method
                    row[name] = f"error: {type(exc).__name__}"
        facts[method] = row
    return {"speculative_methods": facts,
            "has": {name: hasattr(SpeculativeConfig, name) for name in names}}


PLATFORM = None


def main():
    global PLATFORM
    preimport(OPTIONS.get("preimport", ()))
    try:
        PLATFORM = install_sm90_platform()
    except Exception as exc:
        _answer({"fatal": f"cannot install the platform stand-in: {type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc()})
        return 1
    try:
        _answer({"release_facts": release_facts()})
    except Exception as exc:
        _answer({"release_facts": None, "error": f"{type(exc).__name__}: {exc}"})
    for profile in OPTIONS.get("profiles", ()):
        for legacy in profile.get("schemes", (False,)):
            key = {"profile": profile["name"], "legacy_hashes": legacy}
            try:
                _answer({**key, **derive(profile, legacy)})
            except Unsupported as exc:
                _answer({**key, "ok": False, "unsupported": str(exc)})
            except BaseException as exc:  # vLLM rejected the configuration, or a step failed
                _answer({**key, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                         "traceback": traceback.format_exc()[-4000:]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
