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

__all__ = ["ENGINE_RULE", "engine_finding", "complete_engine_finding", "store_raw_engine_finding", "with_engine_test",
           "verify_engine_test"]

ENGINE_RULE = "state invariants and the scheduler-manager seam (model.state.INVARIANTS), through vLLM's Scheduler"
# A registration finding through the engine: a cache_blocks call the Scheduler made outside the bound.
ENGINE_REGISTRATION_RULE = ("the registration bound (model.spec.registration_bound) on every cache_blocks call, "
                            "through vLLM's Scheduler")
_REGISTRATION = (Category.UNDER_REGISTRATION, Category.OVER_REGISTRATION, Category.BLOCK_MISMATCH)


def engine_finding(result, versions: dict[str, str]) -> Finding:
    """The finding of an engine run that failed (not yet stored)."""
    failure = result.failure
    program = failure.case
    first = failure.discrepancies[0]
    category = first.category
    rule = ENGINE_REGISTRATION_RULE if category in _REGISTRATION else ENGINE_RULE
    compared = program_compared(result, versions, rule, "engine", modelled=list(MODELLED_STEPS),
                                configuration=ENGINE_BUILT)
    label = result.subject.get("label", "the subject")
    if category is Category.SUBJECT_CRASH:
        blame, note = (Blame.IMPLEMENTATION_BUG,
                       "vLLM's own Scheduler raised on engine inputs, on an engine its configuration code built "
                       "and accepted: a user with these flags reaches the same calls")
    elif category in _REGISTRATION:
        blame, note = (Blame.IMPLEMENTATION_BUG,
                       "a cache_blocks call vLLM's own Scheduler made registers other than the registration bound "
                       "allows (the spec's per-group bound, held as the registration differential holds a request's "
                       "calls), on an engine its configuration code built and accepted: a user with these flags "
                       "reaches the same calls")
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


def complete_engine_finding(proc, result, findings_dir: Path, versions: dict[str, str],
                            verify: bool = True) -> tuple[Finding, Path]:
    """Store the finding, then replay its program once more on a fresh engine;
    one that reproduces gets its impact and its regression test (run on both
    sides unless ``verify`` is off: ``kvspec fuzz --no-verify-test``)."""
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
        # A test in vLLM's idiom asserting what the finding measured, run on both sides.
        finding = with_engine_test(finding, path, proc.subject, verify=verify)
    store_finding(finding, path)
    return finding, path


def store_raw_engine_finding(result, findings_dir: Path, versions: dict[str, str]) -> tuple[Finding, Path]:
    """A failure from a run that stopped early, stored as found (unshrunk)."""
    return store_new(engine_finding(result, versions), findings_dir, stopped=result.stopped_why)


def with_engine_test(finding: Finding, path: Path, subject, verify: bool = True) -> Finding:
    """The finding with its regression test (``kvspec.emit.engine_test``):
    written beside it, linted with the release's ruff configuration and run
    on both sides (failing on the subject as the finding did, passing where
    the bug is not); offered only when it lints clean and fails as the
    finding did.  A kind no test is written for says why."""
    from kvspec.emit.engine_test import CALL_CHECKED, engine_assertion_message, engine_test_code, engine_test_name
    from kvspec.emit.stateful_test import expected_failure
    from kvspec.emit.vllm_tests import tests_root_of
    from kvspec.findings.vllm_suite import engine_test_module
    from kvspec.subjects.upstream_repro import Unscriptable

    from .completion import offered_test

    name = engine_test_name(finding)
    try:
        code = engine_test_code(finding, subject.version or "")
    except (Unscriptable, KeyError, TypeError, ValueError) as exc:
        return attrs.evolve(finding, regression_test={"test_name": None, "proposed": False,
                                                      "why_not_proposed": f"no test written: {exc}"})
    file_name = f"{name}.py"
    test_dir = path.with_suffix("")
    test_dir.mkdir(exist_ok=True)
    test_path = test_dir / file_name
    test_path.write_text(code)
    message = engine_assertion_message(finding)
    if not verify:  # written, not offered: a test is offered once it failed as the finding did
        return attrs.evolve(finding, artifacts={**finding.artifacts, "regression_test": str(test_path)},
                            regression_test={"file_name": file_name, "path": str(test_path), "code": code,
                                             "test_name": name, "proposed": False, "verified": [],
                                             "why_not_proposed": "not run (--no-verify-test)"})
    tests_root = None
    try:
        tests_root = tests_root_of(subject)
    except Exception as exc:  # no network, no sdist: not linted with the release's configuration
        from kvspec.subjects.provision import report

        report(f"vLLM's tests are not available ({exc}); the engine test is not linted with their configuration")
    checked = verify_engine_test(code, file_name, subject, tests_root, expected_failure(finding)
                                 if message is None else message, message, finding)
    record = offered_test(code, test_path, name, engine_test_module(tests_root, CALL_CHECKED), checked, subject)
    return attrs.evolve(finding, artifacts={**finding.artifacts, "regression_test": str(test_path)},
                        regression_test=record)


def _run_engine_test(code: str, file_name: str, tests_root, subject, must: str, against: str, expected: str,
                     message: str | None) -> dict:
    """The test run on ``subject`` as ``kvspec report --upstream`` runs its
    script: vLLM's platform-free target (the scheduler needs no device;
    kvspec's CPU runtime has no triton-cpu for vLLM's CPU platform) and the
    subject's tree handed to the subprocess vLLM inspects a model class in."""
    import os

    from kvspec.subjects.subject import resolve_subject

    from .stateful import run_emitted_test

    tree = resolve_subject(subject)[1]
    env = {"VLLM_TARGET_DEVICE": "empty", "HF_HUB_OFFLINE": "1"}
    if tree and os.pathsep not in tree:  # a path holding the separator would be split: not handed on
        env["PYTHONPATH"] = tree
    return run_emitted_test(code, file_name, tests_root, subject, must, against, expected, message, env=env)


def verify_engine_test(code: str, file_name: str, subject, tests_root, expected: str, message: str | None,
                       finding: Finding) -> dict:
    """Lint, then run on both sides (the other side: ``findings.stateful.other_side``):
    ``{"lint": ..., "verified": [...], "other_side": why not run there}``."""
    from concurrent.futures import ThreadPoolExecutor

    from .completion import lint_test
    from .stateful import other_side

    other, why = other_side(finding, subject)
    jobs = [(subject, "failed", subject.label)]
    if other is not None:
        jobs.append((other, "passed", why))
    with ThreadPoolExecutor(max_workers=3) as pool:
        lint = pool.submit(lint_test, code, file_name, subject, tests_root)
        runs = [pool.submit(_run_engine_test, code, file_name, tests_root, s, must, against, expected, message)
                for s, must, against in jobs]
        return {"lint": lint.result(), "verified": [r.result() for r in runs],
                "other_side": why if other is None else None}
