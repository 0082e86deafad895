"""Deployment profiles: real model shapes times the knobs a server sets, and
what vLLM's scheduler builds for them.

A ``Profile`` is one deployment: a model (its published configuration
fields, from which the layer layout is read), a speculative setting (none,
EAGLE/EAGLE3, MTP with one or several modules, DSpark), prefix caching,
``prefix_match_unit``, block size, tensor and decode-context parallelism, a
KV connector.  Every number carries where it came from (``Source``): a
published configuration read through a cited copy, the defaults of the
``transformers`` config class (which equal the flagship checkpoint), or
recalled and not verified; a profile whose drafter geometry was never
published is marked hypothetical.

What the scheduler builds for a profile on a release (``Derivation``: the
KV-cache groups and block sizes, S and H, EAGLE groups, ``use_eagle``, hash
and prefill lookahead, partial hash hits) is derived by calling the
release's own configuration code (``subjects/deployment_probe.py``); where a
step cannot be called, ``derive`` here models it, and
``tests/integration/test_deployments.py`` holds the model to the code on the
releases where it can be called.  Every derivation lists its steps, each
``called`` (the vLLM function named) or ``modelled`` (kvspec's rule named).

The hash scheme is a dimension of its own: on 0.33+ an EAGLE-family drafter
with prefix caching gets lookahead block hashes by default (the EAGLE
branch of the registration bound is then not live), and legacy hashes with
``disable_lookahead_block_hashes`` or a KV connector without lookahead-hash
support; ``derive(..., legacy_hashes=True)`` is that variant.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from .errors import UnknownName
from .domain import CoordinatorConfig, GroupKind, HashScheme, KVCacheGroup

__all__ = ["Source", "ModelShape", "Drafter", "Profile", "Step", "DerivedGroup", "Derivation", "ConfigEra",
           "MODELS", "DRAFTERS", "CATALOG", "profile", "families", "config_era", "derive", "schemes_for",
           "from_probe", "FIRST_DERIVED"]


# -- where a number came from ---------------------------------------------------------

@attrs.frozen
class Source:
    """``kind``: ``config`` (the published config.json, read through the
    cited copy), ``defaults`` (the ``transformers`` config class's defaults,
    documented to equal the flagship checkpoint), ``recalled`` (from memory,
    not verified here), ``hypothetical`` (no published configuration: a
    geometry chosen to exercise a code path)."""

    kind: str
    where: str
    fields: str = "all"  # which fields it covers

    def text(self) -> str:
        return f"{self.kind} ({self.fields}): {self.where}"


_CONFIG, _DEFAULTS, _RECALLED, _HYPOTHETICAL = "config", "defaults", "recalled", "hypothetical"


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and value and all(isinstance(p, tuple) and len(p) == 2
                                                  and isinstance(p[0], str) for p in value):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


# -- models --------------------------------------------------------------------------

@attrs.frozen
class ModelShape:
    """A model as its published configuration describes it."""

    name: str
    family: str
    fields: tuple = attrs.field(converter=_freeze)  # the config.json fields used (frozen)
    sources: tuple[Source, ...]
    mixer: str | None = None  # "gdn", "mamba2", "mamba1" (None: attention only)

    @property
    def hf_config(self) -> dict[str, Any]:
        return _thaw(self.fields)

    @property
    def model_type(self) -> str:
        return self.hf_config["model_type"]

    def layers(self) -> tuple[str, ...]:
        """Each KV-cache-holding layer's kind, read from the published fields
        by the model type's own convention: ``full``, ``mamba`` or
        ``sliding:WINDOW`` (a Falcon-H1 block holds one attention and one
        Mamba layer)."""
        c = self.hf_config
        n = c["num_hidden_layers"]
        kind = c["model_type"]
        if kind == "qwen3_next":
            return tuple("full" if (i + 1) % c["full_attention_interval"] == 0 else "mamba" for i in range(n))
        if kind == "nemotron_h":
            return tuple({"M": "mamba", "*": "full"}[ch] for ch in c["hybrid_override_pattern"] if ch in "M*")
        if kind == "granitemoehybrid":
            return tuple("mamba" if t == "mamba" else "full" for t in c["layer_types"])
        if kind == "falcon_h1":
            return tuple(k for _ in range(n) for k in ("full", "mamba"))
        if kind == "jamba":
            return tuple("full" if i % c["attn_layer_period"] == c["attn_layer_offset"] else "mamba"
                         for i in range(n))
        if kind == "gpt_oss":
            return tuple(f"sliding:{c['sliding_window']}" if t == "sliding_attention" else "full"
                         for t in c["layer_types"])
        if kind == "gemma3_text":
            pattern = c["sliding_window_pattern"]
            return tuple("full" if (i + 1) % pattern == 0 else f"sliding:{c['sliding_window']}"
                         for i in range(n))
        if kind == "llama":
            return tuple("full" for _ in range(n))
        raise ValueError(f"no layer-layout rule for model type {kind!r}")

    @property
    def hybrid(self) -> bool:
        return self.mixer is not None

    @property
    def num_kv_heads(self) -> int:
        return self.hf_config["num_key_value_heads"]

    @property
    def head_dim(self) -> int:
        c = self.hf_config
        return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]

    @property
    def citation(self) -> str:
        return "; ".join(s.text() for s in self.sources)


def _model(name: str, family: str, sources: tuple[Source, ...], mixer: str | None = None,
           **fields: Any) -> ModelShape:
    return ModelShape(name, family, fields, sources, mixer)


_QWEN3_NEXT_SOURCES = (
    Source(_CONFIG, "the published config of Qwen/Qwen3-Next-80B-A3B-Instruct, as quoted in a document titled "
           "'Qwen/Qwen3-Next-80B-A3B-Instruct ## model config' (search tool, code corpus); the transformers "
           "class zucchini-nlp/transformers src/transformers/models/qwen3_next/configuration_qwen3_next.py "
           "documents its defaults as that checkpoint", "layout, attention, GDN heads and dims, conv kernel"),
    Source(_RECALLED, "num_nextn_predict_layers = 1 (vLLM's qwen3_next_mtp reads n_predict from it; absent means "
           "1): not read", "MTP modules"),
)

MODELS: dict[str, ModelShape] = {m.name: m for m in (
    _model("Qwen3-Next-80B-A3B-Instruct", "Qwen3-Next", _QWEN3_NEXT_SOURCES, "gdn",
           architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", num_hidden_layers=48,
           full_attention_interval=4, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2,
           head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
           linear_value_head_dim=128, linear_conv_kernel_dim=4, intermediate_size=5120,
           moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=512,
           num_experts_per_tok=10, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
           partial_rotary_factor=0.25, rms_norm_eps=1e-6, rope_theta=10000000, vocab_size=151936,
           max_position_embeddings=262144, torch_dtype="bfloat16", tie_word_embeddings=False,
           num_nextn_predict_layers=1),
    _model("NVIDIA-Nemotron-Nano-9B-v2", "Nemotron-H",
           (Source(_CONFIG, "nvidia/NVIDIA-Nemotron-Nano-9B-v2 config.json as reproduced by several independent "
                   "fixtures (search tool, code corpus; unnamed excerpts, kvspec research note "
                   "/tmp/kvspec-research/deployments.md section 4)"),),
           "mamba2",
           architectures=["NemotronHForCausalLM"], model_type="nemotron_h", num_hidden_layers=56,
           hybrid_override_pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
           hidden_size=4480, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
           intermediate_size=15680, mamba_num_heads=128, mamba_head_dim=80, ssm_state_size=128, n_groups=8,
           conv_kernel=4, expand=2, chunk_size=128, vocab_size=131072, max_position_embeddings=131072,
           torch_dtype="bfloat16", mlp_hidden_act="relu2", mamba_hidden_act="silu", use_conv_bias=True,
           rms_norm_eps=1e-5, layer_norm_epsilon=1e-5, attention_bias=False, mlp_bias=False, use_bias=False,
           residual_in_fp32=False, tie_word_embeddings=False, time_step_limit=[0.0, 1e30]),
    _model("granite-4.0-h-small", "Granite-4.0-H",
           (Source(_CONFIG, "an excerpt quoting ibm-granite/granite-4.0-h-small's config.json (search tool, code "
                   "corpus, via the research note)", "40 layers, 36 mamba + 4 attention, hidden 4096, 32 heads, "
                   "kv 8, d_state 128, d_conv 4, expand 2"),
            Source(_RECALLED, "attention at layers 5, 15, 25, 35; mamba_n_heads 128, mamba_d_head 64, "
                   "mamba_n_groups 1", "layer positions, Mamba heads")),
           "mamba2",
           architectures=["GraniteMoeHybridForCausalLM"], model_type="granitemoehybrid", num_hidden_layers=40,
           layer_types=["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)],
           mamba_d_conv=4, mamba_d_head=64, mamba_d_state=128, mamba_expand=2, mamba_n_groups=1,
           mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False, position_embedding_type="nope",
           max_position_embeddings=131072, torch_dtype="bfloat16", vocab_size=100352,
           tie_word_embeddings=True, attention_multiplier=0.0078125, embedding_multiplier=12,
           logits_scaling=8, residual_multiplier=0.22, normalization_function="rmsnorm", rms_norm_eps=1e-5,
           num_experts_per_tok=10, num_local_experts=72, shared_intermediate_size=1536, hidden_size=4096,
           num_attention_heads=32, num_key_value_heads=8, mamba_n_heads=128, intermediate_size=768),
    _model("Falcon-H1-7B-Instruct", "Falcon-H1",
           (Source(_CONFIG, "tiiuae/Falcon-H1-7B config.json as reproduced by third-party fixtures (search "
                   "tool, code corpus; unnamed excerpts, via the research note)"),),
           "mamba2",
           architectures=["FalconH1ForCausalLM"], model_type="falcon_h1", hidden_size=3072, num_hidden_layers=44,
           num_attention_heads=12, num_key_value_heads=2, head_dim=128, intermediate_size=12288,
           vocab_size=130048, mamba_d_state=256, mamba_n_groups=1, mamba_n_heads=24, mamba_d_head=128,
           mamba_d_ssm=3072, mamba_expand=2, mamba_d_conv=4, mamba_chunk_size=128,
           max_position_embeddings=262144, torch_dtype="bfloat16", tie_word_embeddings=False,
           mamba_conv_bias=True, mamba_proj_bias=False, mamba_rms_norm=False, mamba_norm_before_gate=False),
    _model("AI21-Jamba-1.5-Mini", "Jamba",
           (Source(_DEFAULTS, "transformers' JambaConfig defaults (the v0.1 geometry)", "v0.1 geometry"),
            Source(_RECALLED, "that Jamba 1.5 Mini keeps the v0.1 geometry", "1.5 Mini")),
           "mamba1",
           architectures=["JambaForCausalLM"], model_type="jamba", hidden_size=4096, num_hidden_layers=32,
           num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, attn_layer_period=8,
           attn_layer_offset=4, expert_layer_period=2, expert_layer_offset=1, num_experts=16,
           num_experts_per_tok=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=256,
           mamba_conv_bias=True, mamba_proj_bias=False, vocab_size=65536, max_position_embeddings=262144,
           torch_dtype="bfloat16", tie_word_embeddings=False, use_mamba_kernels=True),
    _model("gpt-oss-20b", "gpt-oss",
           (Source(_CONFIG, "openai/gpt-oss-20b config.json as summarised by ParagEkbote/hf-model-inspector "
                   "model_inspection_report.md and EchoCog/gpt-oss-20b docs/gpt-oss-20b-architecture.md "
                   "(24 layers alternating sliding/full from sliding, window 128, 64 heads, kv 8, head_dim 64)"),),
           architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=2880, num_hidden_layers=24,
           layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(24)],
           num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128,
           num_local_experts=32, num_experts_per_tok=4, experts_per_token=4, intermediate_size=2880,
           vocab_size=201088, max_position_embeddings=131072, rope_theta=150000,
           rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096},
           torch_dtype="bfloat16", tie_word_embeddings=False, attention_bias=True, swiglu_limit=7.0,
           rms_norm_eps=1e-5, initial_context_length=4096),
    _model("gpt-oss-120b", "gpt-oss",
           (Source(_DEFAULTS, "transformers' GptOssConfig defaults (the 120b geometry: 36 layers, 128 experts)"),),
           architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=2880, num_hidden_layers=36,
           layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)],
           num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128,
           num_local_experts=128, num_experts_per_tok=4, experts_per_token=4, intermediate_size=2880,
           vocab_size=201088, max_position_embeddings=131072, rope_theta=150000,
           rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096},
           torch_dtype="bfloat16", tie_word_embeddings=False, attention_bias=True, swiglu_limit=7.0,
           rms_norm_eps=1e-5, initial_context_length=4096),
    _model("gemma-3-27b-it (text)", "Gemma 3",
           (Source(_CONFIG, "google/gemma-3-27b text config as quoted by a third-party excerpt (search tool, code "
                   "corpus: num_layers 62, kv 16, head_dim 128, sliding_window 1024)", "sizes and window"),
            Source(_RECALLED, "sliding_window_pattern 6 (every 6th layer global), checked on Gemma 3 4B only",
                   "the 5:1 pattern")),
           architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=5376, num_hidden_layers=62,
           num_attention_heads=32, num_key_value_heads=16, head_dim=128, intermediate_size=21504,
           sliding_window=1024, sliding_window_pattern=6, query_pre_attn_scalar=168, rope_theta=1000000.0,
           rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
           max_position_embeddings=131072, vocab_size=262208, torch_dtype="bfloat16"),
    _model("Llama-3.1-8B-Instruct", "Llama",
           (Source(_RECALLED, "meta-llama/Llama-3.1-8B-Instruct: 32 layers, 32 heads, kv 8, head_dim 128"),),
           architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, num_hidden_layers=32,
           num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
           vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
           rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
           rms_norm_eps=1e-5, torch_dtype="bfloat16", tie_word_embeddings=False),
)}


# -- drafters ------------------------------------------------------------------------

@attrs.frozen
class Drafter:
    """A speculative setting.  ``fields``: the drafter's own config.json
    (EAGLE/EAGLE3/DSpark); an MTP drafter is the target's own modules."""

    name: str
    method: str  # vLLM's speculative method name
    num_speculative_tokens: int
    sources: tuple[Source, ...] = ()
    fields: tuple = attrs.field(default=(), converter=_freeze)
    # MTP: modules (num_nextn_predict_layers) overriding the model's own.
    mtp_modules: int | None = None

    @property
    def hf_config(self) -> dict[str, Any] | None:
        return _thaw(self.fields) if self.fields else None

    @property
    def hypothetical(self) -> bool:
        return any(s.kind == _HYPOTHETICAL for s in self.sources)

    def draft_geometry(self, target: ModelShape) -> tuple[int, int, int]:
        """(attention layers, kv heads, head dim) the drafter adds."""
        if self.method == "mtp":
            modules = self.mtp_modules or target.hf_config.get("num_nextn_predict_layers") or 1
            return modules, target.num_kv_heads, target.head_dim
        c = self.hf_config or {}
        heads = c.get("num_key_value_heads", target.num_kv_heads)
        head = c.get("head_dim") or (c["hidden_size"] // c["num_attention_heads"] if c else target.head_dim)
        return c.get("num_hidden_layers", 1), heads, head


def _eagle3(name: str, sources: tuple[Source, ...], k: int = 3, method: str = "eagle3", **fields: Any) -> Drafter:
    base = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                draft_vocab_size=32000, rms_norm_eps=1e-5, torch_dtype="bfloat16", tie_word_embeddings=False)
    base.update(fields)
    return Drafter(name, method, k, sources, base)


