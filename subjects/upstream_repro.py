"""A standalone reproduction of an engine finding, for a vLLM bug report,
and its run in a fresh process on the release.

The script is written by kvspec from validated fields only: the engine
program (``model.engine.EngineProgram``: a toy model kvspec knows by name,
numbers, booleans, known connector names, each request's load plan for
kvspec's own connector) and the settings vLLM derived for it, each checked
here to be a number, a boolean or a known word.  No string of the finding
file reaches the script.  It imports vLLM and the standard library only (and
torch, which vLLM needs): a vLLM maintainer runs it as it is.  A finding
found with kvspec's own KV connector gets that connector's behaviour written
into the code (``CONNECTOR_CODE``: ``ExternalStoreConnector``, against
vLLM's public ``KVConnectorBase_V1``, and its worker side run by the driver).
A finding with speculative decoding gets vLLM's ``SpeculativeConfig`` built
from its flags (``SPECULATIVE_CODE``: what vLLM derives from it, the
lookahead and the EAGLE block drop, is read from vLLM), the groups vLLM's
planning flagged as the drafter's, and each step's drafts accepted in its
output and proposed after it, as kvspec's engine driver plays them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import attrs

from kvspec.model.engine import FAILURE_POLICIES, LOAD_FIELDS, OWN_CONNECTOR, OWN_CONNECTOR_MODULE, EngineProgram
from kvspec.model.errors import UsageError
from kvspec.model.finding import Category

__all__ = ["UPSTREAM_KINDS", "ReproScript", "RuleCheck", "Unscriptable", "repro_script", "run_repro", "ReproRun", "engine_values",
           "engine_code", "ENGINE_CODE", "IMPORTS", "HAND_BUILT_NOTE",
           "install_line", "MAX_TAIL_LINES", "wrap", "CONNECTOR_CODE", "SCRIPT_CONNECTOR", "imports",
           "OWN_CONNECTOR_NOTE"]

# The finding kinds a script is written for on its own: schedule() raising,
# and a group's block estimate below what allocate_slots takes (any other
# kind's script is written around its rule's check: RuleCheck).
UPSTREAM_KINDS = (Category.SUBJECT_CRASH, Category.STATE_BLOCK_ESTIMATE)
# Group kinds the script can build a spec for (what kvspec's state model knows).
_SPEC_KINDS = ("full_attention", "sliding_window", "mamba_align")
# The connectors a user has without kvspec (kvspec's own one is not vLLM's:
# the code carries its behaviour as a connector of its own, SCRIPT_CONNECTOR).
_STANDALONE_CONNECTORS = ("DecodeBenchConnector",)
SCRIPT_CONNECTOR = "ExternalStoreConnector"
MAX_TAIL_LINES = 15


class Unscriptable(UsageError):
    """No upstream script for this finding (exit 2)."""


@attrs.frozen
class RuleCheck:
    """The rule an engine finding broke, as its check is written: rendered
    once (``kvspec.emit.engine_test.rule_check``) for the finding's engine
    test and its upstream script alike."""
    kind: Category
    name: str  # the engine test's name
    code: str  # the check's functions
    body: str  # the lines driving the inputs under the check (``scheduler`` bound, indented 4)
    rule: str  # the rule in vLLM's words: what the assertion's message opens with
    doc: str  # what is checked, a sentence or a few


@attrs.frozen
class ReproScript:
    code: str
    version: str
    kind: Category
    marker: str  # what the script's last output line starts with when it reproduces
    hand_built: str  # what the script builds itself rather than through vLLM's planning
    rule: str = ""  # a rule's script: the rule its failing assertion says it broke


def install_line(version: str, name: str = "repro.py") -> str:
    """How to get a CPU environment and run the script, in one line (the
    script sets VLLM_TARGET_DEVICE=empty and HF_HUB_OFFLINE=1 itself)."""
    return f"pip install vllm=={version} && python {name}"


def _int(settings: dict[str, Any], key: str, low: int = 0, high: int = 1 << 20) -> int:
    value = settings.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Unscriptable(f"the finding's engine settings have no valid {key} (a whole number from {low} to "
                           f"{high}): no upstream script")
    return value


def _bool(settings: dict[str, Any], key: str) -> bool:
    value = settings.get(key)
    if not isinstance(value, bool):
        raise Unscriptable(f"the finding's engine settings have no valid {key} (true or false): no upstream script")
    return value


def _checkpoint(group: dict[str, Any]) -> tuple[int, int | None]:
    """A Mamba group's prefill checkpoint as vLLM built its spec (blocks,
    alignment): the scheduler splits a prefill at block boundaries or not by
    it, so a spec built without it schedules otherwise than the engine did."""
    if "prefill_checkpoint_blocks" not in group or "prefill_checkpoint_alignment" not in group:
        raise Unscriptable("the finding's engine settings do not record its Mamba groups' prefill checkpoint (how "
                           "vLLM schedules their prefills): rerun `kvspec fuzz --engine` to record it; no upstream "
                           "script")
    blocks = _int(group, "prefill_checkpoint_blocks", 0, 16)
    alignment = group["prefill_checkpoint_alignment"]
    return blocks, None if alignment is None else _int(group, "prefill_checkpoint_alignment", 1, 1 << 20)


def _groups(settings: dict[str, Any]) -> list[tuple[str, int, int, int, int, int | None]]:
    raw = settings.get("groups")
    if not isinstance(raw, list) or not 1 <= len(raw) <= 16:
        raise Unscriptable("the finding's engine settings list no KV-cache groups: no upstream script")
    groups = []
    for g in raw:
        if not isinstance(g, dict) or g.get("kind") not in _SPEC_KINDS:
            raise Unscriptable("the finding's engine settings name a KV-cache group kind the upstream script "
                               "cannot build: no upstream script")
        for flag in ("eagle", "eagle_group"):
            if not isinstance(g.get(flag, False), bool):
                raise Unscriptable(f"the finding's engine settings have no valid {flag} for a group (true or "
                                   "false): no upstream script")
        kind = _SPEC_KINDS[_SPEC_KINDS.index(g["kind"])]
        checkpoint = _checkpoint(g) if kind == "mamba_align" else (0, None)
        groups.append((kind, _int(g, "block_size", 1, 1 << 12), _int(g, "sliding_window", 0, 1 << 20),
                       _int(g, "layers", 1, 64), *checkpoint))
    return groups


def _plan(plan: Any) -> dict[str, Any]:
    """A request's load plan for kvspec's connector, validated afresh (known
    fields, small whole numbers, a boolean; no ``fail``: none fails), in
    LOAD_FIELDS' order."""
    if not isinstance(plan, dict) or not set(plan) <= set(LOAD_FIELDS):
        raise Unscriptable(f"a load plan of the finding is not a mapping of {', '.join(LOAD_FIELDS)}: no upstream "
                           "script")
    plan = {"fail": None, **plan}
    for key in ("offer", "delay", "fail"):
        value = plan.get(key)
        if (value is not None or key != "fail") and (isinstance(value, bool) or not isinstance(value, int)
                                                    or not 0 <= value <= 1 << 16):
            raise Unscriptable(f"a load plan's {key} is not a whole number from 0 to {1 << 16}: no upstream script")
    if not isinstance(plan.get("async"), bool):
        raise Unscriptable("a load plan's async is not true or false: no upstream script")
    return {key: plan[key] for key in LOAD_FIELDS}


