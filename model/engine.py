"""Engine subjects: a vLLM engine configuration, and the programs driven through it.

A subject configuration here is what a user gives vLLM's engine -- a model's
``config.json`` fields and ``EngineArgs`` flags -- never a ``KVCacheConfig``
built by hand: everything below it (``VllmConfig``, the KV-cache groups and
block sizes, the pool, the hash scheme, the retention interval) is built by
the release's own code, its defaults included, in the subject's runtime
(``subjects/vllm_side/engine.py``).  A flag left ``None`` is not passed, so
the release's default is what runs, and what it was is read back and said.

The models are toys (a few small layers, a small vocabulary) so pools are
small and programs shrink; they are reached through the same configuration
code as a real checkpoint.  Two steps are modelled, and every verdict says
so: the layer layout (which layer is attention, sliding window or Mamba,
read from the fields here) and the GPU platform (an SM90 stand-in).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from .case import InvalidCase
from .deployments import MODELS
from .domain import CoordinatorConfig, GroupKind, HashScheme, KVCacheGroup
from .program import validated_ops
from .retention import RetentionLayout

__all__ = ["HAND_BUILT", "HAND_BUILT_PROFILE_REACHED", "ENGINE_BUILT", "OWN_CONNECTOR", "LOAD_FIELDS", "FAILURE_POLICIES", "ToyModel", "TOY_MODELS",
           "MTP_TOY", "MAX_MTP_MODULES", "QWEN3_NEXT_TOYS", "toy_model", "EngineSetup", "EngineProgram", "ENGINE_OPERATIONS", "describe_engine_op", "derived_config",
           "retention_layout", "MODELLED_STEPS"]

ENGINE_OPERATIONS = ("arrive", "step", "abort", "reset")

# How a finding's configuration was built, said with every finding.
_HAND_BUILT_HOW = ("hand-built: kvspec built the KVCacheConfig and KVCacheManager itself and drove it with its own "
                   "replica of the scheduler's step")
HAND_BUILT = f"{_HAND_BUILT_HOW} (hardening until reproduced through vLLM's engine: kvspec fuzz --engine)"
# The same, for a finding a deployment profile reaches (a configuration vLLM's
# own code derives): not hardening, whatever the engine search shows.
HAND_BUILT_PROFILE_REACHED = (f"{_HAND_BUILT_HOW} (not hardening: a deployment profile vLLM's own configuration "
                              "code derives reaches it, as its reach says)")
ENGINE_BUILT = ("engine-built: vLLM's own configuration code built it from the engine flags the finding names, "
                "and vLLM's real Scheduler drove it (a user with those flags reaches the same calls)")
# KV connectors whose scheduler side runs on a CPU: vLLM's DecodeBenchConnector
# loads synchronously, offering every prompt token but the last; kvspec's own
# (subjects/vllm_side/connector.py, against vLLM's public KVConnectorBase_V1)
# serves each request's drawn load plan (LOAD_FIELDS).
OWN_CONNECTOR = "KvspecConnector"
OWN_CONNECTOR_MODULE = "kvspec.subjects.vllm_side.connector"
KV_CONNECTORS = ("DecodeBenchConnector", OWN_CONNECTOR)
# kv_load_failure_policy (KVTransferConfig, every release 0.22+; unset: "fail").
FAILURE_POLICIES = ("fail", "recompute")
# A request's load plan for kvspec's connector: leading prompt tokens the
# external store holds, asynchronous or not, executed steps before an
# asynchronous load finishes, and which loaded block fails (None: none).
LOAD_FIELDS = ("offer", "async", "delay", "fail")

# What the engine driver does not take from vLLM's code, said with every verdict.
MODELLED_STEPS = (
    "the layer layout (which layer is attention, sliding window or Mamba) is read from the toy model's "
    "config fields by kvspec; a server builds it from the model class",
    "the GPU platform is vLLM's CudaPlatformBase reporting SM90 with FlashAttention (a CPU reports no GPU)",
    "the forward pass: each step's sampled tokens (one, plus the drafts accepted) and drafts are drawn",
    "the worker side of kvspec's own KV connector: when an asynchronous load finishes and which loaded block "
    "fails are drawn per request and reported in the step's KVConnectorOutput (finished_recving, "
    "invalid_block_ids) as a worker would",
)


@attrs.frozen
class ToyModel:
    """A small model of a real family: its config.json and its layer layout."""

    name: str
    family: str
    hf_config: dict[str, Any] = attrs.field(eq=False, repr=False)
    layers: tuple[str, ...]  # "full", "sliding:W", "mamba" per KV-cache layer
    mixer: str | None = None  # the Mamba layer class family ("mamba2", "gdn"), if any
    attention_block: bool = True  # whether --block-size is the user's to choose (attention-only models)
    # An EAGLE3 drafter's config.json for this model (None: no EAGLE3 drafter).
    drafter: dict[str, Any] | None = attrs.field(default=None, eq=False, repr=False)
    # vLLM's speculative method drawn on this model (None: no speculative
    # decoding): "eagle3" with ``drafter``, "mtp" with the model's own
    # num_nextn_predict_layers modules (no config.json of their own).
    spec_method: str | None = None

    @property
    def hybrid(self) -> bool:
        return "mamba" in self.layers

    def drafter_message(self, hf_config: dict[str, Any] | None = None) -> dict[str, Any]:
        """The worker's ``drafter`` part: an EAGLE3 drafter's config.json and
        attention geometry (its own KV heads and head size), or the MTP
        modules' count (their geometry is the target's), read from
        ``hf_config`` (the model's config.json as the setup writes it;
        unset: the toy's own)."""
        message: dict[str, Any] = {"hf_config": self.drafter, "draft_layers": self.draft_layers(hf_config)}
        if self.drafter is not None:
            c = self.drafter
            message.update(num_kv_heads=c["num_key_value_heads"],
                           head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
        return message

    def draft_layers(self, hf_config: dict[str, Any] | None = None) -> int:
        """The drafter's attention layers (each holds KV): an MTP module has one."""
        if self.spec_method == "mtp":
            return int((hf_config or self.hf_config).get("num_nextn_predict_layers") or 1)
        return int((self.drafter or {}).get("num_hidden_layers", 1))

    def as_setup_part(self) -> dict[str, Any]:
        return {"hf_config": self.hf_config, "layers": list(self.layers), "mixer": self.mixer}


def _llama() -> ToyModel:
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=1000,
                  max_position_embeddings=4096, torch_dtype="bfloat16")
    drafter = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1, hidden_size=64,
                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=1000,
                   draft_vocab_size=1000, max_position_embeddings=4096, rms_norm_eps=1e-5, torch_dtype="bfloat16",
                   tie_word_embeddings=False)
    return ToyModel("toy-llama", "Llama (full attention)", config, ("full", "full"), drafter=drafter,
                    spec_method="eagle3")