_HYP_DRAFTER = ("no published drafter configuration was read; the geometry is chosen to exercise vLLM's "
                "grouping (a drafter whose per-token KV page differs from the target's)")

DRAFTERS: dict[str, Drafter] = {d.name: d for d in (
    Drafter("mtp k=2", "mtp", 2, (Source(_RECALLED, "the model's own MTP module (one module unless "
                                        "num_nextn_predict_layers says more)"),)),
    Drafter("3-module mtp k=3", "mtp", 3,
            (Source(_HYPOTHETICAL, "num_nextn_predict_layers = 3 on a model published with one MTP module: "
                    "multi-module MTP (vLLM's use_multi_module_mtp) on a Mamba hybrid"),), mtp_modules=3),
    _eagle3("eagle3 llama-3.1-8b", (Source(_RECALLED, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: one Llama layer, "
                                          "32 heads, kv 8, head_dim 128 (the target's geometry)"),),
            hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
            vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0),
    _eagle3("eagle3 qwen3-next kv8x128",
            (Source(_HYPOTHETICAL, _HYP_DRAFTER + "; an EAGLE3 drafter for this family is published "
                    "(thoughtworks/Qwen3-Coder-Next-Eagle3, LlamaForCausalLMEagle3) but its attention geometry "
                    "was not read"),),
            hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
            intermediate_size=6144, vocab_size=151936, max_position_embeddings=262144, rope_theta=10000000.0),
    _eagle3("eagle3 nemotron llama-geometry",
            (Source(_HYPOTHETICAL, _HYP_DRAFTER.split(";")[0] + "; Llama geometry (kv 8 x 128, the target's "
                    "attention page)"),),
            hidden_size=4480, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
            intermediate_size=15680, vocab_size=131072, max_position_embeddings=131072, rope_theta=10000.0),
    _eagle3("eagle3 gpt-oss kv8x64",
            (Source(_HYPOTHETICAL, _HYP_DRAFTER.split(";")[0] + "; kv 8 x 64, the target's geometry"),),
            hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
            intermediate_size=17280, vocab_size=201088, max_position_embeddings=131072, rope_theta=150000.0),
    _eagle3("dspark qwen3-next", (Source(_HYPOTHETICAL, "a DSpark drafter (vLLM method 'dspark'); no published "
                                        "drafter configuration was read: the EAGLE3-shaped kv 2 x 256 stand-in"),),
            k=3, method="dspark", hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
            intermediate_size=6144, vocab_size=151936, max_position_embeddings=262144, rope_theta=10000000.0),
)}


