"""The KV-cache planning vLLM's engine does from the model's layers, on
attribute-only stand-in layers: each layer's own ``get_kv_cache_spec``, the
release's grouping and page unification, the scheduler's KV-cache config.
Shared by the deployment probe and the engine driver (stdlib + vLLM only)."""

import dataclasses
import types

from .errors import Unsupported  # one refusal for the whole worker side

__all__ = ["Unsupported", "attention_spec", "mixer_class", "mamba_spec", "scheduler_groups", "spec_kind",
           "GROUPS_SOURCE"]


def attention_spec(vc, backend, num_kv_heads, head_size, sliding_window=None, draft=False,
                    replicated=False):
    from vllm.model_executor.layers.attention.attention import Attention

    try:
        from vllm.v1.attention.backend import AttentionType
    except ImportError:
        from vllm.attention.backends.abstract import AttentionType
    cc, mc = vc.cache_config, vc.model_config
    layer = types.SimpleNamespace(
        attn_type=AttentionType.DECODER, kv_cache_dtype=cc.cache_dtype, sliding_window=sliding_window,
        attn_backend=backend, num_kv_heads=num_kv_heads, head_size=head_size, head_size_v=head_size,
        kv_cache_torch_dtype=mc.dtype if cc.cache_dtype == "auto" else None)
    spec = Attention.get_kv_cache_spec(layer, vc)
    if hasattr(backend, "customize_spec"):
        spec = backend.customize_spec(spec)
    fields = {f.name for f in dataclasses.fields(spec)}
    if draft and "is_draft" in fields:
        spec = dataclasses.replace(spec, is_draft=True)
    if replicated and "dcp_sharded" in fields:
        spec = dataclasses.replace(spec, dcp_sharded=False)
    return spec


def mixer_class(kind):
    if kind == "gdn":
        from vllm.model_executor.layers.mamba.abstract import MambaBase
        try:
            from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as module
        except ImportError:
            from vllm.model_executor.models import qwen3_next as module
        found = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, MambaBase)
                 and c.__module__ == module.__name__]
        found.sort(key=lambda c: ("get_kv_cache_spec" not in vars(c), "GatedDeltaNet" not in c.__name__))
        if not found:
            raise Unsupported("no GatedDeltaNet layer class found in this release")
        return found[0]
    if kind == "mamba1":
        from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
        return MambaMixer
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    return MambaMixer2


def mamba_spec(vc, model_cls, mixer_cls):
    import torch.nn as nn

    layer = object.__new__(mixer_cls)
    nn.Module.__init__(layer)
    layer.vllm_config = vc
    layer.get_state_shape = lambda: model_cls.get_mamba_state_shape_from_config(vc)
    layer.get_state_dtype = lambda: model_cls.get_mamba_state_dtype_from_config(vc)
    layer._checkpoint_alignment = None  # FlashInfer GDN prefill is not active on the stand-in
    return mixer_cls.get_kv_cache_spec(layer, vc)


def spec_kind(spec):
    """A KV-cache spec in kvspec's group kinds (model.domain.GroupKind), or its class name."""
    name = type(spec).__name__
    if "Mamba" in name:
        return "mamba_" + str(getattr(spec, "mamba_cache_mode", "align"))
    if "SlidingWindow" in name:
        return "sliding_window"
    if "FullAttention" in name or "MLAAttention" in name:
        return "full_attention"
    return name


GROUPS_SOURCE = ""


def scheduler_groups(vc, specs, backend, memory=40 << 30):
    global GROUPS_SOURCE
    from vllm.v1.core import kv_cache_utils as utils

    try:
        from vllm.v1.core import kv_cache_planning as planning
    except ImportError:
        planning = utils
    try:
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout

        layouts = [[layout.name for layout in get_supported_kv_cache_layouts([backend])]]
        resolve_kv_cache_layout(vc, layouts, list(specs.values()))
    except ImportError:
        pass
    if hasattr(planning, "get_global_kv_cache_groups"):
        groups = planning.get_global_kv_cache_groups(vc, [specs])
        configs = planning.get_kv_cache_configs(vc, [specs], [memory], groups)
        GROUPS_SOURCE = (f"{planning.__name__}.get_global_kv_cache_groups, get_kv_cache_configs, "
                         "generate_scheduler_kv_cache_config")
    else:
        configs = planning.get_kv_cache_configs(vc, [specs], [memory])
        GROUPS_SOURCE = f"{planning.__name__}.get_kv_cache_configs, generate_scheduler_kv_cache_config"
    generate = getattr(planning, "generate_scheduler_kv_cache_config", None) or \
        utils.generate_scheduler_kv_cache_config
    sched_config = generate(configs)
    return list(sched_config.kv_cache_groups), sched_config
