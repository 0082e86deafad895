"""Completing a fuzz failure into a stored, reviewable finding.

While the subject is still live: sweep registered-vs-computed tokens for the
plot, check the subject's registration code symbolically, emit the regression
test and check it fails on the subject (and passes on the unmutated release
when the subject is a kvspec mutant).  The finding (JSON) is stored as soon
as it exists and again after each step, so an error or an interrupt during
completion never loses it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import attrs

from kvspec.model.finding import Category, Finding

__all__ = ["complete_finding", "store_finding", "store_raw_finding", "verify_test"]

_SWEPT = (Category.UNDER_REGISTRATION, Category.OVER_REGISTRATION, Category.BLOCK_MISMATCH)


def _stem(finding: Finding) -> str:
    subject = finding.compared.get("subject", {})
    label = subject.get("version") or Path(subject.get("path") or "current").name
    if subject.get("mutant"):
        label += f"-{subject['mutant']}"
    return f"finding-{label}-{finding.category.value}-{time.strftime('%Y%m%d-%H%M%S')}"


def verify_test(test_path: Path, subject_spec) -> list[dict[str, Any]]:
    """Run the emitted test where it must fail (the subject) and, for a mutant,
    where it must pass (the release the mutant was made from)."""
    from kvspec.report.regression_test import ASSERT_MESSAGES
    from kvspec.subjects.subject import release
    from kvspec.subjects.testrun import run_pytest

    checks = [{**run_pytest(subject_spec, str(test_path)), "must": "failed"}]
    if subject_spec.kind == "mutant":
        base = release(subject_spec.version)
        checks.append({**run_pytest(base, str(test_path)), "must": "passed",
                       "against": f"unmutated {base.label}"})
    for check in checks:
        # A failure counts only when it is the emitted assertion, not an error on the way.
        genuine = check["must"] != "failed" or any(m in check.get("output", "") for m in ASSERT_MESSAGES)
        check["as_expected"] = check["outcome"] == check["must"] and genuine
    return checks


def _real_code(subject) -> dict[str, Any]:
    """The ledger's fourth leg: the subject's registration method, symbolically."""
    from kvspec.subjects.symbolic import symbolic_check

    verdict = symbolic_check(subject)
    return {"status": verdict.status.value, "target": verdict.target, "detail": verdict.detail,
            "counterexample": verdict.counterexample and {
                k: verdict.counterexample[k] for k in ("args", "real", "spec")},
            "seconds": verdict.seconds}


def complete_finding(proc, result, findings_dir: Path, versions: dict[str, str],
                     verify: bool = True) -> tuple[Finding, Path]:
    from kvspec.report.findings import fuzz_finding
    from kvspec.report.plot import render_svg
    from kvspec.report.regression_test import emit_test, test_file_name
    from kvspec.subjects.drivers.sweep import sweep, sweep_range

    finding = fuzz_finding(result, versions)
    findings_dir.mkdir(parents=True, exist_ok=True)
    stem = _stem(finding)
    path = findings_dir / f"{stem}.json"
    artifacts = {"finding": str(path)}
    finding = attrs.evolve(finding, replay=f"kvspec replay {path}", artifacts=dict(artifacts))
    store_finding(finding, path)
    if finding.category in _SWEPT:
        case = result.failure.case
        finding = attrs.evolve(finding, sweep=sweep(proc, case, sweep_range(case, finding.n)))
        plot = findings_dir / f"{stem}.svg"
        plot.write_text(render_svg(finding))
        artifacts["plot"] = str(plot)
        store_finding(attrs.evolve(finding, artifacts=dict(artifacts)), path)
    if finding.ledger is not None and finding.category in _SWEPT:
        finding = attrs.evolve(finding, ledger=attrs.evolve(finding.ledger, real_code=_real_code(proc.subject)))
        store_finding(attrs.evolve(finding, artifacts=dict(artifacts)), path)
    code = emit_test(finding, proc.capabilities)
    if code is not None:
        test_dir = findings_dir / stem
        test_dir.mkdir(exist_ok=True)
        test_path = test_dir / test_file_name(finding)
        test_path.write_text(code)
        artifacts["regression_test"] = str(test_path)
        checks = verify_test(test_path, proc.subject) if verify else []
        finding = attrs.evolve(finding, regression_test={
            "file_name": test_path.name, "path": str(test_path), "code": code, "verified": checks})
    finding = attrs.evolve(finding, artifacts=artifacts)
    store_finding(finding, path)
    return finding, path


def store_raw_finding(result, findings_dir: Path, versions: dict[str, str]) -> tuple[Finding, Path]:
    """A failure from a run that stopped early, stored as found (not
    minimised, explained or swept: the run could not finish)."""
    from kvspec.report.findings import fuzz_finding

    finding = fuzz_finding(result, versions, explain=False)
    findings_dir.mkdir(parents=True, exist_ok=True)
    path = findings_dir / f"{_stem(finding)}.json"
    finding = attrs.evolve(finding, replay=f"kvspec replay {path}", artifacts={"finding": str(path)},
                           run={**finding.run, "stopped": result.stopped_why})
    store_finding(finding, path)
    return finding, path


def store_finding(finding: Finding, path: Path) -> None:
    """Write atomically: a reader never sees half a finding."""
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(finding.to_dict(), indent=2, sort_keys=True) + "\n")
    os.replace(partial, path)