# -- profiles ------------------------------------------------------------------------

@attrs.frozen
class Profile:
    name: str
    model: ModelShape
    drafter: Drafter | None = None
    prefix_caching: bool = True
    prefix_match_unit: int | None = None
    block_size: int | None = None  # --block-size (None: the backend's and the hybrid alignment's)
    tp: int = 1
    dcp: int = 1
    kv_connector: str | None = None
    max_model_len: int = 32768
    note: str = ""

    @property
    def family(self) -> str:
        return self.model.family

    @property
    def hypothetical(self) -> bool:
        return self.drafter is not None and self.drafter.hypothetical

    @property
    def provenance(self) -> str:
        kinds = {s.kind for s in self.model.sources} | ({s.kind for s in self.drafter.sources}
                                                        if self.drafter else set())
        for kind in (_HYPOTHETICAL, _RECALLED, _DEFAULTS, _CONFIG):
            if kind in kinds:
                return kind
        return _CONFIG

    def knobs(self) -> str:
        parts = [f"{self.drafter.method} k={self.drafter.num_speculative_tokens}" if self.drafter else "no drafter"]
        if not self.prefix_caching:
            parts.append("prefix caching off")
        if self.prefix_match_unit:
            parts.append(f"prefix_match_unit={self.prefix_match_unit}")
        if self.block_size:
            parts.append(f"block_size={self.block_size}")
        if self.tp > 1 or self.dcp > 1:
            parts.append(f"TP{self.tp} DCP{self.dcp}")
        if self.kv_connector:
            parts.append(f"KV connector {self.kv_connector}")
        return ", ".join(parts)

    def describe(self) -> str:
        flag = " [hypothetical drafter]" if self.hypothetical else ""
        return f"{self.name}: {self.model.name} ({self.family}), {self.knobs()}{flag}"

    def to_probe(self) -> dict[str, Any]:
        """The plain-JSON form ``subjects/deployment_probe.py`` reads."""
        drafter = None
        if self.drafter is not None:
            layers, heads, head = self.drafter.draft_geometry(self.model)
            drafter = {"method": self.drafter.method, "num_speculative_tokens": self.drafter.num_speculative_tokens,
                       "hf_config": self.drafter.hf_config, "draft_layers": layers,
                       "num_kv_heads": heads if self.drafter.hf_config else None,
                       "head_dim": head if self.drafter.hf_config else None}
        config = self.model.hf_config
        if self.drafter is not None and self.drafter.mtp_modules:
            config = {**config, "num_nextn_predict_layers": self.drafter.mtp_modules}
        return {"name": self.name,
                "model": {"hf_config": config, "layers": [_probe_layer(k) for k in self.model.layers()],
                          "mixer": self.model.mixer},
                "drafter": drafter,
                "knobs": {"prefix_caching": self.prefix_caching, "prefix_match_unit": self.prefix_match_unit,
                          "block_size": self.block_size, "tp": self.tp, "dcp": self.dcp,
                          "kv_connector": self.kv_connector, "max_model_len": self.max_model_len,
                          # DSpark and DFlash run on vLLM's V2 model runner only.
                          "v2_model_runner": bool(self.drafter and self.drafter.method in ("dspark", "dflash"))}}


