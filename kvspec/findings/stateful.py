"""Stateful findings: a broken ``model.state`` invariant (or a vLLM
exception) on a shrunk program, stored as a ``model.finding.Finding``.

The finding records the program (``inputs["program"]``, replayable with
``kvspec replay``), the state model's scope, the operation that broke the
invariant and what vLLM's manager looked like after it.  It is stored as
soon as it exists, then completed: the program rerun once more on the live
subject (a finding that does not reproduce is marked flaky) and a
regression test emitted from the manager calls the program made
(``kvspec.emit.stateful_test``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from kvspec.model.engine import ENGINE_BUILT, HAND_BUILT
from kvspec.model.finding import hand_built_impact
from kvspec.model.finding import Blame, Category, Finding, Ledger
from kvspec.model.requests import MachineTrace

from .completion import finding_stem, store_finding
from .assemble import subject_compared

__all__ = ["STATE_RULE", "stateful_finding", "store_new", "complete_stateful_finding", "store_raw_stateful_finding",
           "unconfirmed_crash", "with_engine_reproduction", "with_engine_impact"]

STATE_RULE = "state invariants (model.state.INVARIANTS)"

_BLAME_NOTES = {
    Category.SUBJECT_CRASH: (Blame.UNDETERMINED,
                             "vLLM raised on an operation sequence a scheduler can issue, on a manager its "
                             "constructor accepted: an implementation bug, or a precondition the model does "
                             "not state"),
    Category.PRECONDITION: (Blame.SPEC_BUG,
                            "vLLM would not build a manager for a geometry its constructor validators accept"),
}


def program_compared(result, versions: dict[str, str], rule: str, differential: str, **more: Any) -> dict[str, Any]:
    """What a program differential's finding compared (stateful or engine)."""
    compared = subject_compared(result.subject, versions)
    compared.update(spec_rule=rule, capabilities=result.capabilities.as_dict(), scope=result.scope(),
                    differential=differential, **more)
    return compared


def program_run(result) -> dict[str, Any]:
    """The run record of a program differential's finding (stateful or engine)."""
    return {"seed": result.seed, "programs": result.tally.programs, "operations": result.tally.operations,
            "seconds": round(result.seconds, 3), "programs_to_first_failure": result.programs_to_first_failure,
            "seconds_to_first_failure": None if result.seconds_to_first_failure is None
            else round(result.seconds_to_first_failure, 3), "flaky": result.failure.flaky}


def stateful_finding(result, versions: dict[str, str]) -> Finding:
    """The finding of a stateful run that failed (not yet stored)."""
    failure = result.failure
    program = failure.case
    first = failure.discrepancies[0]
    category = first.category
    compared = program_compared(result, versions, STATE_RULE, "stateful")
    label = result.subject.get("label", "the subject")
    blame, note = _BLAME_NOTES.get(category, (Blame.IMPLEMENTATION_BUG,
                                              "vLLM's own state after the operation breaks the invariant; "
                                              "the invariant is checked on observations only"))
    run = program_run(result)
    return Finding(
        source="fuzz",
        verdict=f"DISCREPANCY: {category.title} ({category.meaning}) in {label}",
        category=category, compared=compared,
        inputs={"program": program.as_dict(), "describe": program.describe(),
                "operations": len(program.ops)},
        ledger=Ledger(None, None, None, label, blame, note),
        detail="; ".join(d.summary() for d in failure.discrepancies),
        traceback=failure.reply.get("traceback"), observations=_trimmed(failure.reply), run=run,
        impact=hand_built_impact(category))


def _trimmed(reply: dict[str, Any]) -> dict[str, Any]:
    """The answer of the failing operation, without the free queue's
    hundreds of ids (its length stays: the counter is compared with it)."""
    out = dict(reply)
    state = out.get("state")
    if isinstance(state, dict):
        state = dict(state)
        queue = state.get("free_queue") or []
        state["free_queue_length"] = len(queue)
        state["free_queue"] = queue[:16]
        state["blocks"] = [b for b in state.get("blocks", ()) if b[1] or b[2]]  # referenced or keyed
        out["state"] = state
    return out


def store_new(finding: Finding, findings_dir: Path, stopped: str | None = None) -> tuple[Finding, Path]:
    """Store a new program finding as found, with its replay line (``stopped``: why the run stopped early)."""
    findings_dir.mkdir(parents=True, exist_ok=True)
    path = findings_dir / f"{finding_stem(finding)}.json"
    run = finding.run if stopped is None else {**finding.run, "stopped": stopped}
    finding = attrs.evolve(finding, replay=f"kvspec replay {path}", artifacts={"finding": str(path)}, run=run)
    store_finding(finding, path)
    return finding, path