def _ops(program: EngineProgram, own_connector: bool = False, speculative: bool = False) -> list[tuple]:
    """The engine inputs as plain tuples of validated values (under kvspec's
    connector an arrival also carries its load plan, or None; under
    speculative decoding a step its drafts proposed and accepted)."""
    ops: list[tuple] = []
    for op in program.ops:
        kind = op["do"]
        if kind == "arrive":
            if op.get("load") and not own_connector:
                raise Unscriptable("a load plan of the finding is for kvspec's own KV connector, which its "
                                   "settings do not name: no upstream script")
            rid = op["id"]
            if not isinstance(rid, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", rid):
                raise Unscriptable("a request id of the finding is not a plain name: no upstream script")
            tokens = [int(t) for t in op["tokens"]]
            arrive = ("arrive", rid, tokens, int(op.get("max_tokens", 16)))
            if own_connector:
                arrive += (_plan(op["load"]) if op.get("load") else None,)
            ops.append(arrive)
        elif kind == "step":
            # Under speculative decoding a step carries the drafts proposed
            # after it and the drafts its output accepts (validated whole
            # numbers); without, the engine proposes none and accepts none.
            if speculative:
                ops.append(("step", int(op.get("drafts", 0)), int(op.get("accepted", 0))))
            else:
                ops.append(("step",))
        elif kind == "abort":
            rid = op["id"]
            if not isinstance(rid, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", rid):
                raise Unscriptable("a request id of the finding is not a plain name: no upstream script")
            ops.append(("abort", rid))
        else:
            ops.append(("reset",))
    return ops


def _py(value: Any) -> str:
    """A Python literal as ruff format writes it (strings in double quotes):
    only validated plain names, numbers, booleans, None and tuples of them."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        inner = ", ".join(_py(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return repr(value)


def _plan_literal(plan: dict[str, Any] | None) -> str:
    """A validated load plan as a dict literal (its keys: LOAD_FIELDS)."""
    if plan is None:
        return "None"
    return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in plan.items()) + "}"


def wrap(text: str, width: int = 80) -> str:
    """``text`` in lines of at most ``width`` characters, at its spaces (a
    docstring's paragraph within vLLM's line length)."""
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def _dict_call(config: dict[str, Any]) -> str:
    """A config.json kvspec holds (its keys are plain names) as ``dict(...)``,
    one keyword a line as ruff format lays out a call that does not fit one."""
    return "dict(\n" + "".join(f"    {k}={_py(v)},\n" for k, v in config.items()) + ")"


def _tokens(tokens: list[int]) -> str:
    # A run of consecutive ids reads as a range (the fuzzer's prompts mostly are).
    if len(tokens) > 3 and tokens == list(range(tokens[0], tokens[0] + len(tokens))):
        return f"list(range({tokens[0]}, {tokens[0] + len(tokens)}))"
    return _py(tokens)


def _item(parts: list[str], indent: str = "    ") -> list[str]:
    """One tuple of a list, as ruff format lays it out: on one line if it
    fits, else exploded (a trailing comma keeps it so), a long token list one
    id a line."""
    line = f"{indent}({', '.join(parts)}{',' if len(parts) == 1 else ''}),"
    if len(line) <= 88:
        return [line]
    out = [f"{indent}("]
    for part in parts:
        if len(f"{indent}    {part},") > 88 and part.startswith("["):
            out += [f"{indent}    [", *[f"{indent}        {t}," for t in part[1:-1].split(", ")], f"{indent}    ],"]
        else:
            out.append(f"{indent}    {part},")
    return out + [f"{indent}),"]


def _ops_literal(ops: list[tuple]) -> str:
    """The inputs as a Python list, one per line, each said in vLLM's terms."""
    lines = []
    for op in ops:
        if op[0] == "arrive":
            rid, tokens, max_tokens, *plan = op[1:]
            said = ", and a load plan" if plan and plan[0] else ""
            lines.append(f"    # add_request: {len(tokens)} prompt tokens, max_tokens {max_tokens}{said}")
            lines += _item(['"arrive"', _py(rid), _tokens(tokens), str(max_tokens), *map(_plan_literal, plan)])
        elif op[0] == "abort":
            lines += ["    # finish_requests(FINISHED_ABORTED)", *_item(['"abort"', _py(op[1])])]
        elif op[0] == "reset":
            lines += ["    # reset_prefix_cache()", *_item(['"reset"'])]
        elif len(op) == 3:
            lines += [f"    # one engine step: up to {op[2]} scheduled drafts accepted, then {op[1]} proposed",
                      *_item(['"step"', str(op[1]), str(op[2])])]
        else:
            lines += ["    # one engine step, as EngineCore.step / step_with_batch_queue", *_item(['"step"'])]
    return "[\n" + "\n".join(lines) + "\n]"


def engine_values(program: EngineProgram, settings: dict[str, Any] | None, version: str,
                  check_estimate: bool) -> dict[str, Any]:
    """The finding's engine settings and inputs, validated, as the literals the
    generated code is filled with (shared by the script and the engine
    finding's test), or ``Unscriptable`` saying why there is none."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version or ""):
        raise Unscriptable("an upstream report is for a published release (X.Y.Z): this finding's subject is not one")
    if not isinstance(settings, dict):
        raise Unscriptable("this finding records no engine settings (what vLLM derived): rerun `kvspec fuzz "
                           "--engine` to record them; no upstream script")
    speculative = _speculative(program.setup, settings)
    connector = settings.get("kv_connector")
    own = connector == OWN_CONNECTOR
    if connector is not None and connector not in _STANDALONE_CONNECTORS and not own:
        raise Unscriptable("the finding's engine settings name a KV connector the upstream script cannot build: "
                           "no upstream script")
    policy = settings.get("kv_load_failure_policy")
    if own and policy not in FAILURE_POLICIES:
        raise Unscriptable("the finding's engine settings name no valid kv_load_failure_policy for its KV "
                           "connector: no upstream script")
    mode = settings.get("mamba_cache_mode")
    if mode not in (None, "none", "align", "all"):
        raise Unscriptable("the finding's engine settings name an unknown mamba_cache_mode: no upstream script")
    retention = settings.get("retention_interval")
    if retention is not None:
        retention = _int(settings, "retention_interval", 0, 1 << 20)
    return {
        "VERSION": version,
        "ASYNC": _bool(settings, "async_scheduling"),
        "QUEUE": _int(settings, "max_concurrent_batches", 1, 16),
        "CACHING": _bool(settings, "enable_caching"),
        "CHUNKED": _bool(settings, "chunked_prefill"),
        "RESERVE_FULL_ISL": _bool(settings, "reserve_full_isl"),
        "MAX_BATCHED": _int(settings, "max_num_batched_tokens", 1, 1 << 20),
        "MAX_SEQS": _int(settings, "max_num_seqs", 1, 4096),
        "MAX_MODEL_LEN": _int(settings, "max_model_len", 1, 1 << 20),
        "NUM_BLOCKS": _int(settings, "num_blocks", 1, 1 << 20),
        "S": _int(settings, "scheduler_block_size", 1, 1 << 12),
        "H": _int(settings, "hash_block_size", 1, 1 << 12),
        "MAMBA_MODE": mode or "none",
        "RETENTION": retention,
        # kvspec's connector: written in the code itself, under its own name.
        "CONNECTOR": SCRIPT_CONNECTOR if own else connector,
        "OWN_CONNECTOR": own,
        "LOAD_FAILURE_POLICY": FAILURE_POLICIES[FAILURE_POLICIES.index(policy)] if own else None,
        "CHECK_ESTIMATE": check_estimate,
        "GROUPS": _groups(settings),
        "OPS": _ops(program, own, bool(speculative)),
        **speculative,
    }


# The speculative methods a script builds (the toys' drafters: model.engine).
_SPECULATIVE_METHODS = ("eagle3", "mtp")


def _speculative(setup: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """The speculative config a script builds, as the user gave it
    (``--speculative-config``: the setup's method, drafts and hash scheme;
    an EAGLE3 drafter's config.json is kvspec's constant, chosen by the toy's
    validated name), checked against what vLLM ran, and the groups vLLM's
    planning flagged as the drafter's.  What vLLM derives from it (the hash
    and prefill lookahead, the EAGLE block drop) the script reads from vLLM.
    Empty without speculative decoding."""
    drafts = _int(settings, "num_speculative_tokens", 0, 8)
    lookahead = _int(settings, "num_hash_lookahead_tokens", 0, 16)
    method = settings.get("speculative_method")
    groups = settings.get("groups") or []
    flagged = [i for i, g in enumerate(groups) if isinstance(g, dict) and (g.get("eagle") or g.get("eagle_group"))]
    if setup.num_speculative_tokens is None:
        if drafts or lookahead or method is not None or flagged:
            raise Unscriptable("the finding's engine settings say vLLM ran speculative decoding, which its engine "
                               "flags do not set: no upstream script")
        return {}
    spec_method = setup.toy.spec_method
    if spec_method not in _SPECULATIVE_METHODS or method != spec_method or drafts != setup.num_speculative_tokens:
        raise Unscriptable("the finding's engine settings do not record the speculative decoding its engine flags "
                           f"set ({', '.join(_SPECULATIVE_METHODS)} with as many drafts): no upstream script")
    # The state blocks vLLM's Mamba layers keep for the drafts (their spec's
    # num_speculative_blocks), as the worker recorded them: one figure a layout.
    mamba = [g for g in groups if isinstance(g, dict) and str(g.get("kind", "")).startswith("mamba")]
    if any("speculative_blocks" not in g for g in mamba):
        raise Unscriptable("the finding's engine settings do not record its Mamba groups' speculative state blocks "
                           "(what vLLM allocates them for the drafts): rerun `kvspec fuzz --engine` to record them; "
                           "no upstream script")
    blocks = {_int(g, "speculative_blocks", 0, 16) for g in mamba}
    if len(blocks) > 1:
        raise Unscriptable("the finding's Mamba groups keep different numbers of speculative state blocks, which "
                           "the script builds as one: no upstream script")
    return {
        "SPECULATIVE": True,
        "MAMBA_SPEC_BLOCKS": blocks.pop() if blocks else 0,
        "SPEC_METHOD": _SPECULATIVE_METHODS[_SPECULATIVE_METHODS.index(spec_method)],
        "NUM_SPEC_TOKENS": setup.num_speculative_tokens,
        "DISABLE_LOOKAHEAD_HASHES": bool(setup.legacy_hashes),
        "EAGLE_GROUPS": [i for i, g in enumerate(groups) if isinstance(g, dict) and g.get("eagle_group") is True],
    }


def engine_code(template: str, program: EngineProgram, values: dict[str, Any]) -> str:
    """``template`` with the shared engine code (``ENGINE_CODE``: the
    settings, the inputs, the scheduler built from vLLM's config classes and
    the driver of its calls) and the validated ``values`` filled in."""
    setup = program.setup
    version = values["VERSION"]
    own, speculative = bool(values.get("OWN_CONNECTOR")), bool(values.get("SPECULATIVE"))
    engine = _with_own_connector(ENGINE_CODE) if own else ENGINE_CODE
    engine = _with_speculation(engine) if speculative else engine
    code = template.replace("@ENGINE_CODE@", engine)
    needed = imports(own, speculative)
    code = code.replace("@IMPORTS@", needed).replace("@SCRIPT_IMPORTS@", _after_environment(needed))
    code = code.replace("vLLM @VERSION@", f"vLLM {version}")  # version: checked X.Y.Z
    for key, value in values.items():
        if key not in ("GROUPS", "OPS", "SPECULATIVE"):
            code = code.replace(f"@{key}@", _py(value))
    code = code.replace("@GROUPS@", "[\n" + "".join(f"    {_py(g)},\n" for g in values["GROUPS"]) + "]")
    code = code.replace("@OPS@", _ops_literal(values["OPS"]))
    # The toy model's config.json is kvspec's own constant, chosen by a validated name (its MTP modules
    # as the setup sets them: a validated count).
    code = code.replace("@MODEL_CONFIG@", _dict_call(setup.hf_config)).replace("@FAMILY@", setup.toy.family)
    if speculative:  # an EAGLE3 drafter's config.json: kvspec's own constant, chosen by the toy's validated name
        drafter = setup.toy.drafter if values["SPEC_METHOD"] == "eagle3" else None
        code = code.replace("@DRAFT_CONFIG@", "None" if drafter is None else _dict_call(drafter))
    code = code.replace("@INSTALL@", install_line(version))
    # kvspec's own rendering of validated fields (numbers, known names), as
    # comment lines within vLLM's line length.
    flags = setup.cli_flags()
    if own:  # kvspec's connector, as the code defines it
        flags = flags.replace(f'"{OWN_CONNECTOR}"', f'"{SCRIPT_CONNECTOR}"').replace(
            f'"{OWN_CONNECTOR_MODULE}"', '"<this file\'s module>"')
    words = f"The engine flags: vllm serve MODEL {flags}".split()
    lines = ["#"]
    for word in words:
        if len(lines[-1]) + 1 + len(word) > 88 and lines[-1] != "#":
            lines.append("#  ")
        lines[-1] += f" {word}" if not lines[-1].endswith("  ") else word
    return code.replace("@FLAGS@", "\n".join(lines))


HAND_BUILT_NOTE = ("the KVCacheConfig (its groups, block sizes and pool size as vLLM derived them for the finding's "
                   "flags) and the scheduler's configuration objects are built from vLLM's public config classes, "
                   "not by the engine's KV-cache planning (which runs in the GPU worker); the layers' state shapes "
                   "are placeholders the scheduler does not read")


# What a script (or test) written for kvspec's connector says of it.
OWN_CONNECTOR_NOTE = (f"The KV connector the finding ran (an out-of-tree one) is written into "
                      f"the file as {SCRIPT_CONNECTOR}, against vLLM's public KVConnectorBase_V1: each request's "
                      "load plan rides in its kv_transfer_params, and the driver runs the connector's worker side "
                      "each step as the model runner does (no KV moves on a CPU).")


def repro_script(program: EngineProgram, settings: dict[str, Any] | None, kind: Category,
                 version: str, rule: RuleCheck | None = None) -> ReproScript:
    """The standalone script for an engine finding of ``kind`` (any kind
    but a crash or a block estimate: written around ``rule``, the check its
    engine test makes), or ``Unscriptable`` saying why there is none."""
    if kind not in UPSTREAM_KINDS and (rule is None or rule.kind is not kind):
        raise Unscriptable(f"no upstream reproduction script is available for {kind.value} findings yet "
                           f"(supported: {', '.join(k.value for k in UPSTREAM_KINDS)} and the kinds an engine test "
                           "is written for)")
    values = engine_values(program, settings, version, kind is Category.STATE_BLOCK_ESTIMATE)
    about = wrap(f"Generated by kvspec from an engine finding on a toy model of the {program.setup.toy.family} "
                 f"family.  Run: {install_line(version)} (the script sets VLLM_TARGET_DEVICE=empty and "
                 "HF_HUB_OFFLINE=1 itself).")
    marker = "AssertionError: block estimate below allocation" if values["CHECK_ESTIMATE"] else ""
    note = HAND_BUILT_NOTE.replace("are built from", "are built by the script from")
    if values["OWN_CONNECTOR"]:
        about += "\n\n" + wrap(OWN_CONNECTOR_NOTE)
        note += f"; {OWN_CONNECTOR_NOTE[:1].lower()}{OWN_CONNECTOR_NOTE[1:-1]}"
    if kind in UPSTREAM_KINDS:
        return ReproScript(engine_code(_TEMPLATE.replace("@ABOUT@", about), program, values), version, kind, marker,
                           note)
    about = wrap(f"Expected: {rule.rule}.  The script exits 1 saying what vLLM did instead (Actual), 0 when the "
                 "rule holds.") + "\n\n" + about
    template = (_RULE_TEMPLATE.replace("@ABOUT@", about).replace("@CHECK@", rule.code)
                .replace("@EXPECTED@", _string_assignment("EXPECTED", rule.rule))
                .replace("@DOC@", _docstring(rule.doc, "    ")).replace("@BODY@", rule.body))
    return ReproScript(engine_code(template, program, values), version, kind, "Actual: ", note, rule.rule)


def _string_assignment(name: str, text: str) -> str:
    """``name = "text"`` as ruff format lays it out: on one line if it fits,
    else adjacent literals in parentheses, one a line (``text``: kvspec's own words)."""
    line = f"{name} = {json.dumps(text)}"
    if len(line) <= 88:
        return line
    pieces = wrap(text, 88 - 4 - 3).split("\n")
    return f"{name} = (\n" + "\n".join(f"    {json.dumps(p + (' ' if i < len(pieces) - 1 else ''))}"
                                        for i, p in enumerate(pieces)) + "\n)"


def _docstring(text: str, indent: str) -> str:
    """A docstring's lines at ``indent``, within vLLM's line length."""
    lines = wrap(text, 88 - len(indent) - 6).split("\n")
    if len(lines) == 1:
        return f'{indent}"""{lines[0]}"""'
    return f'{indent}"""' + f"\n{indent}".join(lines) + f'\n{indent}"""'


@attrs.frozen
class ReproRun:
    reproduced: bool
    returncode: int | None
    tail: str  # the last lines of its output
    seconds: float
    how: str  # how it was run
    ran_clean: bool = False  # exit status 0, having run the inputs to their end (said on its stdout)


def run_repro(script: ReproScript, crash_type: str | None, timeout: float = 600, tree: str | None = None,
              label: str | None = None) -> ReproRun:
    """Run the script in a fresh process on the release's runtime (kvspec's
    CPU runtime with the release's own Python tree first on the path, as a
    ``pip install vllm==X`` gives; ``tree``: another tree holding the vllm
    package, such as a kvspec mutant of the release, named ``label``) and
    judge whether it reproduced: a non-zero exit whose last line is the
    assertion (estimate) or the exception the finding recorded (crash)."""
    import time

    from .provision import ensure_release, ensure_runtime

    python = ensure_runtime()
    tree = tree or ensure_release(script.version)
    whose = "its" if label else "the release's"
    label = label or f"vLLM {script.version}"
    # A clean environment: nothing of kvspec's, vLLM's settings as the script sets them.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VLLM_", "KVSPEC_", "PYTHON")) and k not in ("HF_HUB_OFFLINE",)}
    env["PYTHONPATH"] = str(tree)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvspec-repro-") as tmp:
        path = Path(tmp) / "repro.py"
        path.write_text(script.code, encoding="utf-8")
        try:
            # -B: the release tree keeps only the bytecode kvspec compiled and verifies.
            out = subprocess.run([str(python), "-B", str(path)], capture_output=True, text=True, env=env, cwd=tmp,
                                 timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            return ReproRun(False, None, f"timed out after {timeout:.0f} s", time.perf_counter() - start,
                            f"python repro.py on {label}")
    # No machine-local path in a report: vLLM's files by their path in the
    # package, the script by its name.
    text = (out.stdout + out.stderr).replace(f"{tree}{os.sep}", "").replace(f"{path.parent}{os.sep}", "")
    # ... and the runtime's own packages by their path in the runtime.
    text = text.replace(f"{Path(python).parent.parent}{os.sep}", "")
    lines = text.strip().splitlines()
    last = lines[-1] if lines else ""
    if script.rule:
        # The rule's assertion failed (its message opens with the rule), and the script said so last.
        reproduced = out.returncode == 1 and last.startswith(script.marker) \
            and f"AssertionError: {script.rule}" in text
    elif script.kind is Category.STATE_BLOCK_ESTIMATE:
        reproduced = out.returncode != 0 and last.startswith(script.marker)
    else:
        # A bare assert's exception says nothing: its last line is the class name alone.
        reproduced = out.returncode != 0 and bool(crash_type) \
            and (last == crash_type or last.startswith(f"{crash_type}:")) and "in schedule" in (out.stderr or "")
    clean = out.returncode == 0 and _NO_FAILURE in out.stdout.splitlines()
    return ReproRun(reproduced, out.returncode, "\n".join(lines[-MAX_TAIL_LINES:]), time.perf_counter() - start,
                    f"python repro.py in a fresh process on {label} (CPU runtime, PYTHONPATH = {whose} own Python "
                    "tree)", clean)


# What every script prints once it has run the inputs to their end without failing.
_NO_FAILURE = "no failure: the finding did not reproduce"


# The imports the engine code needs (vLLM's public classes, torch for the
# layers' dtypes), as isort orders them under vLLM's configuration.
IMPORTS = '''\
import torch

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
'''


# What the code imports besides under kvspec's connector (the connector
# written in it and the KVConnectorOutput its worker side reports).
_CONNECTOR_IMPORTS = (
    ("from vllm.sampling_params import SamplingParams\n",
     "from vllm.distributed.kv_transfer.kv_connector.v1.base import (\n    KVConnectorBase_V1,\n"
     "    KVConnectorMetadata,\n    KVConnectorRole,\n    SupportsHMA,\n)\n"
     "from vllm.sampling_params import SamplingParams\n"),
    ("from vllm.v1.outputs import ModelRunnerOutput\n",
     "from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput\n"),
)


def imports(own_connector: bool = False, speculative: bool = False) -> str:
    """IMPORTS, with what the code written for kvspec's connector or for
    speculative decoding needs too."""
    text = _replaced(IMPORTS, _CONNECTOR_IMPORTS) if own_connector else IMPORTS
    return _replaced(text, _SPECULATIVE_IMPORTS) if speculative else text


def _replaced(text: str, changes: tuple[tuple[str, str], ...]) -> str:
    for old, new in changes:
        if text.count(old) != 1:  # the templates are kvspec's own: a change that misses is kvspec's bug
            raise AssertionError(f"the engine code template holds {text.count(old)} of {old!r}")
        text = text.replace(old, new)
    return text


def _after_environment(imports: str) -> str:
    # The script sets vLLM's environment before importing it (ruff's E402, said once a statement).
    # An import the comment takes past the line length is wrapped, as isort does.
    out = []
    for line in imports.splitlines():
        if line.startswith(("import ", "from ")):
            head, _, names = line.partition(" import ")
            if len(line) + len("  # noqa: E402") > 88 and not names.startswith("("):
                out += [f"{head} import (  # noqa: E402", *(f"    {n}," for n in names.split(", ")), ")"]
                continue
            line = f"{line}  # noqa: E402"
        out.append(line)
    return "\n".join(out) + "\n"


# The engine code the script and the engine finding's test share: the
# finding's settings and inputs, the scheduler built from vLLM's config
# classes, and the driver making the engine's calls (add_request, schedule,
# update_from_output with a ModelRunnerOutput, finish_requests,
# reset_prefix_cache) as EngineCore does.
ENGINE_CODE = '''\
# The toy model's config.json the engine was built from.
MODEL_CONFIG = @MODEL_CONFIG@
@FLAGS@
# What vLLM @VERSION@ derived for them (other settings: the release's defaults).
ASYNC_SCHEDULING = @ASYNC@
MAX_CONCURRENT_BATCHES = @QUEUE@
ENABLE_PREFIX_CACHING = @CACHING@
MAX_NUM_BATCHED_TOKENS = @MAX_BATCHED@
MAX_NUM_SEQS = @MAX_SEQS@
MAX_MODEL_LEN = @MAX_MODEL_LEN@
CHUNKED_PREFILL = @CHUNKED@
RESERVE_FULL_ISL = @RESERVE_FULL_ISL@
NUM_BLOCKS = @NUM_BLOCKS@
SCHEDULER_BLOCK_SIZE = @S@
HASH_BLOCK_SIZE = @H@
MAMBA_CACHE_MODE = @MAMBA_MODE@
RETENTION_INTERVAL = @RETENTION@
KV_CONNECTOR = @CONNECTOR@
# (kind, block size, sliding window, layers, a Mamba layer's prefill checkpoint
# blocks and alignment)
GROUPS = @GROUPS@
# The engine inputs, in order.
OPS = @OPS@


def accepted(cls, **kwargs):
    \"\"\"The keywords this release's ``cls`` takes (constructors gain keywords
    over releases).\"\"\"
    names = set(inspect.signature(cls).parameters)
    return cls(**{k: v for k, v in kwargs.items() if k in names})


def spec(kind, block_size, window, checkpoint_blocks, checkpoint_alignment):
    if kind == "mamba_align":
        # The prefill checkpoint as the model's Mamba layer declares it (the
        # scheduler splits prefills at block boundaries without one).
        return accepted(
            MambaSpec,
            block_size=block_size,
            shapes=((4, 4),),
            dtypes=(torch.float16,),
            mamba_cache_mode="align",
            num_prefill_checkpoint_blocks=checkpoint_blocks,
            prefill_checkpoint_alignment=checkpoint_alignment,
        )
    if kind == "sliding_window":
        return SlidingWindowSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=8,
            dtype=torch.float16,
            sliding_window=window,
        )
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16
    )


def make_scheduler(model_dir):
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(MODEL_CONFIG, f)
    transfer = None
    if KV_CONNECTOR is not None:
        transfer = KVTransferConfig(kv_connector=KV_CONNECTOR, kv_role="kv_both")
    cache_block = min(group[1] for group in GROUPS)
    vllm_config = VllmConfig(
        model_config=ModelConfig(
            model=model_dir, skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN
        ),
        cache_config=accepted(
            CacheConfig,
            block_size=cache_block,
            enable_prefix_caching=ENABLE_PREFIX_CACHING,
            mamba_cache_mode=MAMBA_CACHE_MODE,
        ),
        scheduler_config=accepted(
            SchedulerConfig,
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=CHUNKED_PREFILL,
            async_scheduling=ASYNC_SCHEDULING,
            scheduler_reserve_full_isl=RESERVE_FULL_ISL,
            is_encoder_decoder=False,
        ),
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=transfer,
    )
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    # Built here rather than by the engine's KV-cache planning (which runs in
    # the GPU worker): the groups, block sizes and pool vLLM derived for these flags.
    groups, index = [], 0
    for kind, block, window, layers, *checkpoint in GROUPS:
        names = [f"model.layers.{index + i}" for i in range(layers)]
        index += layers
        groups.append(KVCacheGroupSpec(names, spec(kind, block, window, *checkpoint)))
    kv_cache_config = accepted(
        KVCacheConfig,
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=RETENTION_INTERVAL,
        hash_block_size=HASH_BLOCK_SIZE,
    )
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    # AsyncScheduler takes *args, **kwargs: its keywords are the first named
    # ones in its MRO.
    named = next(
        c.__init__
        for c in cls.__mro__
        if "vllm_config" in inspect.signature(c.__init__).parameters
    )
    wanted = dict(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=SCHEDULER_BLOCK_SIZE,
        hash_block_size=HASH_BLOCK_SIZE,
        log_stats=False,
    )
    names = set(inspect.signature(named).parameters)
    return cls(**{k: v for k, v in wanted.items() if k in names})


def watch_estimates(scheduler, log=None):
    \"\"\"Each allocate_slots: the blocks each group estimated (the figure the
    scheduler checks against the free pool) against the free blocks it took.\"\"\"
    manager = scheduler.kv_cache_manager
    managers = manager.coordinator.single_type_managers
    allocate, pool = manager.allocate_slots, manager.block_pool

    def allocate_slots(request, *args, **kwargs):
        estimates = [None] * len(managers)
        for i, m in enumerate(managers):

            def recorded(*a, _original=m.get_num_blocks_to_allocate, _i=i, **k):
                estimates[_i] = _original(*a, **k)
                return estimates[_i]

            m.get_num_blocks_to_allocate = recorded
        free_before = pool.get_num_free_blocks()
        try:
            out = allocate(request, *args, **kwargs)
        finally:
            for m in managers:
                del m.get_num_blocks_to_allocate
        taken = free_before - pool.get_num_free_blocks()
        if out is not None and None not in estimates:
            if log is not None:
                log(
                    f"allocate_slots({request.request_id}): groups estimated "
                    f"{estimates}, took {taken} free blocks"
                )
            assert taken <= sum(estimates), (
                f"block estimate below allocation: allocate_slots for request "
                f"{request.request_id} took {taken} free blocks, but the KV-cache "
                f"groups' get_num_blocks_to_allocate estimated {sum(estimates)} "
                f"({', '.join(map(str, estimates))}), the figure the scheduler "
                f"checked against the free pool"
            )
        return out

    manager.allocate_slots = allocate_slots


def drive(scheduler, ops, log=None, check=None):
    \"\"\"The engine inputs in order, as EngineCore issues them; ``check`` runs
    after each schedule() with the tokens each running request had processed.\"\"\"
    hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(HASH_BLOCK_SIZE, hash_fn)
    token, queue = 100_000, []

    def execute(output, allotted):
        # The model runner's part: one sampled token per request whose prompt is done.
        nonlocal token
        ids = list(output.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            sampled.append([token + 1] if allotted[rid] else [])
            token += bool(allotted[rid])
        scheduler.update_from_output(
            output,
            accepted(
                ModelRunnerOutput,
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled,
            ),
        )

    for op in ops:
        if op[0] == "arrive":
            _, rid, tokens, max_tokens = op
            scheduler.add_request(
                accepted(
                    Request,
                    request_id=rid,
                    prompt_token_ids=tokens,
                    sampling_params=SamplingParams(
                        max_tokens=max_tokens, ignore_eos=True
                    ),
                    pooling_params=None,
                    block_hasher=hasher,
                    eos_token_id=None,
                    arrival_time=0.0,
                )
            )
        elif op[0] == "abort":
            scheduler.finish_requests(op[1], RequestStatus.FINISHED_ABORTED)
        elif op[0] == "reset":
            scheduler.reset_prefix_cache()
        elif (
            scheduler.has_requests() or queue
        ):  # an engine step (EngineCore.step / step_with_batch_queue)
            if scheduler.has_requests():
                processed = {
                    r.request_id: r.num_computed_tokens
                    - getattr(r, "num_in_flight_tokens", 0)
                    for r in scheduler.running
                }
                output = scheduler.schedule()
                if log is not None:
                    log(f"schedule(): {dict(output.num_scheduled_tokens)}")
                if check is not None:
                    check(scheduler, processed)
                allotted = {}
                for rid in output.num_scheduled_tokens:
                    request = scheduler.requests.get(rid)
                    allotted[rid] = request is not None and not getattr(
                        request,
                        "is_prefill_chunk",
                        request.num_computed_tokens
                        < request.num_tokens
                        + getattr(request, "num_output_placeholders", 0),
                    )
                if not ASYNC_SCHEDULING:
                    execute(output, allotted)
                    continue
                queue.insert(0, (output, allotted))
                if len(queue) < MAX_CONCURRENT_BATCHES and (
                    output.total_num_scheduled_tokens > 0 or scheduler.has_requests()
                ):
                    continue
            execute(*queue.pop())
'''


# kvspec's own KV connector's behaviour, as a connector written against vLLM's
# public KVConnectorBase_V1 in the code itself (vLLM imports it from this
# module: kv_connector_module_path), and its worker side as the engine driver
# runs it each step.  The requests' load plans ride in their kv_transfer_params.
CONNECTOR_CODE = '''\
PLAN_KEY = "external_load"


class ExternalLoadMetadata(KVConnectorMetadata):
    \"\"\"The loads a step's schedule() started, for the worker side.\"\"\"

    def __init__(self, loads):
        self.loads = loads


class ExternalStoreConnector(KVConnectorBase_V1, SupportsHMA):
    \"\"\"A KV connector loading a request's leading prompt tokens from an external
    store, as the request's kv_transfer_params[PLAN_KEY] plans it: the store
    holds "offer" prompt tokens, loaded asynchronously or not ("async"); an
    asynchronous load finishes "delay" executed steps after the step that
    started it; the "fail"-th loaded block fails to load (None: none does).
    No KV moves on a CPU: the worker side reports what the loads did, in the
    KVConnectorOutput the model runner returns.\"\"\"

    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        groups = kv_cache_config.kv_cache_groups if kv_cache_config else []
        # vLLM maps invalid_block_ids back to requests on one-group layouts
        # only: a load fails only there.
        self.one_group = len(groups) == 1
        self.block_size = groups[0].kv_cache_spec.block_size if groups else 1
        self.asked = {}  # request id -> (local hit, external tokens, async)
        self.started = []  # loads started since the last build_connector_meta
        self.pending = []  # worker side: [steps left, load] of async loads
        self.finished, self.invalid = set(), set()

    # -- scheduler side ----------------------------------------------------
    @staticmethod
    def plan(request):
        return (request.kv_transfer_params or {}).get(PLAN_KEY)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        plan = self.plan(request)
        if not plan:
            return 0, False
        load_async = plan["async"]
        # The store holds prompt tokens only; a synchronous load leaves the
        # last token to compute, an asynchronous one may cover the prompt.
        limit = min(
            plan["offer"],
            request.num_prompt_tokens,
            request.num_tokens - (0 if load_async else 1),
        )
        external = max(0, limit - num_computed_tokens)
        load_async = load_async and external > 0
        self.asked[request.request_id] = (num_computed_tokens, external, load_async)
        return external, load_async

    def may_load_async(self, request):
        plan = self.plan(request)
        return bool(plan and plan["async"])

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return  # nothing to load, or an async load's second call
        plan = self.plan(request) or {}
        local, _, load_async = self.asked.get(
            request.request_id, (0, num_external_tokens, False)
        )
        ids = blocks.get_block_ids()[0] if blocks is not None else []
        first = local // self.block_size
        end = -(-(local + num_external_tokens) // self.block_size)
        loaded = list(ids[first:end])
        failing = None
        if plan.get("fail") is not None and self.one_group and loaded:
            failing = loaded[plan["fail"] % len(loaded)]
        self.started.append(
            {
                "request": request.request_id,
                "async": load_async,
                "delay": plan.get("delay", 0),
                "failing": failing,
            }
        )

    def build_connector_meta(self, scheduler_output):
        started, self.started = self.started, []
        return ExternalLoadMetadata(started)

    def request_finished(self, request, block_ids):
        self.asked.pop(request.request_id, None)
        return False, None  # nothing is sent: the blocks are freed at once

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    # -- worker side: reports the loads the step's metadata started ----------
    def start_load_kv(self, forward_context, **kwargs):
        self.finished, self.invalid = set(), set()
        for load in self._get_connector_metadata().loads:
            if load["async"]:
                self.pending.append([load["delay"], load])
            elif load["failing"] is not None:
                self.invalid.add(load["failing"])
        waiting = []
        for steps_left, load in self.pending:
            if steps_left > 0:
                waiting.append([steps_left - 1, load])
                continue
            self.finished.add(load["request"])
            if load["failing"] is not None:
                self.invalid.add(load["failing"])
        self.pending = waiting

    def get_finished(self, finished_req_ids):
        return None, self.finished

    def get_block_ids_with_load_errors(self):
        return self.invalid

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def wait_for_save(self):
        return None


def kv_connector_output(worker, output):
    \"\"\"The connector's worker side for one step, as the model runner runs it:
    what finished loading and which blocks failed (None: nothing to say).\"\"\"
    worker.bind_connector_metadata(output.kv_connector_metadata)
    worker.start_load_kv(None)
    _, finished = worker.get_finished(set())
    invalid = worker.get_block_ids_with_load_errors()
    worker.clear_connector_metadata()
    if not finished and not invalid:
        return None
    return KVConnectorOutput(finished_recving=finished, invalid_block_ids=invalid)
'''

# Where the engine code differs under kvspec's connector (each found once).
_OWN_CONNECTOR_CHANGES = (
    ("KV_CONNECTOR = @CONNECTOR@\n",
     "KV_CONNECTOR = @CONNECTOR@\nKV_LOAD_FAILURE_POLICY = @LOAD_FAILURE_POLICY@\n"),
    ("\n\ndef make_scheduler(model_dir):\n", "\n\n" + CONNECTOR_CODE + "\n\ndef make_scheduler(model_dir):\n"),
    ("""        transfer = KVTransferConfig(kv_connector=KV_CONNECTOR, kv_role="kv_both")
""", """        # The connector is defined in this module.
        transfer = KVTransferConfig(
            kv_connector=KV_CONNECTOR,
            kv_role="kv_both",
            kv_connector_module_path=__name__,
            kv_load_failure_policy=KV_LOAD_FAILURE_POLICY,
        )
"""),
    ("""    token, queue = 100_000, []

    def execute(output, allotted):
""", """    token, queue = 100_000, []
    # The connector's worker side, which the model runner runs each step.
    worker = ExternalStoreConnector(
        scheduler.vllm_config, KVConnectorRole.WORKER, scheduler.kv_cache_config
    )

    def execute(output, allotted, loads):
"""),
    ("""                sampled_token_ids=sampled,
            ),
""", """                sampled_token_ids=sampled,
                kv_connector_output=loads,
            ),
"""),
    ("""            _, rid, tokens, max_tokens = op
""", """            _, rid, tokens, max_tokens, plan = op
            # The request's load plan rides in its kv_transfer_params.
            extra_args = None
            if plan is not None:
                extra_args = {"kv_transfer_params": {PLAN_KEY: plan}}
"""),
    ("""                    sampling_params=SamplingParams(
                        max_tokens=max_tokens, ignore_eos=True
                    ),
""", """                    sampling_params=SamplingParams(
                        max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args
                    ),
"""),
    ("""                allotted = {}
""", """                loads = kv_connector_output(worker, output)
                allotted = {}
"""),
    ("""                    execute(output, allotted)
""", """                    execute(output, allotted, loads)
"""),
    ("""                queue.insert(0, (output, allotted))
""", """                queue.insert(0, (output, allotted, loads))
"""),
)


def _with_own_connector(code: str) -> str:
    """The engine code under kvspec's connector: the connector written in it,
    its load plans carried, its worker side's KVConnectorOutput returned."""
    return _replaced(code, _OWN_CONNECTOR_CHANGES)


# The speculative config as EngineArgs makes it from --speculative-config, and
# the drafts each step proposes (EngineCore.post_step under synchronous
# scheduling) and accepts (the model runner's sampled tokens).
SPECULATIVE_CODE = '''\


def speculative_config(model_dir, model_config, parallel_config):
    \"\"\"The speculative config as EngineArgs builds it from --speculative-config:
    vLLM derives the drafter's settings and the lookahead from it.\"\"\"
    options = dict(
        method=SPECULATIVE_METHOD, num_speculative_tokens=NUM_SPECULATIVE_TOKENS
    )
    if DRAFT_MODEL_CONFIG is not None:
        options["model"] = os.path.join(model_dir, "draft")
        os.makedirs(options["model"])
        with open(os.path.join(options["model"], "config.json"), "w") as f:
            json.dump(DRAFT_MODEL_CONFIG, f)
    if DISABLE_LOOKAHEAD_BLOCK_HASHES:
        options["disable_lookahead_block_hashes"] = True
    return SpeculativeConfig(
        **options,
        target_model_config=model_config,
        target_parallel_config=parallel_config,
    )


def propose_drafts(scheduler, output, num_drafts):
    \"\"\"EngineCore.post_step under synchronous scheduling: the drafter's proposals
    for the next step (up to num_speculative_tokens) for the requests the step
    ran (async scheduling keeps them in the worker).\"\"\"
    num_drafts = min(
        num_drafts, scheduler.vllm_config.speculative_config.num_speculative_tokens
    )
    if num_drafts > 0:
        ids = [rid for rid in output.num_scheduled_tokens if rid in scheduler.requests]
        drafts = DraftTokenIds(ids, [[7] * num_drafts for _ in ids])
        scheduler.update_draft_token_ids(drafts)
'''

# Where the engine code differs under speculative decoding (each found once;
# applied after the connector's changes, which it leaves as they are).
_SPECULATIVE_CHANGES = (
    ("# (kind, block size, sliding window, layers,",
     """# Speculative decoding (--speculative-config): the method, the drafts a step
# verifies at most, whether lookahead block hashes are off, and the EAGLE3
# drafter's config.json (None: the model's own MTP modules).  What vLLM derives
# from them (the hash and prefill lookahead, the EAGLE block drop) is read from
# the VllmConfig it builds.
SPECULATIVE_METHOD = @SPEC_METHOD@
NUM_SPECULATIVE_TOKENS = @NUM_SPEC_TOKENS@
DISABLE_LOOKAHEAD_BLOCK_HASHES = @DISABLE_LOOKAHEAD_HASHES@
DRAFT_MODEL_CONFIG = @DRAFT_CONFIG@
# The groups holding the drafter's layers, flagged by vLLM's planning, and
# the state blocks a Mamba layer keeps for the drafts (its spec's).
EAGLE_GROUPS = @EAGLE_GROUPS@
MAMBA_SPECULATIVE_BLOCKS = @MAMBA_SPEC_BLOCKS@
# (kind, block size, sliding window, layers,"""),
    ("\n\ndef make_scheduler(model_dir):\n", SPECULATIVE_CODE + "\n\ndef make_scheduler(model_dir):\n"),
    ("""            prefill_checkpoint_alignment=checkpoint_alignment,
""", """            prefill_checkpoint_alignment=checkpoint_alignment,
            num_speculative_blocks=MAMBA_SPECULATIVE_BLOCKS,
"""),
    ("""    vllm_config = VllmConfig(
        model_config=ModelConfig(
            model=model_dir, skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN
        ),
""", """    model_config = ModelConfig(
        model=model_dir, skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN
    )
    parallel_config = ParallelConfig()
    vllm_config = VllmConfig(
        model_config=model_config,
        parallel_config=parallel_config,
        speculative_config=speculative_config(model_dir, model_config, parallel_config),
"""),
    ("""        groups.append(KVCacheGroupSpec(names, spec(kind, block, window, *checkpoint)))
""", """        groups.append(
            accepted(
                KVCacheGroupSpec,
                layer_names=names,
                kv_cache_spec=spec(kind, block, window, *checkpoint),
                is_eagle_group=len(groups) in EAGLE_GROUPS,
            )
        )
"""),
    ("""    hasher = kv_cache_utils.get_request_block_hasher(HASH_BLOCK_SIZE, hash_fn)
""", """    # Lookahead block hashes cover the tokens vLLM derived for the drafter.
    lookahead = getattr(scheduler.vllm_config, "num_hash_lookahead_tokens", 0)
    hasher = kv_cache_utils.get_request_block_hasher(
        HASH_BLOCK_SIZE, hash_fn, *((lookahead,) if lookahead else ())
    )
"""),
    ("""    def execute(output, allotted""", """    def execute(num_accepted, output, allotted"""),
    ("""        # The model runner's part: one sampled token per request whose prompt is done.
        nonlocal token
        ids = list(output.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            sampled.append([token + 1] if allotted[rid] else [])
            token += bool(allotted[rid])
""", """        # The model runner's part: per request whose prompt is done, a sampled
        # token and up to num_accepted of the drafts the step verified.
        nonlocal token
        ids = list(output.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            num_sampled = min(num_accepted + 1, allotted[rid])
            sampled.append(list(range(token + 1, token + 1 + num_sampled)))
            token += num_sampled
"""),
    ("""                        + getattr(request, "num_output_placeholders", 0),
                    )
""", """                        + getattr(request, "num_output_placeholders", 0),
                    )
                    if allotted[rid]:  # the token, and the drafts it verifies
                        drafts = output.scheduled_spec_decode_tokens.get(rid, ())
                        allotted[rid] = 1 + len(drafts)
"""),
    ("""                    execute(output, allotted""", """                    execute(op[2], output, allotted"""),
    ("""                    continue
                queue.insert(0, (""", """                    if output.total_num_scheduled_tokens > 0:
                        propose_drafts(scheduler, output, op[1])
                    continue
                queue.insert(0, ("""),
    ("""            execute(*queue.pop())
""", """            execute(op[2], *queue.pop())
"""),
)


def _with_speculation(code: str) -> str:
    """The engine code under speculative decoding: vLLM's SpeculativeConfig
    built from the flags, the drafter's groups flagged, lookahead hashes as
    vLLM derived them, drafts proposed after each step and accepted in its
    output as kvspec's engine driver does."""
    return _replaced(code, _SPECULATIVE_CHANGES)


_SPECULATIVE_IMPORTS = (
    ("    ModelConfig,\n", "    ModelConfig,\n    ParallelConfig,\n"),
    ("    SchedulerConfig,\n", "    SchedulerConfig,\n    SpeculativeConfig,\n"),
    ("from vllm.v1.outputs import ", "from vllm.v1.outputs import DraftTokenIds, "),
)


_TEMPLATE = '''\
\"\"\"Reproduction through vLLM's real Scheduler, on CPU (no GPU needed).

@ABOUT@
\"\"\"

import inspect
import json
import os
import tempfile

os.environ.setdefault("VLLM_TARGET_DEVICE", "empty")  # the scheduler needs no GPU
os.environ.setdefault("HF_HUB_OFFLINE", "1")

@SCRIPT_IMPORTS@
@ENGINE_CODE@

CHECK_ESTIMATE = @CHECK_ESTIMATE@


def main():
    with tempfile.TemporaryDirectory() as model_dir:
        scheduler = make_scheduler(model_dir)
    if CHECK_ESTIMATE:
        watch_estimates(scheduler, log=print)
    drive(scheduler, OPS, log=print)
    print("no failure: the finding did not reproduce")


if __name__ == "__main__":
    main()
'''


# A rule's script: the engine code, the rule's check as the engine test
# makes it, and a main saying the rule (Expected) and what vLLM did (Actual).
_RULE_TEMPLATE = '''\
\"\"\"Reproduction through vLLM's real Scheduler, on CPU (no GPU needed).

@ABOUT@
\"\"\"

import inspect
import json
import os
import sys
import tempfile
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "empty")  # the scheduler needs no GPU
os.environ.setdefault("HF_HUB_OFFLINE", "1")

@SCRIPT_IMPORTS@
@ENGINE_CODE@@CHECK@

# The rule vLLM's scheduler and KV cache manager keep.
@EXPECTED@


def check_rule(scheduler):
@DOC@
@BODY@


def main():
    with tempfile.TemporaryDirectory() as model_dir:
        scheduler = make_scheduler(model_dir)
    try:
        check_rule(scheduler)
    except AssertionError as error:
        if not str(error).startswith(EXPECTED):
            raise  # not the rule's check: vLLM's own assert
        traceback.print_exc()
        actual = str(error).removeprefix(EXPECTED).removeprefix(": ")
        print(f"Expected: {EXPECTED}", file=sys.stderr)
        print(f"Actual: {actual}", file=sys.stderr)
        sys.exit(1)
    print("no failure: the finding did not reproduce")


if __name__ == "__main__":
    main()
'''
