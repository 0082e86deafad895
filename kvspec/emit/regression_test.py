"""Emit a regression test in vLLM's own idiom from a finding.

The test is for ``tests/v1/core/`` of the release under test, small enough to
paste: it builds the finding's ``KVCacheConfig`` the way vLLM's prefix-cache
tests do and, where the release's tests have them (``vllm_tests.Idiom``),
takes the manager and the request from the helpers in
``tests/v1/core/test_prefix_caching.py``; it spies on each group manager's
``cache_blocks`` with ``monkeypatch``, drives the request through the
finding's own steps (straight-line code, one comment per step) and makes
one assertion on the recorded bounds.  The hash scheme and the EAGLE
settings are explicit, each with the reason.  Nothing in it names kvspec or
a mutant: it says what vLLM must do, not who found that it does not.

Safety: a finding may come from a file kvspec did not write.  Everything the
emitter writes into code is rebuilt from validated, typed values
(``_trusted``); no string of a finding is ever copied into the test.

``emit_test(..., xfail=True)`` is the same test marked
``xfail(strict=True)``: how vLLM pins a known defect until it is fixed (and
the mark fails the run the day the fix lands, so it is removed then).
"""

from __future__ import annotations

from typing import Any

from kvspec.model.capabilities import Capabilities, expected_regime
from kvspec.model.case import Case
from kvspec.model.errors import InputError
from kvspec.model.finding import Finding

from .vllm_tests import SPEC_CLASSES, Idiom, kv_cache_group_lines

__all__ = ["ASSERT_MESSAGE", "LOOKUP_ASSERT_MESSAGE", "ASSERT_MESSAGES", "FILE_NAME", "emit_test",
           "test_file_name", "test_name", "pytest_command", "xfail_decorator"]

# The emitted assertions' messages: a failure counts only when it is one of these.
ASSERT_MESSAGE = "cache_blocks bound per group"
LOOKUP_ASSERT_MESSAGE = "later request's prefix-cache hit"
ASSERT_MESSAGES = (ASSERT_MESSAGE, LOOKUP_ASSERT_MESSAGE)
# Where the test goes in vLLM's repository.
FILE_NAME = "test_prefix_cache_registration.py"
TEST_DIR = "tests/v1/core"

_LOOKUP_CATEGORIES = ("lookup_contract", "hit_mismatch")

_LAYER_NAMES = {"full_attention": "full", "sliding_window": "swa", "mamba_align": "mamba"}
_KIND_WORDS = {"full_attention": "full-attention", "sliding_window": "sliding-window",
               "mamba_align": 'Mamba "align"'}


def test_file_name(f: Finding) -> str:
    """The file the test is written to (one file: a finding's test goes in it)."""
    return FILE_NAME


test_file_name.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


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
    ints.  A finding read from a file is untrusted input."""
    import attrs

    try:
        inputs = Case.from_dict(f.inputs).as_dict()
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise InputError(f"the finding's case is not one kvspec can emit a test for ({exc})") from None
    for key in ("expected_calls", "admissible_hits"):
        if key in f.inputs:
            inputs[key] = _ints(f.inputs[key], key)
    if "expected_hit" in f.inputs:
        inputs["expected_hit"] = _ints([f.inputs["expected_hit"]], "expected_hit")[0]
    calls = inputs.get("expected_calls")
    groups = len(inputs["config"]["groups"])
    if calls is not None and (not calls or any(not isinstance(c, list) or None in c or len(c) != groups
                                               for c in calls) or len(calls) > len(inputs["steps"])):
        raise InputError("expected_calls: one list of per-group bounds per step, no gaps")
    return attrs.evolve(f, inputs=inputs, sweep=None, explanation=None, regression_test=None,
                        compared={"capabilities": f.compared.get("capabilities") or {}})


def test_name(f: Finding, capabilities: Capabilities | None = None) -> str:
    """The test function's name, from the scenario (never from a finding's
    text), for the subject's capabilities (by default as the finding records them)."""
    f = _trusted(f)
    return _test_name(f, capabilities or f.subject_capabilities())


test_name.__test__ = False  # type: ignore[attr-defined]


def _regime(f: Finding, capabilities: Capabilities):
    return expected_regime(Case.from_dict(f.inputs).config, capabilities)


