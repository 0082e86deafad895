"""Emit a regression test in vLLM's own idiom from a finding.

The test is small and self-contained, for ``tests/v1/core/``: it builds a
``KVCacheManager`` from ``KVCacheGroupSpec``s the way vLLM's prefix-caching
tests do, wraps each group manager's ``cache_blocks`` with ``monkeypatch`` to
record the bound it receives, drives the request through the finding's steps
and asserts the spec's per-group values with an expected-vs-actual message.
It keeps to the critical case: a single prefill when one reproduces the
finding (found in the sweep), otherwise the minimal steps.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.capabilities import Capabilities
from kvspec.model.errors import InputError
from kvspec.model.finding import Finding
from kvspec.model.case import Case

__all__ = ["ASSERT_MESSAGE", "LOOKUP_ASSERT_MESSAGE", "ASSERT_MESSAGES", "critical_steps", "emit_test",
           "test_file_name"]

# The emitted assertions' messages: a failure counts only when it is one of these.
ASSERT_MESSAGE = "cache_blocks bound per group"
LOOKUP_ASSERT_MESSAGE = "later request's prefix-cache hit"
ASSERT_MESSAGES = (ASSERT_MESSAGE, LOOKUP_ASSERT_MESSAGE)

_LOOKUP_CATEGORIES = ("lookup_contract", "hit_mismatch")

_SPEC_CLASSES = {"full_attention": "FullAttentionSpec", "sliding_window": "SlidingWindowSpec",
                 "mamba_align": "MambaSpec"}


def critical_steps(f: Finding) -> tuple[int, list[dict[str, Any]], list[list[int]]] | None:
    """(prompt_len, steps, expected per-group bounds per call) of the smallest case."""
    sweep = f.sweep
    if sweep and sweep.get("differing_n") and f.category.value in ("under_registration",
                                                                   "over_registration"):
        n = min(sweep["differing_n"])
        i = sweep["n"].index(n)
        expected = [[sweep["spec"][g][i] for g in range(len(sweep["spec"]))]]
        if None not in expected[0]:
            return n, [{"kind": "prefill", "tokens": n, "drafts": 0, "accepted": 0}], expected
    calls = f.inputs.get("expected_calls")
    if not calls:
        return None
    return f.inputs["prompt_len"], list(f.inputs["steps"]), calls


def test_file_name(f: Finding) -> str:
    diagnosis = f.explanation.diagnosis if f.explanation and f.explanation.diagnosis else None
    stem = diagnosis or f.category.value
    return f"test_kvspec_{stem}.py"


def _group_spec(i: int, g: dict[str, Any], per_group_eagle: bool) -> str:
    kind, block = g["kind"], g["block_size"]
    if kind == "full_attention":
        spec = f"FullAttentionSpec(block_size={block}, num_kv_heads=1, head_size=8, dtype=torch.float16)"
    elif kind == "sliding_window":
        spec = (f"SlidingWindowSpec(block_size={block}, num_kv_heads=1, head_size=8, "
                f"dtype=torch.float16, sliding_window={g['sliding_window']})")
    else:
        spec = (f"MambaSpec(block_size={block}, shapes=((4, 4),), dtypes=(torch.float16,), "
                f"mamba_cache_mode=\"align\")")
    eagle = f", is_eagle_group={bool(g['eagle'])}" if per_group_eagle and g["eagle"] else ""
    return f'            KVCacheGroupSpec(["layer{i}"], {spec}{eagle}),'


def _ints(value: Any, what: str) -> list:
    """``value`` as a list of ints (None kept), or an InputError: what goes
    into emitted code is never a string from a file."""
    if not isinstance(value, (list, tuple)):
        raise InputError(f"{what}: expected a list, got {type(value).__name__}")
    out = []
    for item in value:
        if isinstance(item, (list, tuple)):
            out.append(_ints(item, what))
        elif item is None or (isinstance(item, int) and not isinstance(item, bool)):
            out.append(item)
        else:
            raise InputError(f"{what}: expected whole numbers, got {item!r}")
    return out


def _trusted(f: Finding) -> Finding:
    """The parts of ``f`` the emitter writes into code, rebuilt from typed
    values: the case through kvspec's model (its validators), numbers as
    ints, the diagnosis only when it names a known variant.  A finding read
    from a file is untrusted input."""
    import attrs

    from kvspec.model.variants import VARIANTS

    try:
        inputs = Case.from_dict(f.inputs).as_dict()
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise InputError(f"the finding's case is not one kvspec can emit a test for ({exc})") from None
    for key in ("expected_calls", "admissible_hits"):
        if key in f.inputs:
            inputs[key] = _ints(f.inputs[key], key)
    if "expected_hit" in f.inputs:
        inputs["expected_hit"] = _ints([f.inputs["expected_hit"]], "expected_hit")[0]
    sweep = None
    if f.sweep:
        sweep = {key: _ints(f.sweep.get(key, []), f"sweep {key}") for key in ("n", "spec", "differing_n")}
    explanation = f.explanation
    if explanation is not None and explanation.diagnosis not in {v.name for v in VARIANTS}:
        explanation = attrs.evolve(explanation, diagnosis=None)
    return attrs.evolve(f, inputs=inputs, sweep=sweep, explanation=explanation, regression_test=None)


def emit_test(f: Finding, capabilities: Capabilities) -> str | None:
    """The test's source, or None when the finding has nothing to pin."""
    f = _trusted(f)
    if f.category.value in _LOOKUP_CATEGORIES:
        return _emit_lookup_test(f, capabilities)
    chosen = critical_steps(f)
    if chosen is None:
        return None
    prompt_len, steps, expected = chosen
    single = len(steps) == 1 and steps[0]["kind"] == "prefill"
    name = test_file_name(f)[len("test_"):-len(".py")]
    groups = f.inputs["config"]["groups"]
    lines = _preamble(f, capabilities, prompt_len, steps, [
        f"{f.category.title} of the prefix-cache registration bound",
        f"Found against {_source(f)}; the expected values are kvspec's specification of",
        "HybridKVCacheCoordinator.cache_blocks: the bound each KV-cache group receives.",
    ])
    lines += [
        f"def test_{name}(monkeypatch):",
        "    init_none_hash(sha256)",
        "    manager = make_manager()",
        "    coordinator = manager.coordinator",
        "    bounds = []  # per cache_blocks call: the num_tokens each group receives",
        "",
        "    def new_call(*args, _orig=coordinator.cache_blocks, **kw):",
        f"        bounds.append([None] * {len(groups)})",
        "        return _orig(*args, **kw)",
        "",
        '    monkeypatch.setattr(coordinator, "cache_blocks", new_call)',
        "    for group_id, group_manager in enumerate(coordinator.single_type_managers):",
        "        def record(request, num_tokens, *args, _id=group_id, _orig=group_manager.cache_blocks, **kw):",
        "            bounds[-1][_id] = num_tokens",
        "            return _orig(request, num_tokens, *args, **kw)",
        "",
        '        monkeypatch.setattr(group_manager, "cache_blocks", record)',
        "",
        f"    request = make_request({prompt_len})",
        "    blocks, num_hit = manager.get_computed_blocks(request)[:2]",
    ]
    if single:
        lines += [
            f"    assert manager.allocate_slots(request, {prompt_len} - num_hit, num_new_computed_tokens=num_hit,",
            "                                  new_computed_blocks=blocks) is not None",
        ]
    else:
        lines += _drive_steps(steps)
    lines += [
        f"    expected = {expected!r}  # the spec's bound per group, per call",
        "    assert bounds == expected, (",
        f'        f"{ASSERT_MESSAGE}: expected {{expected}} (spec), got {{bounds}}")',
        "",
    ]
    return "\n".join(lines)


