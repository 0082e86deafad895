"""Completing a fuzz failure into a stored, reviewable finding.

While the subject is still live: sweep registered-vs-computed tokens for the
plot and emit the regression test; meanwhile, overlapping that and one
another, the proofs explain the failure (Z3, in a thread), the subject's
registration code is checked symbolically and, on a mutant or a tree, the
release's own tests run on it (``vllm_suite``).  If one of those already
fails there, the emitted test is kept as an artifact but not proposed (it
would duplicate vLLM's); otherwise it runs where it must fail (the subject)
and, for a kvspec mutant, where it must pass (the release it was made from),
each in its own process, and is linted with that release's ruff
configuration when ruff is installed.  The finding (JSON) is stored as soon as it exists and again
after each step, so an error or an interrupt during completion never loses
it.  How long each stage took is kept in ``run["completion_seconds"]``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import attrs

from kvspec.model.finding import Category, Finding

__all__ = ["complete_finding", "store_finding", "store_raw_finding", "verify_test", "lint_test",
           "explain_stage", "sweep_stage", "plot_stage", "real_code_stage", "emit_stage", "vllm_tests_stage",
           "tests_root_or_none", "STAGES", "offered_test"]

_SWEPT = (Category.UNDER_REGISTRATION, Category.OVER_REGISTRATION, Category.BLOCK_MISMATCH)
# The stages of completion, in order (``bench_report.py`` times each).
STAGES = ("explain", "sweep", "plot", "emit", "symbolic leg", "vLLM's own tests", "test on the subject",
          "test on the release", "ruff")


def finding_stem(finding: Finding) -> str:
    """The file name (without suffix) a finding is stored under."""
    subject = finding.compared.get("subject", {})
    label = subject.get("version") or Path(subject.get("path") or "current").name
    if subject.get("mutant"):
        label += f"-{subject['mutant']}"
    return f"finding-{label}-{finding.category.value}-{time.strftime('%Y%m%d-%H%M%S')}"


def _release_of(subject_spec):
    """The release a kvspec mutant was made from (None for any other subject)."""
    from kvspec.subjects.subject import release

    return release(subject_spec.version) if subject_spec.kind == "mutant" else None


def _run_in(test_code: str, file_name: str, tests_root: Path | None, subject, must: str,
            against: str | None = None) -> dict[str, Any]:
    """Run the test laid out as in vLLM's repository, in a scratch directory."""
    from kvspec.emit.regression_test import ASSERT_MESSAGES
    from kvspec.emit.vllm_tests import verification_tree
    from kvspec.subjects.testrun import run_pytest

    with tempfile.TemporaryDirectory(prefix="kvspec-test-") as scratch:
        path = verification_tree(Path(scratch), tests_root, file_name, test_code)
        started = time.perf_counter()
        check = {**run_pytest(subject, str(path)), "must": must,
                 "seconds": round(time.perf_counter() - started, 2)}
    if against:
        check["against"] = against
    # A failure counts only when it is the emitted assertion, not an error on the way.
    genuine = must != "failed" or any(m in check.get("output", "") for m in ASSERT_MESSAGES)
    check["as_expected"] = check["outcome"] == must and genuine
    return check


def verify_test(test_code: str, file_name: str, subject_spec, tests_root: Path | None = None,
                pool: ThreadPoolExecutor | None = None) -> list[dict[str, Any]]:
    """Run the emitted test where it must fail (the subject) and, for a
    mutant, where it must pass (the release the mutant was made from); the
    two runs at the same time."""
    base = _release_of(subject_spec)
    jobs = [(subject_spec, "failed", None)]
    if base is not None:
        jobs.append((base, "passed", f"unmutated {base.label}"))
    own = pool is None
    pool = pool or ThreadPoolExecutor(max_workers=len(jobs))
    try:
        futures = [pool.submit(_run_in, test_code, file_name, tests_root, s, must, against)
                   for s, must, against in jobs]
        return [f.result() for f in futures]
    finally:
        if own:
            pool.shutdown()


def lint_test(test_code: str, file_name: str, subject_spec, tests_root: Path | None) -> dict[str, Any] | None:
    """ruff with the release's configuration, when ruff is installed and the
    release's configuration is known (None otherwise: not checked)."""
    from kvspec.emit.vllm_tests import ruff_available, ruff_check
    from kvspec.subjects.subject import release, resolve_subject

    if tests_root is None or not (tests_root / "pyproject.toml").is_file() or not ruff_available():
        return None
    if subject_spec.kind in ("release", "mutant"):
        tree = resolve_subject(release(subject_spec.version))[1]
    else:
        tree = subject_spec.path
    started = time.perf_counter()
    return {**ruff_check(tests_root, Path(tree), file_name, test_code),
            "seconds": round(time.perf_counter() - started, 2)}