def _test_name(f: Finding, capabilities: Capabilities | None = None) -> str:
    config = f.inputs["config"]
    groups = config["groups"]
    steps = f.inputs["steps"]
    lookup = f.category.value in _LOOKUP_CATEGORIES
    tags = ["prefix_hit" if lookup else "cache_blocks_bound"]
    if len({g["kind"] for g in groups}) > 1:
        tags.append("hybrid")
    if any(g["eagle"] for g in groups):
        tags.append("eagle")
    regime = _regime(f, capabilities or Capabilities())
    if regime.partial_hash_hits:
        tags.append("partial_hits")
    if config["num_prefill_lookahead"]:
        tags.append("reprefill")
    if any(s["kind"] == "decode" for s in steps[: _calls(f)]):
        tags.append("after_decode")
    return "test_" + "_".join(tags)


def _calls(f: Finding) -> int:
    """How many of the finding's steps the test drives: up to the call that differs."""
    calls = f.inputs.get("expected_calls")
    return len(calls) if calls else len(f.inputs["steps"])


def pytest_command(f: Finding, capabilities: Capabilities | None = None) -> str:
    """The command that runs the test from the root of vLLM's repository."""
    return f"pytest {TEST_DIR}/{FILE_NAME}::{test_name(f, capabilities)}"


def xfail_decorator(f: Finding) -> str:
    """The mark that pins the defect instead: the test passes while vLLM is
    wrong and fails (strict) once it is fixed."""
    return _xfail_line(_trusted(f))


def _xfail_line(f: Finding) -> str:
    what = "hit" if f.category.value in _LOOKUP_CATEGORIES else "bound"
    return f'@pytest.mark.xfail(strict=True, reason="known defect: {what} differs")'


def emit_test(f: Finding, capabilities: Capabilities, idiom: Idiom | None = None,
              xfail: bool = False) -> str | None:
    """The test's source, or None when the finding has nothing to pin.

    ``idiom``: what the release's own tests offer (None: nothing known, so
    the test builds the manager and the request itself)."""
    f = _trusted(f)
    idiom = idiom or Idiom()
    if f.category.value in _LOOKUP_CATEGORIES:
        if not f.inputs.get("probe") or ("expected_hit" not in f.inputs
                                         and "admissible_hits" not in f.inputs):
            return None
    elif not f.inputs.get("expected_calls"):
        return None
    return _Emitter(f, capabilities, idiom, xfail).source()


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