def _emit_lookup_test(f: Finding, capabilities: Capabilities) -> str | None:
    """A lookup finding's test: the writer's steps, then the later request's
    ``get_computed_blocks``; the spec's hit where the model is exact, else
    the hit lengths the contract admits."""
    inputs = f.inputs
    probe = inputs.get("probe")
    if not probe or ("expected_hit" not in inputs and "admissible_hits" not in inputs):
        return None
    prompt_len, steps = inputs["prompt_len"], list(inputs["steps"])
    name = test_file_name(f)[len("test_"):-len(".py")]
    lines = _preamble(f, capabilities, prompt_len, steps, [
        f"{f.category.title} of a later request's prefix-cache hit",
        f"Found against {_source(f)}; after the writer's steps, a later request sharing its",
        f"first {probe['shared']} tokens looks up: the expected hit is kvspec's specification",
        "(registration by model.spec, then the lookup of model.lookup).",
    ], later_request=True)
    lines += [
        f"def test_{name}():",
        "    init_none_hash(sha256)",
        "    manager = make_manager()",
        f"    request = make_request({prompt_len})",
        "    blocks, num_hit = manager.get_computed_blocks(request)[:2]",
        *_drive_steps(steps),
        f"    shared = list(request.all_token_ids)[:{probe['shared']}]",
        f"    later = make_later_request(shared + [90000 + i for i in range({probe['extra']})])",
        "    hit = manager.get_computed_blocks(later)[1]",
    ]
    if "expected_hit" in inputs:
        lines += [
            f"    expected = {inputs['expected_hit']!r}  # the spec's hit, in tokens",
            "    assert hit == expected, (",
            f'        f"{LOOKUP_ASSERT_MESSAGE}: expected {{expected}} tokens (spec), got {{hit}}")',
        ]
    else:
        lines += [
            f"    admissible = {inputs['admissible_hits']!r}  # hit lengths the spec's contract admits",
            "    assert hit in admissible, (",
            f'        f"{LOOKUP_ASSERT_MESSAGE}: the contract admits {{admissible}} tokens, got {{hit}}")',
        ]
    lines.append("")
    return "\n".join(lines)


def _source(f: Finding) -> str:
    return f.compared.get("subject", {}).get("label", "a subject")