def _gpt_oss() -> ToyModel:
    config = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=64, num_hidden_layers=2,
                  layer_types=["sliding_attention", "full_attention"], num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, sliding_window=32, num_local_experts=4, num_experts_per_tok=2, experts_per_token=2,
                  intermediate_size=64, vocab_size=1000, max_position_embeddings=4096, rope_theta=150000,
                  torch_dtype="bfloat16", tie_word_embeddings=False, attention_bias=True, swiglu_limit=7.0,
                  rms_norm_eps=1e-5, initial_context_length=4096)
    return ToyModel("toy-gpt-oss", "gpt-oss (sliding window + full attention)", config, ("sliding:32", "full"))


def _nemotron_h() -> ToyModel:
    config = dict(architectures=["NemotronHForCausalLM"], model_type="nemotron_h", hidden_size=64,
                  num_hidden_layers=4, hybrid_override_pattern="M*M-", num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=128, vocab_size=1000, max_position_embeddings=4096,
                  mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=1, conv_kernel=4, expand=1,
                  chunk_size=16, torch_dtype="bfloat16", mamba_hidden_act="silu", mlp_hidden_act="relu2",
                  layer_norm_epsilon=1e-5)
    # "M*M-": Mamba, attention, Mamba, MLP (the MLP layer holds no KV cache).
    return ToyModel("toy-nemotron-h", "Nemotron-H (Mamba2 hybrid)", config, ("mamba", "full", "mamba"),
                    mixer="mamba2", attention_block=False)