def complete_stateful_finding(proc, result, findings_dir: Path,
                              versions: dict[str, str]) -> tuple[Finding, Path]:
    from kvspec.diff_tests.reproduce import reproduce_through_engine
    from kvspec.diff_tests.stateful import replay_program

    from kvspec.emit.stateful_test import emit_stateful_test, expected_failure, verify_stateful_test

    finding, path = store_new(stateful_finding(result, versions), findings_dir)
    program = result.failure.case
    found, _ = replay_program(proc, program)
    reproduced = any(d.category is finding.category for d in found)
    finding = attrs.evolve(finding, run={**finding.run, "reproduced_on_replay": reproduced})
    if not reproduced and finding.category is Category.SUBJECT_CRASH:
        finding = unconfirmed_crash(finding)
    store_finding(finding, path)
    trace = proc.session(MachineTrace()) if reproduced else {}
    code = emit_stateful_test(finding, trace.get("trace"), proc.capabilities) if trace.get("ok") else None
    artifacts = dict(finding.artifacts)
    if code is not None:
        test_dir = path.with_suffix("")
        test_dir.mkdir(exist_ok=True)
        test_path = test_dir / f"test_kvspec_{finding.category.value}.py"
        test_path.write_text(code)
        artifacts["regression_test"] = str(test_path)
        checks = verify_stateful_test(test_path, proc.subject, expected_failure(finding))
        finding = attrs.evolve(finding, artifacts=artifacts, regression_test={
            "file_name": test_path.name, "path": str(test_path), "code": code, "verified": checks})
        store_finding(finding, path)
    # Last (the worker's machine trace above is the program's): reachable
    # through vLLM's scheduler, or hand-built only (hardening).
    finding = with_engine_reproduction(finding, reproduce_through_engine(
        proc, program, result.failure.discrepancies[0], result.failure.reply))
    store_finding(finding, path)
    finding = with_engine_impact(proc, finding)
    store_finding(finding, path)
    return finding, path


def with_engine_impact(proc, finding: Finding) -> Finding:
    """A stateful finding the engine reproduced gets the impact an engine
    finding gets, measured on the engine program that reproduced it (the
    hand-built program's own impact stays "not measured")."""
    record = (finding.inputs or {}).get("engine_reproduction") or {}
    if record.get("status") != "reproduced" or not record.get("engine_program"):
        return finding
    from .impact import attach_engine_impact

    measured = attach_engine_impact(proc, attrs.evolve(finding, inputs={**finding.inputs,
                                                                          "engine_program": record["engine_program"]}))
    impact = measured.impact
    if impact is not None:
        impact = attrs.evolve(impact, how_measured=f"on the engine program that reproduced it "
                                                   f"({record.get('describe')}): {impact.how_measured}")
    return attrs.evolve(finding, impact=impact)


def with_engine_reproduction(finding: Finding, reproduction) -> Finding:
    """The finding with what the engine showed of it
    (``diff_tests.reproduce.Reproduction``): recorded in its inputs, said in
    its configuration and as its reach (hand-built only after the stated
    search is hardening)."""
    from kvspec.model.nearest_engine import reproduction_reach

    record = reproduction.as_dict()
    inputs = {**finding.inputs, "engine_reproduction": record}
    configuration = HAND_BUILT
    if record["status"] == "reproduced":
        inputs["how_a_user_reaches_it"] = record["summary"]
        configuration = ("hand-built at first (kvspec built the KVCacheConfig and KVCacheManager and drove it with "
                         f"its replica of the scheduler's step), then reproduced through vLLM's engine: {ENGINE_BUILT}; "
                         f"engine program: {record['describe']}")
    elif record["status"] == "not reproduced":
        configuration = f"{configuration}; not reproduced through vLLM's engine within the stated budget"
    else:
        configuration = f"{configuration}; whether vLLM's engine reproduces it is unknown (the search did not finish)"
    return attrs.evolve(finding, inputs=inputs, compared={**finding.compared, "configuration": configuration},
                        reach=reproduction_reach(record))


def unconfirmed_crash(finding: Finding) -> Finding:
    """A crash the replay on the live subject did not raise again is not
    headlined as vLLM's: it is kept, said to be unconfirmed, for a reader to judge."""
    label = finding.ledger.subject_label
    return attrs.evolve(
        finding, verdict=f"UNCONFIRMED: an exception in {label} that did not recur when its program was "
                         "replayed (not reported as a vLLM crash)",
        ledger=attrs.evolve(finding.ledger, blame=Blame.UNDETERMINED,
                            note="the exception did not recur on replay: a fault of the machine or of "
                                 "kvspec is as likely as vLLM's"))


def store_raw_stateful_finding(result, findings_dir: Path, versions: dict[str, str]) -> tuple[Finding, Path]:
    """A failure from a run that stopped early, stored as found (unshrunk)."""
    return store_new(stateful_finding(result, versions), findings_dir, stopped=result.stopped_why)
