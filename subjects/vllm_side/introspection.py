"""What this vLLM can do, read from its code (stdlib + vLLM only): the
worker's hello (``introspect``, whose fields ``kvspec.model.capabilities``
names), the features a deployment can switch on that kvspec does not drive,
and what the release's Mamba2 layer declares for the MTP search.  Reused by
the symbolic harness in the same runtime."""

import dataclasses
import inspect
import os
import subprocess

__all__ = ["introspect", "mamba_layer_checkpoint_fields"]


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


def _git_commit(path):
    try:
        out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None