def _qwen3_next_shape():
    """The deployment catalog's Qwen3-Next-80B-A3B shape (its published
    fields, one MTP module) at toy sizes: four layers, so three GDN layers and
    one full-attention layer (full_attention_interval 4 kept), tiny heads and
    dims, four small experts, a small vocabulary."""
    shape = MODELS["Qwen3-Next-80B-A3B-Instruct"]
    toy = {**shape.hf_config, **dict(
        num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, vocab_size=1000, max_position_embeddings=4096)}
    return attrs.evolve(shape, fields=toy)


def _qwen3_next() -> ToyModel:
    shape = _qwen3_next_shape()
    return ToyModel("toy-qwen3-next", "Qwen3-Next (GDN hybrid, MTP)", shape.hf_config, shape.layers(),
                    mixer=shape.mixer, attention_block=False, spec_method="mtp")


def _qwen3_next_eagle3() -> ToyModel:
    """The same toy with an EAGLE3 drafter whose KV page per token is twice
    the target's (4 KV heads to the target's 2): vLLM's page unification gives
    its group half the target's block, so an EAGLE group's block is below the
    scheduler block -- where the registration bound's EAGLE branch (#50062)
    decides what a resend hits.  Hypothetical geometry, as the deployment
    catalog's "eagle3 qwen3-next kv8x128" drafter (no published drafter's
    attention geometry was read); MTP modules share the target's page."""
    shape = _qwen3_next_shape()
    drafter = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1, hidden_size=64,
                   num_attention_heads=4, num_key_value_heads=4, head_dim=16, intermediate_size=128,
                   vocab_size=1000, draft_vocab_size=1000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                   torch_dtype="bfloat16", tie_word_embeddings=False)
    return ToyModel("toy-qwen3-next-eagle3", "Qwen3-Next (GDN hybrid) with an EAGLE3 drafter of twice its KV page "
                    "(hypothetical drafter geometry)", shape.hf_config, shape.layers(), mixer=shape.mixer,
                    attention_block=False, drafter=drafter, spec_method="eagle3")


TOY_MODELS: tuple[ToyModel, ...] = (_llama(), _gpt_oss(), _nemotron_h(), _qwen3_next(), _qwen3_next_eagle3())
MTP_TOY = "toy-qwen3-next"  # the GDN hybrid with MTP speculative decoding
QWEN3_NEXT_TOYS = (MTP_TOY, "toy-qwen3-next-eagle3")  # the toys --prefix-match-unit is drawn on


def toy_model(name: str) -> ToyModel:
    for model in TOY_MODELS:
        if model.name == name:
            return model
    raise InvalidCase(f"no toy model {name!r}; known: {', '.join(m.name for m in TOY_MODELS)}")


# The most MTP modules drawn on the MTP toy (num_nextn_predict_layers).
MAX_MTP_MODULES = 3
# EngineSetup fields a stored setup leaves out while unset (added after setups were stored).
_OMITTED_UNSET = ("mamba_cache_mode", "num_nextn_predict_layers")


def _optional_count(low: int, high: int):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidCase(f"{attribute.name} must be a whole number from {low} to {high}, got {value!r}")
    return check