def real_code_stage(subject) -> dict[str, Any]:
    """The ledger's fourth leg: the subject's registration method,
    symbolically.  On a release or a kvspec mutant a definite verdict
    (REFUTED, VERIFIED) is a function of the tree and kvspec's code: recorded
    once and reused, with the date it was recorded."""
    from kvspec.subjects.symbolic import symbolic_check

    def check() -> dict[str, Any]:
        verdict = symbolic_check(subject)
        return {"status": verdict.status.value, "target": verdict.target, "detail": verdict.detail,
                "counterexample": verdict.counterexample and {
                    k: verdict.counterexample[k] for k in ("args", "real", "spec")},
                "seconds": verdict.seconds}

    if subject.kind not in ("release", "mutant"):
        return check()
    from kvspec.controls import recorded_value

    value, recorded = recorded_value("symbolic", subject, {"mutant": subject.mutant}, check,
                                     keep=lambda v: v["status"] in ("REFUTED", "VERIFIED"))
    return {**value, "recorded": recorded} if recorded else value


def explain_stage(result, versions: dict[str, str]) -> Finding:
    from kvspec.findings.assemble import fuzz_finding

    return fuzz_finding(result, versions)


def sweep_stage(proc, result, finding: Finding) -> dict[str, Any]:
    from kvspec.subjects.drivers.sweep import sweep, sweep_range

    case = result.failure.case
    return sweep(proc, case, sweep_range(case, finding.n))


def plot_stage(finding: Finding, base: Path) -> dict[str, str]:
    """The plot as SVG and PNG next to the finding: ``{"plot": svg, "plot_png": png}``."""
    from kvspec.report.plot import render_png, render_svg

    # The stem has dots of its own (a version number): never Path.with_suffix.
    svg, png = base.parent / f"{base.name}.svg", base.parent / f"{base.name}.png"
    svg.write_text(render_svg(finding))
    png.write_bytes(render_png(finding))
    return {"plot": str(svg), "plot_png": str(png)}


def emit_stage(finding: Finding, capabilities, idiom) -> tuple[str | None, str | None]:
    """The test and its ``xfail(strict=True)`` form."""
    from kvspec.emit.regression_test import emit_test

    code = emit_test(finding, capabilities, idiom)
    return code, (emit_test(finding, capabilities, idiom, xfail=True) if code else None)


def vllm_tests_stage(subject, tests_root: Path | None) -> dict[str, Any]:
    """The release's own tests on the subject (and its release), first;
    every finding kind asks them here (registration and stateful)."""
    from kvspec.findings.vllm_suite import ask_vllm_tests

    return ask_vllm_tests(subject, tests_root)


def tests_root_or_none(subject) -> Path | None:
    """The release's tests for ``subject`` (``emit.vllm_tests.tests_root_of``),
    or None, said on the console, when they cannot be had."""
    from kvspec.emit.vllm_tests import tests_root_of

    try:
        return tests_root_of(subject)
    except Exception as exc:  # no network, no sdist: the test builds its own manager
        from kvspec.subjects.provision import report

        report(f"vLLM's test helpers are not available ({exc}); the emitted test builds its own manager")
        return None


def _timed(seconds: dict[str, float], stage: str, fn: Callable, *args) -> Any:
    started = time.perf_counter()
    try:
        return fn(*args)
    finally:
        seconds[stage] = round(time.perf_counter() - started, 2)