def _probe_layer(kind: str) -> Any:
    if kind.startswith("sliding:"):
        return ["sliding", int(kind.split(":")[1])]
    return kind


def _p(name: str, model: str, drafter: str | None = None, **knobs: Any) -> Profile:
    return Profile(name, MODELS[model], DRAFTERS[drafter] if drafter else None, **knobs)


CATALOG: tuple[Profile, ...] = (
    _p("qwen3-next", "Qwen3-Next-80B-A3B-Instruct"),
    _p("qwen3-next+mtp", "Qwen3-Next-80B-A3B-Instruct", "mtp k=2"),
    _p("qwen3-next+mtp+pmu16", "Qwen3-Next-80B-A3B-Instruct", "mtp k=2", prefix_match_unit=16,
       note="prefix_match_unit below the Mamba block turns partial hash hits on"),
    _p("qwen3-next+eagle3-kv8+pmu16", "Qwen3-Next-80B-A3B-Instruct", "eagle3 qwen3-next kv8x128",
       prefix_match_unit=16, note="a drafter page twice the target's: the EAGLE group's block is half of S"),
    _p("qwen3-next+mtp3x3+pmu16", "Qwen3-Next-80B-A3B-Instruct", "3-module mtp k=3", prefix_match_unit=16,
       note="multi-module MTP: num_prefill_lookahead 3, two reprefillable tokens"),
    _p("qwen3-next+mtp+tp4dcp2", "Qwen3-Next-80B-A3B-Instruct", "mtp k=2", tp=4, dcp=2,
       note="DCP > 1: partial hash hits with the Mamba block equal to the hash block"),
    _p("qwen3-next+dspark", "Qwen3-Next-80B-A3B-Instruct", "dspark qwen3-next"),
    _p("qwen3-next+mtp+connector", "Qwen3-Next-80B-A3B-Instruct", "mtp k=2", kv_connector="OffloadingConnector",
       note="a KV connector: legacy hashes where the connector has no lookahead-hash support"),
    _p("nemotron-nano-9b-v2", "NVIDIA-Nemotron-Nano-9B-v2"),
    _p("nemotron-nano-9b-v2+pmu16", "NVIDIA-Nemotron-Nano-9B-v2", prefix_match_unit=16),
    _p("nemotron-nano-9b-v2+eagle3", "NVIDIA-Nemotron-Nano-9B-v2", "eagle3 nemotron llama-geometry"),
    _p("granite-4.0-h-small", "granite-4.0-h-small"),
    _p("falcon-h1-7b", "Falcon-H1-7B-Instruct"),
    _p("jamba-1.5-mini", "AI21-Jamba-1.5-Mini"),
    _p("gpt-oss-20b", "gpt-oss-20b"),
    _p("gpt-oss-120b+eagle3", "gpt-oss-120b", "eagle3 gpt-oss kv8x64"),
    _p("gemma-3-27b", "gemma-3-27b-it (text)"),
    _p("llama-3.1-8b+eagle3", "Llama-3.1-8B-Instruct", "eagle3 llama-3.1-8b"),
)