def _optional_bool(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise InvalidCase(f"{attribute.name} must be true, false or unset, got {value!r}")


def _mamba_mode(value: Any) -> None:
    if value not in (None, "align"):
        raise InvalidCase(f"mamba_cache_mode must be 'align' or unset, got {value!r}")


@attrs.frozen
class EngineSetup:
    """``EngineArgs`` flags over a toy model; ``None`` leaves the release's default."""

    model: str = attrs.field(validator=lambda i, a, v: toy_model(v))
    num_gpu_blocks: int = attrs.field(validator=_optional_count(2, 1 << 16))  # --num-gpu-blocks-override
    max_model_len: int = attrs.field(default=256, validator=_optional_count(16, 1 << 16))
    max_num_batched_tokens: int | None = attrs.field(default=None, validator=_optional_count(1, 1 << 16))
    max_num_seqs: int | None = attrs.field(default=None, validator=_optional_count(1, 256))
    block_size: int | None = attrs.field(default=None, validator=_optional_count(1, 1 << 12))
    prefix_caching: bool | None = attrs.field(default=None, validator=_optional_bool)
    retention_interval: int | None = attrs.field(default=None, validator=_optional_count(0, 1 << 16))
    async_scheduling: bool | None = attrs.field(default=None, validator=_optional_bool)
    reserve_full_isl: bool | None = attrs.field(default=None, validator=_optional_bool)
    # A KV connector of vLLM's own that runs on a CPU (scheduler side): None for none.
    kv_connector: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.in_(KV_CONNECTORS)))
    # --kv-transfer-config's kv_load_failure_policy, for kvspec's own connector (None: the release's default).
    kv_load_failure_policy: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.in_(FAILURE_POLICIES)))
    # Speculative decoding with the toy's drafter (EAGLE3, or the model's own
    # MTP modules): the drafts per step (None: none).
    num_speculative_tokens: int | None = attrs.field(default=None, validator=_optional_count(1, 8))
    # --speculative-config's disable_lookahead_block_hashes (0.33+): legacy hashes, the EAGLE drop live.
    legacy_hashes: bool | None = attrs.field(default=None, validator=_optional_bool)
    # --prefix-match-unit (0.28+): the hash block, finer than a hybrid's block (partial hash hits).
    prefix_match_unit: int | None = attrs.field(default=None, validator=_optional_count(1, 1 << 12))
    # --mamba-cache-mode: "align" caches Mamba states at block boundaries (a
    # hybrid's prefix caching); before 0.28 a hybrid's default is "none".
    mamba_cache_mode: str | None = attrs.field(default=None, validator=lambda i, a, v: _mamba_mode(v))
    # The MTP toy's num_nextn_predict_layers (its config.json: the model's own
    # MTP modules; None: the toy's one).  Two or more with as many speculative
    # tokens is vLLM's multi-module MTP (SpeculativeConfig.use_multi_module_mtp):
    # a prefill lookahead of the drafts, not 1.
    num_nextn_predict_layers: int | None = attrs.field(default=None, validator=_optional_count(1, MAX_MTP_MODULES))

    def __attrs_post_init__(self) -> None:
        if self.mamba_cache_mode is not None and not self.toy.hybrid:
            raise InvalidCase(f"{self.model} has no Mamba layers: --mamba-cache-mode does not apply")
        if self.num_speculative_tokens is not None and self.toy.spec_method is None:
            raise InvalidCase(f"{self.model} has no drafter: no speculative decoding on it")
        if self.legacy_hashes is not None and self.num_speculative_tokens is None:
            raise InvalidCase("legacy_hashes is a speculative-config setting: it needs num_speculative_tokens")
        if self.num_nextn_predict_layers is not None:
            if self.toy.spec_method != "mtp":
                raise InvalidCase(f"{self.model} has no MTP modules of its own: num_nextn_predict_layers does not "
                                  "apply")
            if self.num_speculative_tokens is None:
                raise InvalidCase("num_nextn_predict_layers is drawn for MTP speculative decoding: it needs "
                                  "num_speculative_tokens")
        if self.kv_load_failure_policy is not None and self.kv_connector != OWN_CONNECTOR:
            raise InvalidCase(f"kv_load_failure_policy is drawn for {OWN_CONNECTOR} only")

    @property
    def toy(self) -> ToyModel:
        return toy_model(self.model)

    @property
    def hf_config(self) -> dict[str, Any]:
        """The model's config.json as this setup writes it: the toy's, with
        its MTP modules' count where one is set."""
        if self.num_nextn_predict_layers is None:
            return self.toy.hf_config
        return {**self.toy.hf_config, "num_nextn_predict_layers": self.num_nextn_predict_layers}

    def engine_args(self) -> dict[str, Any]:
        """The flags given, in ``EngineArgs`` keywords (unset ones left out)."""
        names = {"num_gpu_blocks": "num_gpu_blocks_override", "max_model_len": "max_model_len",
                 "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
                 "block_size": "block_size", "prefix_caching": "enable_prefix_caching",
                 "retention_interval": "prefix_cache_retention_interval", "async_scheduling": "async_scheduling",
                 "reserve_full_isl": "scheduler_reserve_full_isl", "prefix_match_unit": "prefix_match_unit",
                 "mamba_cache_mode": "mamba_cache_mode"}
        args = {flag: getattr(self, field) for field, flag in names.items() if getattr(self, field) is not None}
        if self.kv_connector is not None:
            transfer = {"kv_connector": self.kv_connector, "kv_role": "kv_both"}
            if self.kv_connector == OWN_CONNECTOR:  # out of tree: vLLM imports it from its module path
                transfer["kv_connector_module_path"] = OWN_CONNECTOR_MODULE
            if self.kv_load_failure_policy is not None:
                transfer["kv_load_failure_policy"] = self.kv_load_failure_policy
            args["kv_transfer_config"] = transfer
        if self.num_speculative_tokens is not None:
            spec: dict[str, Any] = {"method": self.toy.spec_method,
                                    "num_speculative_tokens": self.num_speculative_tokens}
            if self.legacy_hashes:
                spec["disable_lookahead_block_hashes"] = True
            args["speculative_config"] = spec
        return args

    def message(self) -> dict[str, Any]:
        """The worker's ``open_engine`` setup (an EAGLE3 drafter's config.json
        goes in its own directory, which the worker names in the speculative
        config; MTP modules are the target's own, so none is named)."""
        message = {**self.toy.as_setup_part(), "hf_config": self.hf_config, "engine_args": self.engine_args()}
        if self.num_speculative_tokens is not None:
            message["drafter"] = self.toy.drafter_message(self.hf_config)
        return message

    def cli_flags(self) -> str:
        """The setup as ``vllm serve`` flags (what a user types)."""
        flags = []
        for flag, value in self.engine_args().items():
            name = "--" + flag.replace("_", "-")
            if isinstance(value, dict):
                flags.append(f"{name} '{json.dumps(value, sort_keys=True)}'")
            elif isinstance(value, bool):
                flags.append(name if value else "--no-" + flag.replace("_", "-"))
            else:
                flags.append(f"{name} {value}")
        return " ".join(flags)

    def describe(self) -> str:
        flags = self.cli_flags()
        model = self.model
        if self.num_nextn_predict_layers is not None:
            model += f" (config.json num_nextn_predict_layers {self.num_nextn_predict_layers})"
        return f"{model}{(' ' + flags) if flags else ''} (other flags: the release's defaults)"

    def as_dict(self) -> dict[str, Any]:
        # Unset, the Mamba cache mode and the MTP modules' count are left out:
        # setups stored before they existed read the same.
        return attrs.asdict(self, filter=lambda a, v: not (a.name in _OMITTED_UNSET and v is None))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineSetup":
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:  # attrs' in_ validators raise ValueError
            raise InvalidCase(f"not an engine setup ({exc})") from None