def _preamble(f: Finding, capabilities: Capabilities, prompt_len: int, steps: list[dict[str, Any]],
              about: list[str], later_request: bool = False) -> list[str]:
    """Docstring (``about``: its title, then its text), imports, ``make_manager`` and ``make_request`` (and with
    ``later_request`` a second request factory), for this release's keywords."""
    config = f.inputs["config"]
    groups = config["groups"]
    # The geometry kvspec's worker gives vLLM for these steps.
    case = Case.from_dict({"config": config, "prompt_len": prompt_len, "steps": steps})
    max_model_len, num_blocks = case.max_model_len, case.num_blocks
    manager_kwargs = {
        "max_model_len": max_model_len,
        "scheduler_block_size": config["scheduler_block_size"],
        "hash_block_size": config["hash_block_size"],
        "enable_caching": config["enable_caching"],
        "use_eagle": any(g["eagle"] for g in groups),
        "num_prefill_lookahead": config["num_prefill_lookahead"],
        "dcp_world_size": config["dcp_world_size"],
        "max_num_batched_tokens": max_model_len,
        "log_stats": False,
    }
    accepted = set(capabilities.manager_keywords or manager_kwargs)
    manager_kwargs = {k: v for k, v in manager_kwargs.items() if k in accepted}
    if not capabilities.reprefillable_tokens:
        manager_kwargs.pop("num_prefill_lookahead", None)
    request_kwargs = {
        "request_id": '"0"',
        "prompt_token_ids": "[1000 + i for i in range(prompt_len)]",
        "sampling_params": f"SamplingParams(max_tokens={max_model_len})",
        "pooling_params": "None",
        "eos_token_id": "None",
        "block_hasher": "get_request_block_hasher(HASH_BLOCK_SIZE, sha256)",
    }
    if capabilities.request_keywords:  # only what this release's Request takes
        request_kwargs = {k: v for k, v in request_kwargs.items()
                          if k in capabilities.request_keywords}
    kinds = sorted({_SPEC_CLASSES[g["kind"]] for g in groups})
    per_group_eagle = capabilities.per_group_eagle
    lines = [
        "# SPDX-License-Identifier: Apache-2.0",
        f'"""{about[0]} (emitted by kvspec).',
        "",
        *about[1:],
        '"""',
        "import torch",
        "",
        "from vllm.sampling_params import SamplingParams",
        "from vllm.v1.core.kv_cache_manager import KVCacheManager",
        "from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash",
        "from vllm.v1.kv_cache_interface import (",
        *[f"    {k}," for k in ["KVCacheConfig", "KVCacheGroupSpec", *kinds]],
        ")",
        "from vllm.v1.request import Request",
        "",
        "try:",
        "    from vllm.utils.hashing import sha256",
        "except ImportError:  # older layout",
        "    from vllm.utils import sha256",
        "",
        f"HASH_BLOCK_SIZE = {config['hash_block_size']}",
        "",
        "",
        "def make_manager():",
        "    config = KVCacheConfig(",
        f"        num_blocks={num_blocks},",
        "        kv_cache_tensors=[],",
        "        kv_cache_groups=[",
        *[_group_spec(i, g, per_group_eagle) for i, g in enumerate(groups)],
        "        ],",
        "    )",
        "    return KVCacheManager(",
        "        config,",
        *[f"        {k}={'HASH_BLOCK_SIZE' if k == 'hash_block_size' else repr(v)}," for k, v in manager_kwargs.items()],
        "    )",
        "",
        "",
        "def make_request(prompt_len):",
        "    return Request(",
        *[f"        {k}={v}," for k, v in request_kwargs.items()],
        "    )",
        "",
        "",
    ]
    if later_request:
        later = {**request_kwargs, "request_id": '"1"', "prompt_token_ids": "token_ids"}
        lines += [
            "def make_later_request(token_ids):",
            "    return Request(",
            *[f"        {k}={v}," for k, v in later.items()],
            "    )",
            "",
            "",
        ]
    return lines


def _drive_steps(steps: list[dict[str, Any]]) -> list[str]:
    """The request's scheduler steps, as kvspec's driver takes them: prefill
    chunks, then decodes whose rejected drafts are rolled back."""
    return [
        f"    steps = {steps!r}",
        "    computed, first = num_hit, True",
        "    for step in steps:",
        '        drafts = step["drafts"] if step["kind"] == "decode" else 0',
        "        request.spec_token_ids = [7] * drafts",
        '        new = step["tokens"] if step["kind"] == "prefill" else request.num_tokens + drafts - computed',
        "        assert manager.allocate_slots(",
        "            request, new, num_new_computed_tokens=num_hit if first else 0,",
        "            new_computed_blocks=blocks if first else None) is not None",
        '        first, computed = False, computed + new - (drafts - step["accepted"])',
        "        request.spec_token_ids = []",
        "        request.num_computed_tokens = computed",
        '        emitted = step["accepted"] + 1 if step["kind"] == "decode" else int(computed >= request.num_tokens)',
        "        for _ in range(emitted):",
        "            request.append_output_token_ids(5000)",
    ]
