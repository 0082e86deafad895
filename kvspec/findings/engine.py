"""Engine findings: a broken ``model.state`` invariant, a seam contract
broken, or ``schedule()`` raising, on an engine program driven through vLLM's
real ``Scheduler`` (``diff_tests/engine.py``), stored as a
``model.finding.Finding``.

The finding records the engine program (``inputs["engine_program"]``:
the toy model, the ``EngineArgs`` flags drawn, every engine input in order;
``kvspec replay`` reruns it), the engine settings vLLM built and ran, and how
a user reaches it: the same scheduler calls with those flags.  It is stored
as soon as it exists, then replayed once more on the live subject (a
finding that does not reproduce is marked so, never headlined as vLLM's).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from kvspec.model.engine import ENGINE_BUILT, MODELLED_STEPS
from kvspec.model.finding import Blame, Category, Finding, Ledger

from .completion import store_finding
from .stateful import program_compared, program_run, store_new

__all__ = ["ENGINE_RULE", "engine_finding", "complete_engine_finding", "store_raw_engine_finding"]

ENGINE_RULE = "state invariants and the scheduler-manager seam (model.state.INVARIANTS), through vLLM's Scheduler"


def engine_finding(result, versions: dict[str, str]) -> Finding:
    """The finding of an engine run that failed (not yet stored)."""
    failure = result.failure
    program = failure.case
    first = failure.discrepancies[0]
    category = first.category
    compared = program_compared(result, versions, ENGINE_RULE, "engine", modelled=list(MODELLED_STEPS),
                                configuration=ENGINE_BUILT)
    label = result.subject.get("label", "the subject")
    if category is Category.SUBJECT_CRASH:
        blame, note = (Blame.IMPLEMENTATION_BUG,
                       "vLLM's own Scheduler raised on engine inputs, on an engine its configuration code built "
                       "and accepted: a user with these flags reaches the same calls")
    else:
        blame, note = (Blame.IMPLEMENTATION_BUG,
                       "vLLM's own state after the engine operation breaks the invariant; the invariant is checked "
                       "on observations only")
    reach = (f"reachable through vLLM's scheduler with `{program.setup.cli_flags() or 'the release defaults'}` on "
             f"{program.setup.model} (a toy model of {program.setup.toy.family}; the engine's other settings are the "
             f"release's defaults)")
    run = {**program_run(result), "engine_settings": failure.reply.get("derived") or None}
    return Finding(
        source="fuzz",
        verdict=f"DISCREPANCY: {category.title} ({category.meaning}) in {label}, through vLLM's Scheduler",
        category=category, compared=compared,
        inputs={"engine_program": program.as_dict(), "describe": program.describe(),
                "operations": len(program.ops), "how_a_user_reaches_it": reach},
        ledger=Ledger(None, None, None, label, blame, note),
        detail="; ".join(d.summary() for d in failure.discrepancies),
        traceback=failure.reply.get("traceback"), observations={"error": failure.reply.get("error")}, run=run)


def complete_engine_finding(proc, result, findings_dir: Path, versions: dict[str, str]) -> tuple[Finding, Path]:
    """Store the finding, then replay its program once more on a fresh engine."""
    from kvspec.diff_tests.engine import replay_engine_program

    finding, path = store_new(engine_finding(result, versions), findings_dir)
    found, _ = replay_engine_program(proc, result.failure.case)
    reproduced = any(d.category is finding.category for d in found)
    finding = attrs.evolve(finding, run={**finding.run, "reproduced_on_replay": reproduced})
    if not reproduced:
        finding = attrs.evolve(finding, verdict=finding.verdict + " (did NOT reproduce on replay: not a confirmed "
                                                                  "vLLM bug)")
    else:
        from kvspec.findings.impact import attach_engine_impact

        # What a user sees, measured at the finding's engine configuration (kvspec.findings.impact).
        finding = attach_engine_impact(proc, finding)
    store_finding(finding, path)
    return finding, path


def store_raw_engine_finding(result, findings_dir: Path, versions: dict[str, str]) -> tuple[Finding, Path]:
    """A failure from a run that stopped early, stored as found (unshrunk)."""
    return store_new(engine_finding(result, versions), findings_dir, stopped=result.stopped_why)