_BY_NAME = {p.name: p for p in CATALOG}


def profile(name: str) -> Profile:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownName(f"unknown deployment profile {name!r}; known: {', '.join(_BY_NAME)}") from None


def families() -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.family for p in CATALOG))


# -- what the scheduler builds -------------------------------------------------------

@attrs.frozen
class Step:
    """One step of a derivation: ``called`` (``source`` names the vLLM
    function run) or ``modelled`` (``source`` names kvspec's rule or stand-in)."""

    step: str
    how: str
    source: str
    value: Any = None
    note: str = ""

    def text(self) -> str:
        return f"{self.step}: {self.how} ({self.source})" + (f" -- {self.note}" if self.note else "")

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class DerivedGroup:
    """A distinct KV-cache group spec (groups with equal specs behave alike
    in registration and lookup; ``count`` says how many vLLM built)."""

    kind: str  # full_attention, sliding_window, mamba_align, mamba_none
    block_size: int  # the group manager's block (attention scaled by DCP)
    eagle: bool  # in the coordinator's eagle_group_ids
    sliding_window: int = 0
    count: int | None = None


@attrs.frozen
class Derivation:
    profile: str
    release: str
    legacy_hashes: bool  # asked for disable_lookahead_block_hashes
    groups: tuple[DerivedGroup, ...] = attrs.field(converter=tuple)
    coordinator: str  # HybridKVCacheCoordinator, UnitaryKVCacheCoordinator, KVCacheCoordinatorNoPrefixCache
    scheduler_block_size: int
    hash_block_size: int
    partial_hash_hits: bool
    use_eagle: bool  # what the scheduler passes to KVCacheManager
    num_hash_lookahead_tokens: int
    num_prefill_lookahead: int
    dcp: int = 1
    steps: tuple[Step, ...] = attrs.field(default=(), converter=tuple)
    # vLLM rejects the configuration (the rest is then not meaningful).
    error: str | None = None

    @property
    def hash_scheme(self) -> str:
        return "lookahead" if self.num_hash_lookahead_tokens else "legacy"

    @property
    def num_reprefillable_tokens(self) -> int:
        return max(0, self.num_prefill_lookahead - 1)

    @property
    def eagle_branch_live(self) -> bool:
        """Whether a group takes the EAGLE branch of the registration bound."""
        return self.use_eagle and any(g.eagle for g in self.groups)

    @property
    def called(self) -> tuple[str, ...]:
        return tuple(s.step for s in self.steps if s.how == "called")

    @property
    def modelled(self) -> tuple[str, ...]:
        return tuple(s.step for s in self.steps if s.how == "modelled")

    @property
    def in_scope(self) -> str | None:
        """Why the registration boundary kvspec models (the hybrid
        coordinator's ``cache_blocks``) does not run here, or None."""
        if self.error:
            return f"vLLM rejects this configuration ({self.error})"
        if self.coordinator != "HybridKVCacheCoordinator":
            return f"{self.coordinator}: not the hybrid coordinator"
        if any(g.kind not in ("full_attention", "sliding_window", "mamba_align") for g in self.groups):
            return "a group kind kvspec does not model: " + ", ".join(sorted({g.kind for g in self.groups}))
        return None

    def coordinator_config(self) -> CoordinatorConfig | None:
        """The configuration kvspec's model and worker take (groups with equal
        specs collapsed), or None when the hybrid coordinator does not run."""
        if self.in_scope is not None:
            return None
        drop = self.use_eagle or bool(self.num_hash_lookahead_tokens)
        groups = tuple(KVCacheGroup(GroupKind(g.kind), g.block_size, eagle=g.eagle and drop,
                                    sliding_window=g.sliding_window) for g in self.groups)
        if len(groups) < 2:
            return None
        return CoordinatorConfig(
            groups=groups, scheduler_block_size=self.scheduler_block_size, hash_block_size=self.hash_block_size,
            num_prefill_lookahead=self.num_prefill_lookahead, dcp_world_size=self.dcp,
            hash_scheme=HashScheme.LOOKAHEAD if self.num_hash_lookahead_tokens else HashScheme.LEGACY)

    def summary(self) -> str:
        if self.error:
            return f"rejected by vLLM: {self.error}"
        groups = " + ".join(f"{g.count or '?'}x{g.kind}[{g.block_size}{', EAGLE' if g.eagle else ''}]"
                            for g in self.groups)
        return (f"{groups}; S={self.scheduler_block_size} H={self.hash_block_size} "
                f"partial={'on' if self.partial_hash_hits else 'off'} use_eagle={self.use_eagle} "
                f"hash lookahead={self.num_hash_lookahead_tokens} prefill lookahead={self.num_prefill_lookahead}")

    def comparable(self) -> dict[str, Any]:
        """What the model is held to against the release's code."""
        return {"groups": sorted((g.kind, g.block_size, g.eagle, g.sliding_window) for g in self.groups),
                "coordinator": self.coordinator, "S": self.scheduler_block_size, "H": self.hash_block_size,
                "partial": self.partial_hash_hits, "use_eagle": self.use_eagle,
                "hash_lookahead": self.num_hash_lookahead_tokens, "prefill_lookahead": self.num_prefill_lookahead,
                "error": bool(self.error)}

    def because_not_called(self, why: str) -> "Derivation":
        """This (modelled) derivation, saying why the release's code was not used."""
        return attrs.evolve(self, steps=(Step("release_code", "modelled", "kvspec: model/deployments.derive",
                                              None, f"the release's own code could not derive it: {why}"),
                                         *self.steps))

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d.update(hash_scheme=self.hash_scheme, eagle_branch_live=self.eagle_branch_live,
                 called=list(self.called), modelled=list(self.modelled), summary=self.summary())
        return d