def _engine_ops(value: Any) -> tuple[dict[str, Any], ...]:
    ops = validated_ops(value, ENGINE_OPERATIONS, ("max_tokens", "drafts", "accepted"), what="engine operation")
    for op in ops:
        if "load" in op:
            _check_load(op["load"])
    return ops


def _check_load(plan: Any) -> None:
    """A stored load plan is untrusted input: known fields, small whole numbers."""
    if not isinstance(plan, dict) or set(plan) - set(LOAD_FIELDS):
        raise InvalidCase(f"a load plan is a mapping of {', '.join(LOAD_FIELDS)}, got {plan!r}")
    for key in ("offer", "delay", "fail"):
        value = plan.get(key)
        if value is None and key == "fail":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 16:
            raise InvalidCase(f"a load plan's {key} must be a whole number from 0 to {1 << 16}, got {value!r}")
    if not isinstance(plan.get("async"), bool):
        raise InvalidCase(f"a load plan's async must be true or false, got {plan.get('async')!r}")


@attrs.frozen
class EngineProgram:
    """An engine setup and the engine inputs given to it, in order."""

    setup: EngineSetup = attrs.field(validator=attrs.validators.instance_of(EngineSetup))
    ops: tuple[dict[str, Any], ...] = attrs.field(default=(), converter=_engine_ops)

    def with_ops(self, ops) -> "EngineProgram":
        return attrs.evolve(self, ops=tuple(ops))

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.setup.as_dict(), "ops": [dict(op) for op in self.ops]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineProgram":
        try:
            return cls(EngineSetup.from_dict(dict(data["engine"])), data["ops"])
        except (TypeError, KeyError, AttributeError) as exc:
            raise InvalidCase(f"not a kvspec engine program ({type(exc).__name__}: {exc})") from None

    def describe(self) -> str:
        return f"{self.setup.describe()} ops=[{'; '.join(describe_engine_op(op) for op in self.ops)}]"


