"""An engine finding on a published release as a vLLM bug report, in the
layout of vLLM's GitHub bug-report form ("Your current environment",
"🐛 Describe the bug"): environment, mechanism, a standalone reproduction
script and whether it reproduced when kvspec ran it, expected vs actual,
who is affected, the suggested fix where one is named.

Render only: the script and its run come in (``subjects.upstream_repro``
writes and runs it); every field of the finding is untrusted and escaped
(``escape``); the script is kvspec's own text, built from validated values.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding

from .escape import code_span, fence, md_inline

__all__ = ["render_upstream"]


def _expected_actual(f: Finding) -> tuple[str, str]:
    if f.category is Category.STATE_BLOCK_ESTIMATE:
        return ("`allocate_slots` takes no more free blocks than the KV-cache groups' `get_num_blocks_to_allocate` "
                "estimated: that sum is what the scheduler (and the admission gate) checks against the free pool, "
                "so with a tight pool the request waits instead of the pool refusing.",
                f"{md_inline(f.detail)}")
    if f.category is Category.SUBJECT_CRASH:
        error = (f.observations or {}).get("error") or f.detail
        return ("`schedule()` returns a `SchedulerOutput` (a request that does not fit the pool waits or is "
                "preempted); it does not raise.", f"`schedule()` raises: {md_inline(error)}")
    from kvspec.emit.engine_test import engine_assertion_message

    rule = engine_assertion_message(f)  # the rule the engine test and the script check, in kvspec's words
    return (f"{md_inline(rule[:1].upper() + rule[1:])}." if rule else "", md_inline(f.detail))


def render_upstream(f: Finding, *, known: Any | None, script: Any | None, run: Any | None,
                    no_script: str | None = None, fixed_run: Any | None = None) -> str:
    """The bug report.  ``known``: the known-bug entry the finding is
    recognised as (``model.known.KnownBug``) or None; ``script``/``run``:
    the reproduction and its fresh-process run (None: none, ``no_script``
    says why); ``fixed_run``: its run on the first release without the known
    bug, where it should run clean (None: not run)."""
    version = str(f.compared.get("subject", {}).get("version"))
    program = f.inputs.get("engine_program", {})
    settings = (f.run or {}).get("engine_settings") or {}
    reproduced = bool(run is not None and run.reproduced)
    title = known.title if known is not None and known.title else f.category.meaning
    lines = [f"# [Bug]: {md_inline(title)}", ""]
    lines += ["## Your current environment", "",
              f"- vLLM {md_inline(version)} (the published wheel); a CPU is enough, no GPU: the reproduction "
              "drives vLLM's scheduler only.",
              f"- A CPU environment in one line: {code_span(_install(version, script))} (the script sets "
              "`VLLM_TARGET_DEVICE=empty` and `HF_HUB_OFFLINE=1` itself).",
              f"- Found by kvspec's engine differential through vLLM's real `Scheduler` "
              f"({md_inline(settings.get('scheduler_class', 'Scheduler'))}), built by vLLM's own configuration "
              "code from engine flags on a toy model.", ""]
    lines += ["## 🐛 Describe the bug", ""]
    if known is not None:
        lines += [md_inline(known.summary[:1].upper() + known.summary[1:]) + ".", "",
                  f"kvspec recognises the finding as its known bug {code_span(known.name)} (first in "
                  f"{md_inline(known.first)}, {'fixed in ' + md_inline(known.fixed_in) if known.fixed_in else 'still open'}"
                  f"{'; needs ' + md_inline(known.needs) if known.needs else ''}).", ""]
    else:
        lines += [f"{md_inline(f.category.title)}: {md_inline(f.category.meaning)}.", "",
                  f"What was observed: {md_inline(f.detail)}", ""]
    lines += ["### Reproduction", ""]
    if script is None:
        lines += [f"No reproduction script: {md_inline(no_script or 'none was generated')}", ""]
    elif not reproduced:
        lines += ["kvspec wrote a standalone script for this finding and ran it in a fresh process on vLLM "
                  f"{md_inline(version)}; it did **not** reproduce, so it is not offered as a reproduction.", ""]
    else:
        lines += [f"Standalone: it imports vLLM (and torch) and the standard library only. "
                  f"Run {code_span(_install(version, script))}. {md_inline(script.hand_built[:1].upper() + script.hand_built[1:])}.",
                  "", *fence(script.code, "python"), ""]
    if run is not None:
        status = "no exit status (it did not finish)" if run.returncode is None else f"exit status {run.returncode}"
        lines += [f"kvspec ran it before offering it ({md_inline(run.how)}, {run.seconds:.1f} s): "
                  f"{'**reproduced**' if reproduced else '**did not reproduce**'}, {status}. The last lines of its "
                  "output:", "", *fence(run.tail), ""]
    if fixed_run is not None and known is not None:
        clean = fixed_run.ran_clean
        status = ("no exit status (it did not finish)" if fixed_run.returncode is None
                  else f"exit status {fixed_run.returncode}")
        lines += [f"On vLLM {md_inline(known.fixed_in)}, the first release without the bug, kvspec ran the same "
                  f"script ({md_inline(fixed_run.how)}, {fixed_run.seconds:.1f} s): "
                  f"{'**ran clean**' if clean else '**did not run clean**'}, {status}. The last lines of its output:",
                  "", *fence(fixed_run.tail), ""]
    expected, actual = _expected_actual(f)
    lines += ["### Expected vs actual", ""]
    if expected:
        lines += [f"- Expected: {expected}"]
    lines += [f"- Actual (vLLM {md_inline(version)}, the finding): {actual}", ""]
    lines += ["### Who is affected, with which settings", ""]
    # The flags are written anew from the validated program, never copied from the file.
    setup = EngineProgram.from_dict(program).setup
    flags = setup.cli_flags()
    lines += [f"- Found on {code_span(setup.model)}, a toy model of the {md_inline(setup.toy.family)} family (a few "
              "small layers), built by the same configuration code as a real checkpoint of that family.",
              f"- Engine flags: {code_span('vllm serve MODEL ' + flags) if flags else 'none'} (every other "
              "setting: the release's default)."]
    if settings:
        layout = ", ".join(f"{md_inline(g.get('kind'))} (block {md_inline(g.get('block_size'))})"
                           for g in settings.get("groups", ()) if isinstance(g, dict))
        lines += [f"- What vLLM derived: KV-cache groups {layout}; scheduler block "
                  f"{md_inline(settings.get('scheduler_block_size'))}, hash block "
                  f"{md_inline(settings.get('hash_block_size'))}, {md_inline(settings.get('num_blocks'))} blocks, "
                  f"connector {md_inline(settings.get('kv_connector'))}, async scheduling "
                  f"{md_inline(settings.get('async_scheduling'))}, admission gate (scheduler_reserve_full_isl) "
                  f"{md_inline(settings.get('reserve_full_isl'))}."]
    if known is not None and known.needs:
        lines += [f"- Any deployment with {md_inline(known.needs)}."]
    lines += [""]
    lines += ["### Suggested fix", ""]
    if known is not None and known.fix:
        lines += [md_inline(known.fix) + " (kvspec has not run that fix).", ""]
    else:
        lines += ["None suggested: the finding's explanation names no fix.", ""]
    lines += ["### Before submitting a new issue...", "",
              "- [ ] Make sure you already searched for relevant issues (this mechanism may already be reported).", ""]
    return "\n".join(lines)


def _install(version: str, script: Any | None) -> str:
    # The version shown in a command is only ever a validated X.Y.Z (the script's own).
    return f"pip install vllm=={script.version} && python repro.py" if script is not None \
        else "pip install vllm==<version>"