# -- the model of vLLM's configuration code, per release ------------------------------

@attrs.frozen
class ConfigEra:
    """How a range of releases' configuration code decides (see ``derive``)."""

    low: str
    high: str
    default_block: int  # CacheConfig.DEFAULT_BLOCK_SIZE: the backend's preferred and the hybrid alignment
    eagle_flags: str  # "all": none flagged, the coordinator flags every group; "trailing_mtp"; "is_draft"
    drop_methods: tuple[str, ...]  # methods whose block drop is on
    lookahead_hashes: bool  # VllmConfig.num_hash_lookahead_tokens exists
    connector_lookahead: str  # "none": any connector means legacy hashes; "class": the connector says
    partial_under_dcp: bool  # partial hash hits possible with DCP > 1 (Mamba block >= H)


_USE_EAGLE = ("eagle", "eagle3", "mtp", "dflash", "dspark")
_DROP = ("eagle", "eagle3", "mtp")
# Connectors whose lookahead-hash support was read from the release (0.34's
# supports_lookahead_block_hashes); any other connector is not modelled.
CONNECTOR_LOOKAHEAD = {"OffloadingConnector": True}

FIRST_DERIVED = "0.28.0"
ERAS: tuple[ConfigEra, ...] = (
    ConfigEra("0.28.0", "0.28.0", 16, "all", _USE_EAGLE, False, "none", False),
    ConfigEra("0.29.0", "0.30.0", 16, "all", _USE_EAGLE, False, "none", True),
    ConfigEra("0.31.0", "0.32.0", 16, "trailing_mtp", _USE_EAGLE, False, "none", True),
    ConfigEra("0.33.0", "0.33.0", 16, "is_draft", _DROP, True, "none", True),
    ConfigEra("0.34.0", "0.34.0", 64, "is_draft", _DROP, True, "class", True),
)


def config_era(release: str) -> ConfigEra | None:
    """The era of a release's configuration code (a newer release than kvspec
    has seen is held to the newest; before 0.28, None: not derived)."""
    import re

    from .about import release_key

    match = re.match(r"^(\d+\.\d+\.\d+)", release or "")  # a tree's 0.35.0.dev12+g... is held to 0.35.0
    try:
        key = release_key(match.group(1) if match else release)
    except (ValueError, TypeError):
        return None
    if key < release_key(FIRST_DERIVED):
        return None
    for era in ERAS:
        if release_key(era.low) <= key <= release_key(era.high):
            return era
    return ERAS[-1]


def schemes_for(p: Profile, release: str) -> tuple[bool, ...]:
    """The hash schemes a profile is derived under on a release: its default,
    and legacy hashes (``disable_lookahead_block_hashes``) where the release has
    lookahead hashes and the drafter would get them."""
    era = config_era(release)
    if p.drafter is not None and era is not None and era.lookahead_hashes and p.drafter.method in era.drop_methods:
        return (False, True)
    return (False,)


def _M(name: str) -> str:
    return f"kvspec: model/deployments.{name}"


