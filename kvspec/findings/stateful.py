"""Stateful findings: a broken ``model.state`` invariant (or a vLLM
exception) on a shrunk program, stored as a ``model.finding.Finding``.

The finding records the program (``inputs["program"]``, replayable with
``kvspec replay``), the state model's scope, the operation that broke the
invariant and what vLLM's manager looked like after it.  It is stored as
soon as it exists, then completed: the program rerun once more on the live
subject (a finding that does not reproduce is marked flaky) and a
regression test emitted from the manager calls the program made
(``kvspec.emit.stateful_test``), proposed only when none of vLLM's own
tests, asked first as for a registration finding (``vllm_suite``), already
catches the finding.
"""

from __future__ import annotations

import re
import tempfile
import time
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
           "unconfirmed_crash", "with_engine_reproduction", "with_engine_impact", "with_regression_test",
           "proposed_module", "other_side", "verify_stateful_test"]

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
            else round(result.seconds_to_first_failure, 3), "flaky": result.failure.flaky,
            **({"shrink_budget": result.shrink_budget} if result.shrink_budget else {})}


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
    """Store the finding, then complete it: replayed, its machine trace
    taken, looked for through the engine and measured there, while vLLM's
    own tests run on the subject (processes of their own, as for a
    registration finding: ``completion.vllm_tests_stage``); then its test,
    proposed only when none of vLLM's catches it."""
    from concurrent.futures import ThreadPoolExecutor

    from kvspec.diff_tests.reproduce import reproduce_through_engine
    from kvspec.diff_tests.stateful import replay_program

    from .completion import _timed, tests_root_or_none, vllm_tests_stage

    finding, path = store_new(stateful_finding(result, versions), findings_dir)
    tests_root = tests_root_or_none(proc.subject)
    seconds: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        asked = pool.submit(_timed, seconds, "vLLM's own tests", vllm_tests_stage, proc.subject, tests_root)
        program = result.failure.case
        found, _ = replay_program(proc, program)
        reproduced = any(d.category is finding.category for d in found)
        finding = attrs.evolve(finding, run={**finding.run, "reproduced_on_replay": reproduced})
        if not reproduced and finding.category is Category.SUBJECT_CRASH:
            finding = unconfirmed_crash(finding)
        store_finding(finding, path)
        trace = proc.session(MachineTrace()) if reproduced else {}
        # Then (the worker's machine trace above is the program's): reachable
        # through vLLM's scheduler, or hand-built only (hardening).
        finding = with_engine_reproduction(finding, reproduce_through_engine(
            proc, program, result.failure.discrepancies[0], result.failure.reply))
        store_finding(finding, path)
        finding = with_engine_impact(proc, finding)
        store_finding(finding, path)
        finding = attrs.evolve(finding, vllm_tests=asked.result(),
                               run={**finding.run, "completion_seconds": seconds})
        store_finding(finding, path)
    if trace.get("ok"):
        finding = with_regression_test(finding, path, trace.get("trace"), proc.capabilities, proc.subject,
                                       tests_root=tests_root)
        store_finding(finding, path)
    return finding, path


def with_regression_test(finding: Finding, path: Path, trace, capabilities, subject, *,
                         tests_root: Path | None | str = "find") -> Finding:
    """The finding with its regression test (``kvspec.emit.stateful_test``):
    written beside it, linted with the release's ruff configuration and run
    on both sides (failing on the subject, passing where the bug is not).
    When a test of vLLM's own already catches the finding
    (``finding.vllm_tests``), the test is kept as an artifact only: not
    proposed, not run (it would duplicate vLLM's)."""
    from kvspec.emit.stateful_test import emit_stateful_test, expected_failure, no_test_why, stateful_test_name
    from kvspec.emit.vllm_tests import idiom_of

    from .completion import offered_test, tests_root_or_none
    from .vllm_suite import already_caught

    if tests_root == "find":
        tests_root = tests_root_or_none(subject)
    idiom = idiom_of(tests_root)
    code = emit_stateful_test(finding, trace, capabilities, idiom)
    if code is None:
        return attrs.evolve(finding, regression_test={"test_name": None, "proposed": False,
                                                      "why_not_proposed": f"no test written: {no_test_why(finding)}"})
    name = stateful_test_name(finding)
    file_name = f"{name}.py"
    test_dir = path.with_suffix("")
    test_dir.mkdir(exist_ok=True)
    test_path = test_dir / file_name
    test_path.write_text(code)
    module = proposed_module(tests_root, finding.category)
    if already_caught(finding.vllm_tests):
        record = {"file_name": file_name, "path": str(test_path), "code": code, "test_name": name, "trace": trace,
                  "idiom": idiom.as_dict(), "module": module,
                  "command": f"pytest {module or 'tests/v1/core/' + file_name}::{name}",
                  "proposed": False, "verified": [], "lint": None, "other_side": None,
                  "why_not_proposed": f"vLLM's own {finding.vllm_tests['caught_by'][0]} already catches it"}
    else:
        checked = verify_stateful_test(code, file_name, subject, tests_root, expected_failure(finding), finding)
        record = offered_test(code, test_path, name, module, checked, subject, trace=trace, idiom=idiom.as_dict())
    return attrs.evolve(finding, artifacts={**finding.artifacts, "regression_test": str(test_path)},
                        regression_test=record)