def complete_finding(proc, result, findings_dir: Path, versions: dict[str, str],
                     verify: bool = True) -> tuple[Finding, Path]:
    """The finding of ``result``, completed and stored.  The proofs'
    explanation (Z3, which releases the interpreter while it solves), the
    symbolic leg and the two test runs (processes of their own) overlap the
    rest and one another; the finding is stored after each step."""
    from kvspec.findings.assemble import fuzz_finding
    from kvspec.emit.regression_test import pytest_command, test_file_name, test_name
    from kvspec.findings.vllm_suite import already_caught, covering_module
    from kvspec.emit.vllm_tests import idiom_of

    seconds: dict[str, float] = {}
    with ThreadPoolExecutor(max_workers=5) as pool:
        explained = pool.submit(_timed, seconds, "explain", explain_stage, result, versions)
        tests_root = tests_root_or_none(proc.subject)
        # vLLM's own tests first, beside everything else: if one already
        # fails on the subject, kvspec proposes no test of its own.
        asked = pool.submit(_timed, seconds, "vLLM's own tests", vllm_tests_stage, proc.subject, tests_root) \
            if result.failure.category in _SWEPT else None
        # Everything but the explanation, at once: the sweep, the plot and the
        # test need only the case and the per-group values.
        finding = fuzz_finding(result, versions, explain=False)
        findings_dir.mkdir(parents=True, exist_ok=True)
        stem = finding_stem(finding)
        path = findings_dir / f"{stem}.json"
        artifacts = {"finding": str(path)}

        def save(f: Finding) -> Finding:
            f = attrs.evolve(f, artifacts=dict(artifacts), run={**f.run, "completion_seconds": dict(seconds)})
            store_finding(f, path)
            return f

        finding = save(attrs.evolve(finding, replay=f"kvspec replay {path}"))
        swept = finding.category in _SWEPT
        real_code = None
        if finding.ledger is not None and swept:
            real_code = pool.submit(_timed, seconds, "symbolic leg", real_code_stage, proc.subject)
        if swept:
            finding = attrs.evolve(finding, sweep=_timed(seconds, "sweep", sweep_stage, proc, result, finding))
            artifacts.update(_timed(seconds, "plot", plot_stage, finding, findings_dir / stem))
            finding = save(finding)
        idiom = idiom_of(tests_root)
        code, xfail_code = _timed(seconds, "emit", emit_stage, finding, proc.capabilities, idiom)
        vllm_tests = asked.result() if asked is not None else None
        if vllm_tests is not None:
            finding = save(attrs.evolve(finding, vllm_tests=vllm_tests))
        # Already caught by a test of vLLM's own: kvspec's would duplicate it.
        proposed = not already_caught(vllm_tests)
        if code is not None:
            file_name = test_file_name(finding)
            test_dir = findings_dir / stem
            (test_dir / "xfail").mkdir(parents=True, exist_ok=True)
            test_path = test_dir / file_name
            test_path.write_text(code)
            (test_dir / "xfail" / file_name).write_text(xfail_code)
            artifacts["regression_test"] = str(test_path)
            artifacts["regression_test_xfail"] = str(test_dir / "xfail" / file_name)
            checks: list[dict[str, Any]] = []
            lint = None
            if verify and proposed:
                checks = verify_test(code, file_name, proc.subject, tests_root, pool)
                for check in checks:
                    seconds["test on the subject" if check["must"] == "failed" else "test on the release"] = \
                        check["seconds"]
                lint = lint_test(code, file_name, proc.subject, tests_root)
                if lint is not None:
                    seconds["ruff"] = lint["seconds"]
            finding = attrs.evolve(finding, regression_test={
                "file_name": file_name, "path": str(test_path), "code": code,
                "test_name": test_name(finding, proc.capabilities),
                "command": pytest_command(finding, proc.capabilities),
                "idiom": idiom.as_dict(), "verified": checks, "lint": lint, "proposed": proposed,
                # Where it belongs in vLLM: the release's module that already covers the area.
                "module": covering_module(tests_root, "get_computed_blocks" if finding.category.value in
                                          ("lookup_contract", "hit_mismatch") else "cache_blocks")})
        full = explained.result()
        finding = attrs.evolve(finding, explanation=full.explanation)
        if real_code is not None:
            finding = attrs.evolve(finding, ledger=attrs.evolve(finding.ledger, real_code=real_code.result()))
    finding = save(finding)
    return finding, path


def store_raw_finding(result, findings_dir: Path, versions: dict[str, str]) -> tuple[Finding, Path]:
    """A failure from a run that stopped early, stored as found (not
    minimised, explained or swept: the run could not finish)."""
    from kvspec.findings.assemble import fuzz_finding

    finding = fuzz_finding(result, versions, explain=False)
    findings_dir.mkdir(parents=True, exist_ok=True)
    path = findings_dir / f"{finding_stem(finding)}.json"
    finding = attrs.evolve(finding, replay=f"kvspec replay {path}", artifacts={"finding": str(path)},
                           run={**finding.run, "stopped": result.stopped_why})
    store_finding(finding, path)
    return finding, path


def store_finding(finding: Finding, path: Path) -> None:
    """Write atomically: a reader never sees half a finding."""
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(finding.to_dict(), indent=2, sort_keys=True) + "\n")
    os.replace(partial, path)


def offered_test(code: str, test_path: Path, name: str, module: str | None, checked: dict[str, Any],
                 subject, **more: Any) -> dict[str, Any]:
    """A program finding's test record (stateful or engine): offered only
    when it lints clean and fails on the subject as the finding did."""
    lint, runs = checked["lint"], checked["verified"]
    why_not = None
    if lint is not None and lint.get("outcome") != "passed":
        why_not = "it does not pass ruff with the release's configuration"
    elif not runs[0].get("as_expected"):
        why_not = f"it did not fail on {subject.label} as the finding did"
    return {"file_name": test_path.name, "path": str(test_path), "code": code, "test_name": name, **more,
            "module": module, "proposed": why_not is None, "why_not_proposed": why_not,
            "command": f"pytest {module or 'tests/v1/core/' + test_path.name}::{name}", **checked}