def mamba_page_bytes(model: ModelShape, tp: int, spec_tokens: int) -> int:
    """The Mamba layer's state bytes per block (every state of one layer),
    from the published fields: vLLM's state-shape calculators' shapes (conv
    states hold ``kernel - 1 + num_speculative_tokens`` columns) times the
    state dtypes (Nemotron-H keeps SSM states in float32)."""
    c = model.hf_config
    if model.mixer == "gdn":
        conv_dim = (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
                    + c["linear_num_value_heads"] * c["linear_value_head_dim"]) // tp
        conv = conv_dim * (c["linear_conv_kernel_dim"] - 1 + spec_tokens)
        ssm = (c["linear_num_value_heads"] // tp) * c["linear_value_head_dim"] * c["linear_key_head_dim"]
        return 2 * conv + 2 * ssm
    if model.mixer == "mamba1":
        inner = c["mamba_expand"] * c["hidden_size"] // tp
        return 2 * inner * (c["mamba_d_conv"] - 1) + 2 * inner * c["mamba_d_state"]
    if model.model_type == "nemotron_h":
        heads, head, state, groups, kernel = (c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"],
                                              c["n_groups"], c["conv_kernel"])
        inner, ssm_bytes = heads * head, 4
    else:
        heads, head, state, groups, kernel = (c["mamba_n_heads"], c["mamba_d_head"], c["mamba_d_state"],
                                              c["mamba_n_groups"], c["mamba_d_conv"])
        inner, ssm_bytes = c.get("mamba_d_ssm") or heads * head, 2
    conv = (inner + 2 * groups * state) // tp * (kernel - 1 + spec_tokens)
    return 2 * conv + ssm_bytes * (heads // tp) * head * state


def attention_bytes_per_token(kv_heads: int, head_dim: int, tp: int) -> int:
    """K and V, bfloat16, the kv heads one rank holds."""
    return 2 * max(1, kv_heads // tp) * head_dim * 2


def derive(p: Profile, release: str, *, legacy_hashes: bool = False) -> Derivation:
    """What vLLM's scheduler builds for profile ``p`` on ``release``,
    modelled (every step ``modelled``); ``subjects/drivers/deployments.py``
    calls the release's own code instead wherever it runs."""
    era = config_era(release)
    steps: list[Step] = []
    common = dict(profile=p.name, release=release, legacy_hashes=legacy_hashes, dcp=p.dcp)
    if era is None:
        return Derivation(groups=(), coordinator="", scheduler_block_size=0, hash_block_size=0,
                          partial_hash_hits=False, use_eagle=False, num_hash_lookahead_tokens=0,
                          num_prefill_lookahead=0, error=f"kvspec derives deployments from {FIRST_DERIVED} on",
                          **common)
    drafter, model = p.drafter, p.model
    k = drafter.num_speculative_tokens if drafter else 0
    base = era.default_block
    target_bpt = attention_bytes_per_token(model.num_kv_heads, model.head_dim, p.tp)
    if p.block_size is not None:
        block = p.block_size
    elif model.hybrid:
        page = mamba_page_bytes(model, p.tp, k)
        block = base * math.ceil(page / (base * target_bpt))
    else:
        block = base
    steps.append(Step("attention_block", "modelled", _M("mamba_page_bytes, attention_bytes_per_token"),
                      {"block_size": block},
                      "the backend's preferred block (CacheConfig.DEFAULT_BLOCK_SIZE); a hybrid raises it to the "
                      f"Mamba page in multiples of {base}"))
    steps.append(Step("layer_layout", "modelled", _M("ModelShape.layers"), {"layers": len(model.layers())}))
    # Layer specs: (kind, block, window, bytes per token, is_draft).
    specs: list[tuple[str, int, int, int, bool]] = []
    mamba_kind = "mamba_align" if p.prefix_caching else "mamba_none"
    for layer in model.layers():
        if layer == "mamba":
            specs.append((mamba_kind, block, 0, 0, False))
        elif layer == "full":
            specs.append(("full_attention", block, 0, target_bpt, False))
        else:
            specs.append(("sliding_window", block, int(layer.split(":")[1]), target_bpt, False))
    method = drafter.method if drafter else None
    if drafter is not None and method not in ("ngram", "suffix"):
        layers, heads, head = drafter.draft_geometry(model)
        draft_bpt = attention_bytes_per_token(heads, head, p.tp)
        specs += [("full_attention", block, 0, draft_bpt, True)] * layers
        steps.append(Step("drafter_layers", "modelled", _M("Drafter.draft_geometry"),
                          {"layers": layers, "bytes_per_token": draft_bpt}))
    # Page unification: smaller attention pages scale their block up to the
    # largest page; Mamba pages are padded (their block stays).
    largest = max((blk * bpt for _, blk, _, bpt, _ in specs if bpt), default=0)
    unified = []
    for kind, blk, window, bpt, draft in specs:
        if bpt and largest % (blk * bpt) == 0:
            blk = blk * (largest // (blk * bpt))
        unified.append((kind, blk, window, bpt, draft))
    # A drafter layer whose spec equals a target layer's joins its group.
    distinct: dict[tuple, dict[str, Any]] = {}
    for kind, blk, window, bpt, draft in unified:
        key = (kind, blk, window, bpt)
        entry = distinct.setdefault(key, {"draft": False})
        entry["draft"] = entry["draft"] or draft
    steps.append(Step("groups", "modelled", _M("derive (page unification, equal specs share a group)"),
                      sorted([k[0], k[1]] for k in distinct), "group counts are not modelled"))
    # Speculative decoding: the prefill lookahead, the block drop, the hash lookahead.
    use_eagle_method = method in _USE_EAGLE
    modules = drafter.draft_geometry(model)[0] if method == "mtp" else 1
    multi_mtp = method == "mtp" and min(modules, k) > 1
    npl = (k if multi_mtp else 1) if use_eagle_method else 0
    drop = method in era.drop_methods
    nhl = 0
    if era.lookahead_hashes and drop and not legacy_hashes and p.prefix_caching:
        nhl = npl
        if p.kv_connector is not None:
            if era.connector_lookahead == "none":
                nhl = 0
            elif p.kv_connector in CONNECTOR_LOOKAHEAD:
                nhl = npl if CONNECTOR_LOOKAHEAD[p.kv_connector] else 0
            else:
                raise ValueError(f"kvspec has not read whether {p.kv_connector} supports lookahead hashes")
    use_eagle = drop and not nhl
    steps.append(Step("speculative", "modelled", _M("derive (the release era's method table)"),
                      {"num_prefill_lookahead": npl, "num_hash_lookahead_tokens": nhl, "block_drop": drop}))
    steps.append(Step("scheduler_use_eagle", "modelled", _M("derive"), {"use_eagle": use_eagle}))
    # Groups as the coordinator sees them: block scaled by DCP for attention.
    groups = []
    for (kind, blk, window, bpt), entry in distinct.items():
        effective = blk * p.dcp if kind in ("full_attention", "sliding_window") else blk
        groups.append([kind, effective, window, entry["draft"]])
    flagged = []
    if drop:
        if era.eagle_flags == "is_draft":
            flagged = [g[3] for g in groups]
        elif era.eagle_flags == "trailing_mtp" and method == "mtp":
            flagged = [g[3] for g in groups]
    if use_eagle and not any(flagged):
        flagged = [True for _ in groups]  # the coordinator flags every group
    if not flagged:
        flagged = [False for _ in groups]
    derived_groups = tuple(DerivedGroup(kind, blk, eagle, window) for (kind, blk, window, _), eagle
                           in zip(groups, flagged))
    blocks = [g.block_size for g in derived_groups]
    coordinator = ("KVCacheCoordinatorNoPrefixCache" if not p.prefix_caching
                   else "UnitaryKVCacheCoordinator" if len(distinct) == 1 else "HybridKVCacheCoordinator")
    error = None
    S = math.lcm(*blocks)
    if len(distinct) == 1:
        H = S
        if p.prefix_match_unit not in (None, S):
            error = f"prefix_match_unit {p.prefix_match_unit} differs from the one group's block {S}"
    elif p.prefix_match_unit:
        H = p.prefix_match_unit
    else:
        H = math.gcd(*blocks)
    if error is None and any(b % H for b in blocks):
        error = f"a group block is not a multiple of the hash block {H}"
    steps.append(Step("block_sizes", "modelled", _M("derive (S = lcm, H = prefix_match_unit or gcd)"),
                      {"scheduler_block_size": S, "hash_block_size": H}))
    partial = False
    if coordinator == "HybridKVCacheCoordinator" and error is None:
        has_mamba = any(g.kind == "mamba_align" and (g.block_size > H if p.dcp == 1 else g.block_size >= H)
                        for g in derived_groups)
        if p.dcp > 1 and not era.partial_under_dcp:
            has_mamba = False
        compatible = all(g.kind != "sliding_window" or g.block_size == H for g in derived_groups)
        partial = has_mamba and compatible
    steps.append(Step("manager", "modelled", _M("derive (model.domain.derive_partial_hash_hits' rule)"),
                      {"partial_hash_hits": partial}))
    counted = _count_groups(model, derived_groups, specs_layers=unified, dcp=p.dcp)
    return Derivation(groups=counted, coordinator=coordinator, scheduler_block_size=S, hash_block_size=H,
                      partial_hash_hits=partial, use_eagle=use_eagle, num_hash_lookahead_tokens=nhl,
                      num_prefill_lookahead=npl, steps=tuple(steps), error=error, **common)


def _count_groups(model: ModelShape, groups: tuple[DerivedGroup, ...], specs_layers: list, dcp: int
                  ) -> tuple[DerivedGroup, ...]:
    """Groups carry no count in the model (vLLM's bucketing is not modelled)."""
    return groups


def from_probe(p: Profile, release: str, legacy_hashes: bool, answer: dict[str, Any],
               modelled: Derivation) -> Derivation:
    """A derivation from the probe's answer (the release's own code)."""
    steps = tuple(Step(s["step"], s["how"], s["source"], s.get("value"), s.get("note", ""))
                  for s in answer["steps"])
    values = {s.step: s.value for s in steps}
    manager, groups = values["manager"], values["groups"]
    blocks = manager["manager_block_sizes"]
    eagle_ids = set(manager["eagle_group_ids"])
    distinct: dict[tuple, int] = {}
    for i, g in enumerate(groups):
        key = (g["kind"], blocks[i], i in eagle_ids, g.get("sliding_window") or 0)
        distinct[key] = distinct.get(key, 0) + 1
    derived = tuple(DerivedGroup(kind, blk, eagle, window, count)
                    for (kind, blk, eagle, window), count in distinct.items())
    speculative = values.get("speculative") or {}
    sizes = values["block_sizes"]
    return Derivation(
        profile=p.name, release=release, legacy_hashes=legacy_hashes, groups=derived,
        coordinator=manager["coordinator"], scheduler_block_size=sizes["scheduler_block_size"],
        hash_block_size=sizes["hash_block_size"], partial_hash_hits=manager["partial_hash_hits"],
        use_eagle=values["scheduler_use_eagle"]["use_eagle"],
        num_hash_lookahead_tokens=speculative.get("num_hash_lookahead_tokens", 0),
        num_prefill_lookahead=speculative.get("num_prefill_lookahead", 0), dcp=p.dcp, steps=steps)