class _Emitter:
    """Writes one test; every number comes from the trusted finding."""

    def __init__(self, f: Finding, capabilities: Capabilities, idiom: Idiom, xfail: bool):
        self.f, self.caps, self.idiom, self.xfail = f, capabilities, idiom, xfail
        self.config = f.inputs["config"]
        self.groups = self.config["groups"]
        self.case = Case.from_dict(f.inputs)
        self.regime = expected_regime(self.case.config, capabilities)
        self.lookup = f.category.value in _LOOKUP_CATEGORIES
        self.steps = list(f.inputs["steps"])[: _calls(f)] if not self.lookup else list(f.inputs["steps"])
        self.name = _test_name(f, capabilities)

    # -- the file -----------------------------------------------------------
    def source(self) -> str:
        lines = [
            *self.idiom.header,  # the release's own licence lines, when its test files were read
            f'"""{self._module_doc()}"""',
            "",
            *self._imports(),
            "",
            f"HASH_BLOCK_SIZE = {self.config['hash_block_size']}",
            "",
            "",
        ]
        if not self.lookup:
            lines += self._recorder() + ["", ""]
        if self.xfail:
            lines.append(_xfail_line(self.f))
        lines.append(f"def {self.name}({'' if self.lookup else 'monkeypatch'}):")
        lines += self._docstring()
        lines += self._setup()
        lines += self._drive()
        lines += self._lookup_assertion() if self.lookup else self._bound_assertion()
        return "\n".join(lines) + "\n"

    def _module_doc(self) -> str:
        if self.lookup:
            return "Prefix-cache hits a later request gets from what an earlier one registered."
        return "How many computed tokens each KV-cache group registers in the prefix cache."

    def _imports(self) -> list[str]:
        third = (["import pytest"] if self.xfail else []) + ["import torch"]
        kinds = sorted({SPEC_CLASSES[g["kind"]] for g in self.groups} | {"KVCacheConfig", "KVCacheGroupSpec"},
                       key=str)
        first = []
        if self.idiom.helpers:
            first.append("from tests.v1.core.test_prefix_caching import make_kv_cache_manager, make_request")
        else:
            first.append("from vllm.sampling_params import SamplingParams")
        first.append("from vllm.utils.hashing import sha256")
        if not self.idiom.helpers:
            first.append("from vllm.v1.core.kv_cache_manager import KVCacheManager")
            first.append("from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash")
        else:
            first.append("from vllm.v1.core.kv_cache_utils import init_none_hash")
        first += ["from vllm.v1.kv_cache_interface import (", *[f"    {k}," for k in kinds], ")"]
        if not self.idiom.helpers:
            first.append("from vllm.v1.request import Request")
        return third + [""] + first

    def _recorder(self) -> list[str]:
        return [
            "def record_cache_blocks_bounds(monkeypatch, coordinator):",
            '    """Spy on each group\'s cache_blocks: the token bound of every call."""',
            "    recorded = [[] for _ in coordinator.single_type_managers]",
            "    for group_id, manager in enumerate(coordinator.single_type_managers):",
            "        original = manager.cache_blocks",
            "",
            "        def spy(request, num_tokens, *args, _id=group_id, _orig=original, **kwargs):",
            "            recorded[_id].append(num_tokens)",
            "            return _orig(request, num_tokens, *args, **kwargs)",
            "",
            '        monkeypatch.setattr(manager, "cache_blocks", spy)',
            "    return recorded",
        ]

    # -- words --------------------------------------------------------------
    def _layout(self) -> str:
        parts = []
        for i, g in enumerate(self.groups):
            word = _KIND_WORDS[g["kind"]]
            extra = f", window {g['sliding_window']}" if g["kind"] == "sliding_window" else ""
            parts.append(f"{word} (block {g['block_size']}{extra}{', EAGLE' if g['eagle'] else ''})")
        return ", ".join(parts)

    def _scenario(self) -> str:
        words = []
        for step in self.steps:
            if step["kind"] == "prefill":
                words.append(f"a prefill of {_plural(step['tokens'], 'token')}")
            elif step["drafts"]:
                words.append(f"a decode step with {_plural(step['drafts'], 'draft token')} "
                             f"({step['accepted']} accepted)")
            else:
                words.append("a decode step")
        if len(words) > 1:
            return ", ".join(words[:-1]) + " and " + words[-1]
        return words[0]

    def _docstring(self) -> list[str]:
        c = self.config
        regime = []
        if self.regime.partial_hash_hits:
            regime.append("partial hash hits on")
        if c["num_prefill_lookahead"]:
            regime.append(f"num_prefill_lookahead {c['num_prefill_lookahead']}")
        head = (f"Groups {self._layout()}; scheduler block {c['scheduler_block_size']}, hash block "
                f"{c['hash_block_size']}" + (f"; {', '.join(regime)}" if regime else "") + ".")
        prompt = f"a {self.case.prompt_len}-token prompt"
        if self.lookup:
            probe = self.f.inputs["probe"]
            body = (f"After {self._scenario()} ({prompt}), a later request sharing the first "
                    f"{_plural(probe['shared'], 'token')} looks up: it must hit exactly what the "
                    "earlier request registered and a lookup can reach.")
        else:
            calls = self.f.inputs["expected_calls"]
            body = (f"After {self._scenario()} ({prompt}), each cache_blocks call must let every "
                    "group register all the computed tokens it can: fewer leaves them out of the "
                    "prefix cache (lost hits), more registers tokens that are not final. Expected "
                    f"bounds at the last call: {calls[-1]}.")
        first = _wrap(head, 88, first_indent=7)
        return ['    """' + first[0][4:], *first[1:], "", *_wrap(body, 88), '    """']

    # -- code ---------------------------------------------------------------

    def _layer_names(self) -> list[str]:
        names = [_LAYER_NAMES[g["kind"]] for g in self.groups]
        return [f"{n}{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]

    def _manager_kwargs(self) -> list[tuple[str, str, str | None]]:
        """(keyword, value, comment) for the manager, as the worker built it."""
        c = self.config
        eagle = any(g["eagle"] for g in self.groups)
        kwargs = [("max_model_len", str(self.case.max_model_len), None),
                  ("scheduler_block_size", str(c["scheduler_block_size"]), None),
                  ("hash_block_size", "HASH_BLOCK_SIZE", None),
                  ("enable_caching", repr(bool(c["enable_caching"])), None),
                  ("use_eagle", repr(eagle),
                   "EAGLE groups drop their lookahead block at registration" if eagle else None)]
        if c["num_prefill_lookahead"]:
            kwargs.append(("num_prefill_lookahead", str(c["num_prefill_lookahead"]), None))
        if c["dcp_world_size"] != 1:
            kwargs.append(("dcp_world_size", str(c["dcp_world_size"]), None))
        accepted = set(self.caps.manager_keywords or [k for k, _, _ in kwargs])
        return [k for k in kwargs if k[0] in accepted]

    def _setup(self) -> list[str]:
        out = []
        if self.caps.lookahead_block_hashes:
            out += ["    # Legacy block hashes (sha256, no lookahead tokens): the scheme under",
                    "    # which the manager takes use_eagle and applies the EAGLE drop itself."]
        else:
            out.append("    # sha256 block hashes, as vLLM's other prefix-cache tests use.")
        out += [
            "    init_none_hash(sha256)",
            "    kv_cache_config = KVCacheConfig(",
            f"        num_blocks={self.case.num_blocks},",
            "        kv_cache_tensors=[],",
            "        kv_cache_groups=[",
        ]
        out += kv_cache_group_lines(self.case.config.groups, self.caps.per_group_eagle)
        out += ["        ],", "    )"]
        builder = "make_kv_cache_manager" if self.idiom.helpers else "KVCacheManager"
        out.append(f"    manager = {builder}(")
        out.append("        kv_cache_config=kv_cache_config," if self.idiom.helpers else "        kv_cache_config,")
        for key, value, comment in self._manager_kwargs():
            if comment:
                out.append(f"        # {comment}.")
            out.append(f"        {key}={value},")
        out.append("    )")
        if self.regime.partial_hash_hits and self.caps.partial_hash_hits:
            out += [f"    # Partial hash hits: the hash block ({self.config['hash_block_size']}) is "
                    "smaller than the Mamba block."
                    if any(g["kind"] == "mamba_align" for g in self.groups) else
                    "    # Partial hash hits are on for this layout.",
                    "    assert manager.coordinator.enable_partial_hash_hits"]
            if len(out[-2]) > 88:
                out[-2] = "    # Partial hash hits: the hash block is smaller than the Mamba block."
        if not self.lookup:
            out.append("    recorded = record_cache_blocks_bounds(monkeypatch, manager.coordinator)")
        out.append("")
        return out

    def _request(self, variable: str, request_id: str, tokens: str) -> list[str]:
        if self.idiom.helpers:
            line = f'    {variable} = make_request("{request_id}", {tokens}, HASH_BLOCK_SIZE, sha256)'
            if len(line) <= 88:
                return [line]
            return [f"    {variable} = make_request(", f'        "{request_id}", {tokens}, HASH_BLOCK_SIZE, sha256',
                    "    )"]
        kwargs = {
            "request_id": f'"{request_id}"',
            "prompt_token_ids": tokens,
            "sampling_params": f"SamplingParams(max_tokens={self.case.max_model_len})",
            "pooling_params": "None",
            "eos_token_id": "None",
            "block_hasher": "get_request_block_hasher(HASH_BLOCK_SIZE, sha256)",
        }
        if self.caps.request_keywords:
            kwargs = {k: v for k, v in kwargs.items() if k in self.caps.request_keywords}
        return [f"    {variable} = Request(", *[f"        {k}={v}," for k, v in kwargs.items()], "    )"]

    def _drive(self) -> list[str]:
        prompt = self.case.prompt_len
        out = self._request("req", "0", f"list(range({prompt}))")
        out += ["    computed_blocks, num_computed = manager.get_computed_blocks(req)[:2]",
                "    assert num_computed == 0  # nothing cached yet"]
        computed, tokens, first, call = 0, prompt, True, 0
        last = len(self.steps) - 1
        for index, step in enumerate(self.steps):
            call += 1
            hit_args = ", num_computed, computed_blocks" if first else ""
            if step["kind"] == "prefill":
                new, drafts = step["tokens"], 0
                what = (f"Call {call}: prefill {_plural(new, 'prompt token')} "
                        f"({computed + new} of {prompt} computed).")
            else:
                drafts = step["drafts"]
                new = tokens + drafts - computed
                what = (f"Call {call}: one decode step"
                        + (f" with {_plural(drafts, 'draft token')}, {step['accepted']} accepted."
                           if drafts else "."))
            out.append(f"    # {what}")
            if drafts:
                out.append(f"    req.spec_token_ids = [7] * {drafts}")
            out.append(f"    assert manager.allocate_slots(req, {new}{hit_args}) is not None")
            first = False
            computed += new - (drafts - step.get("accepted", 0) if step["kind"] == "decode" else 0)
            if index == last and not self.lookup:
                break  # the call under test is made: nothing after it matters
            if drafts:
                out.append("    req.spec_token_ids = []")
            out.append(f"    req.num_computed_tokens = {computed}")
            emitted = step["accepted"] + 1 if step["kind"] == "decode" else int(computed >= tokens)
            if emitted:
                tokens += emitted
                out.append("    req.append_output_token_ids(" + ("7" if emitted == 1 else f"[7] * {emitted}")
                           + ")")
        return out + [""]

    def _bound_assertion(self) -> list[str]:
        calls = self.f.inputs["expected_calls"]
        per_group = [[call[g] for call in calls] for g in range(len(self.groups))]
        out = ["    # Per group, the bound of each cache_blocks call: every computed token the",
               "    # group can register (full blocks past the last one are registered later).",
               *_assign("expected", per_group)]
        out.append(f'    assert recorded == expected, "{ASSERT_MESSAGE}"')
        return out

    def _lookup_assertion(self) -> list[str]:
        probe = self.f.inputs["probe"]
        out = [f"    # A later request shares the first {_plural(probe['shared'], 'token')}, "
               f"then {probe['extra']} new.",
               f"    shared = list(req.all_token_ids)[:{probe['shared']}]"]
        out += self._request("later", "1", f"shared + [90000 + i for i in range({probe['extra']})]")
        out.append("    hit = manager.get_computed_blocks(later)[1]")
        if "expected_hit" in self.f.inputs:
            out += ["    # Every registered block the lookup can reach, no more.",
                    *_assign("expected", self.f.inputs["expected_hit"]),
                    f'    assert hit == expected, "{LOOKUP_ASSERT_MESSAGE}"']
        else:
            out += ["    # The hit lengths the registered blocks and the lookup rules admit.",
                    *_assign("admissible", self.f.inputs["admissible_hits"]),
                    f'    assert hit in admissible, "{LOOKUP_ASSERT_MESSAGE}"']
        return out


def _wrap(text: str, width: int, first_indent: int = 4) -> list[str]:
    """Greedy word wrap, each line indented by four spaces (the first by
    ``first_indent`` counted, for the opening quotes)."""
    lines, line, limit = [], "", width - first_indent
    for word in text.split():
        if line and len(line) + 1 + len(word) > limit:
            lines.append("    " + line)
            line, limit = word, width - 4
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append("    " + line)
    return lines


def _assign(name: str, value: Any) -> list[str]:
    """``name = value`` (an int or nested lists of ints) as ruff format lays
    it out: one line if it fits, else the items on one line inside the
    brackets, else one item per line with a trailing comma (recursively)."""
    return _layout(f"{name} = ", value, "    ")


def _layout(prefix: str, value: Any, indent: str, suffix: str = "") -> list[str]:
    line = f"{indent}{prefix}{value!r}{suffix}"
    if len(line) <= 88 or not isinstance(value, list) or not value:
        return [line]
    inner = ", ".join(repr(item) for item in value)
    if len(f"{indent}    {inner}") <= 88:
        return [f"{indent}{prefix}[", f"{indent}    {inner}", f"{indent}]{suffix}"]
    out = [f"{indent}{prefix}["]
    for item in value:
        out += _layout("", item, indent + "    ", ",")
    return out + [f"{indent}]{suffix}"]