def with_engine_impact(proc, finding: Finding) -> Finding:
    """A stateful finding the engine reproduced gets the impact an engine
    finding gets, measured on the engine program that reproduced it (the
    hand-built program's own impact stays "not measured")."""
    record = (finding.inputs or {}).get("engine_reproduction") or {}
    if record.get("status") != "reproduced" or not record.get("engine_program"):
        return finding
    from .impact import attach_engine_impact

    # Measured and said at the engine program's configuration, not the hand-built one.
    engine_inputs = {**finding.inputs, "engine_program": record["engine_program"],
                     "describe": record.get("describe") or ""}
    measured = attach_engine_impact(proc, attrs.evolve(finding, inputs=engine_inputs))
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



def proposed_module(tests_root: Path | None, category: Category) -> str | None:
    """The release's test module the test belongs in: of vLLM's own CPU
    tests of the area, the one that calls what the test checks most; else
    (and for the free block queue's order and evict_blocks, which vLLM tests
    there) the module whose helpers it uses (``tests/v1/core/test_prefix_caching.py``)."""
    from kvspec.emit.stateful_test import CALL_CHECKED, IN_HELPER_MODULE
    from kvspec.emit.vllm_tests import HELPER_FILE
    from kvspec.findings.vllm_suite import covering_module

    module = None if category in IN_HELPER_MODULE else covering_module(tests_root, CALL_CHECKED.get(category,
                                                                                                   "allocate_slots"))
    if module is None and tests_root is not None and (Path(tests_root) / HELPER_FILE).is_file():
        module = HELPER_FILE
    return module


def other_side(finding: Finding, subject) -> tuple[Any, str] | tuple[None, str]:
    """Where the test must pass: (subject, why) -- the unmutated release of a
    mutant, the release a known bug is fixed in -- or (None, why not)."""
    from kvspec.model.known import known_bugs
    from kvspec.subjects.subject import release

    if subject.kind == "mutant":
        base = release(subject.version)
        return base, f"unmutated {base.label}"
    if subject.kind == "release":
        for bug in known_bugs(subject.version, finding.category, finding.detail):
            if bug.fixed_in:
                return release(bug.fixed_in), f"vllm {bug.fixed_in}, the first release without {bug.name}"
        return None, "no release without this bug is known to kvspec (model/known.py)"
    return None, "a source tree has no release known to be without the bug"


_ERROR = re.compile(r"^E\s+(\w+(?:Error|Exception|Warning))\b(.*)$")


def _first_error(output: str) -> str | None:
    """The exception pytest reports (its 'E   ...Error: ...' line)."""
    for line in output.splitlines():
        match = _ERROR.match(line)
        if match:
            return (match.group(1) + match.group(2)).strip()
    return None


def run_emitted_test(code: str, file_name: str, tests_root: Path | None, subject, must: str, against: str,
                     expected: str, message: str | None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The test laid out as in vLLM's repository, run on ``subject`` (with
    ``env`` added to its environment): did it do what it ``must``, and how it
    failed (the test's assertion, ``message``; vLLM's own assert; another
    exception)."""
    from kvspec.subjects.testrun import run_pytest

    from kvspec.emit.vllm_tests import verification_tree

    with tempfile.TemporaryDirectory(prefix="kvspec-test-") as scratch:
        path = verification_tree(Path(scratch), tests_root, file_name, code)
        started = time.perf_counter()
        check = {**run_pytest(subject, str(path), env=env), "must": must, "against": against,
                 "seconds": round(time.perf_counter() - started, 2)}
    output = check.pop("output", "")
    error = _first_error(output)
    if check["outcome"] == "failed":
        # The test's own assertion carries its message; anything else is
        # vLLM's own assert or an exception raised on the way.
        own = error is not None and error.startswith("AssertionError") and bool(message) and message in error
        if own:
            check["failure"] = "the test's assertion"
        elif error and error.startswith("AssertionError"):
            check["failure"] = f"vLLM's own assert ({error[:300]})"
        else:
            check["failure"] = f"vLLM raised {(error or 'an error')[:300]}"
        # On the subject: its own assertion, or for a crash the exception the finding recorded.
        check["as_expected"] = must == "failed" and (own if message else bool(error) and error.startswith(expected))
        if must == "passed" and not own and not (error or "").startswith("AssertionError"):
            check["cannot_run"] = f"the test cannot run on {against}: {(error or 'an error')[:300]}"
    else:
        check["as_expected"] = check["outcome"] == must
    check["output"] = output[-4000:]
    return check


def verify_stateful_test(code: str, file_name: str, subject, tests_root: Path | None, expected: str,
                         finding: Finding) -> dict[str, Any]:
    """Lint, then run on both sides: ``{"lint": ..., "verified": [...],
    "other_side": why}``."""
    from concurrent.futures import ThreadPoolExecutor

    from kvspec.emit.stateful_test import assertion_message
    from kvspec.emit.vllm_tests import ensure_vllm_tests

    from .completion import lint_test

    other, why = other_side(finding, subject)
    jobs = [(subject, "failed", subject.label, tests_root)]
    if other is not None:
        try:
            other_root = ensure_vllm_tests(other.version) if tests_root is not None else None
        except Exception:  # no network: the other side runs with the subject's helpers
            other_root = tests_root
        jobs.append((other, "passed", why, other_root))
    with ThreadPoolExecutor(max_workers=3) as pool:
        lint = pool.submit(lint_test, code, file_name, subject, tests_root)
        message = assertion_message(finding)
        runs = [pool.submit(run_emitted_test, code, file_name, root, s, must, against, expected, message)
                for s, must, against, root in jobs]
        return {"lint": lint.result(), "verified": [r.result() for r in runs],
                "other_side": why if other is None else None}