def describe_engine_op(op: dict[str, Any]) -> str:
    kind = op["do"]
    if kind == "arrive":
        load = op.get("load")
        plan = ""
        if load:
            fail = "" if load.get("fail") is None else f", loaded block {load['fail']} fails"
            mode = f"asynchronously, done after {load['delay']} step(s)" if load["async"] else "synchronously"
            plan = f", the connector offers {load['offer']} prompt tokens loaded {mode}{fail}"
        return (f"add_request {op['id']} ({len(op['tokens'])} prompt tokens, max_tokens {op.get('max_tokens', 16)}"
                f"{plan})")
    if kind == "step":
        extra = f", {op['drafts']} drafts, {op.get('accepted', 0)} accepted" if op.get("drafts") else ""
        return f"engine step{extra}"
    if kind == "abort":
        return f"abort {op['id']}"
    return "reset_prefix_cache"


def derived_config(derived: dict[str, Any]) -> CoordinatorConfig:
    """The coordinator geometry vLLM's configuration code built (the worker's
    ``open_engine`` answer), in kvspec's terms, for the state invariants.  A
    group is EAGLE here where its manager drops the EAGLE block as the
    scheduler built it (the state rules need whether the drop runs, which the
    release's scheduler decides: 0.28 for every group of an EAGLE drafter,
    0.33+ not under lookahead hashes)."""
    groups = []
    for g in derived["groups"]:
        kind = g["kind"]
        if kind not in {k.value for k in GroupKind}:
            raise InvalidCase(f"the engine built a {kind} group, which kvspec's state model does not know")
        groups.append(KVCacheGroup(GroupKind(kind), g["block_size"], eagle=g["eagle"],
                                   sliding_window=g.get("sliding_window") or 0))
    scheme = HashScheme.LOOKAHEAD if derived.get("num_hash_lookahead_tokens") else HashScheme.LEGACY
    return CoordinatorConfig(tuple(groups), scheduler_block_size=derived["scheduler_block_size"],
                             hash_block_size=derived["hash_block_size"], enable_caching=derived["enable_caching"],
                             num_prefill_lookahead=derived.get("num_prefill_lookahead", 0), hash_scheme=scheme)


def retention_layout(derived: dict[str, Any], config: CoordinatorConfig) -> RetentionLayout:
    """What retention the engine runs (the interval vLLM's planning put on
    the KVCacheConfig, each group's hit alignment), for ``model.retention``."""
    alignments = tuple(g.get("alignment") or config.scheduler_block_size for g in derived["groups"])
    return RetentionLayout(config.groups, alignments, config.scheduler_block_size, derived.get("retention_interval"),
                           enable_caching=config.enable_caching, connector=derived.get("kv_connector") is not None,
                           speculative=bool(derived.get("speculative_method") or derived.get("num_hash_lookahead_tokens")))
