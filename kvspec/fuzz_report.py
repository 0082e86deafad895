"""Completing a fuzz failure into a stored, reviewable finding.

While the subject is still live: sweep registered-vs-computed tokens for the
plot, emit the regression test, check it fails on the subject (and passes on
the unmutated release when the subject is a kvspec mutant), then store the
finding (JSON), the test and the plot side by side for replay.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs

from model.finding import Category, Finding

__all__ = ["complete_finding", "store_finding"]

_SWEPT = (Category.UNDER_REGISTRATION, Category.OVER_REGISTRATION, Category.BLOCK_MISMATCH)


def _stem(finding: Finding) -> str:
    subject = finding.compared.get("subject", {})
    label = subject.get("version") or Path(subject.get("path") or "current").name
    return f"finding-{label}-{finding.category.value}-{time.strftime('%Y%m%d-%H%M%S')}"


def verify_test(test_path: Path, subject_spec, marker: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Run the emitted test where it must fail (the subject) and, for a mutant,
    where it must pass (the release the mutant was made from)."""
    from oracles.subject import run_pytest, source_tree

    checks = [{**run_pytest(subject_spec, str(test_path)), "must": "failed"}]
    if marker and marker.get("source_root") and Path(marker["source_root"]).is_dir():
        base = source_tree(marker["source_root"])
        checks.append({**run_pytest(base, str(test_path)), "must": "passed",
                       "against": f"unmutated {base.label}"})
    from kvspec.regression_test import ASSERT_MESSAGES

    for check in checks:
        # A failure counts only when it is the emitted assertion, not an error on the way.
        genuine = check["must"] != "failed" or any(m in check.get("output", "") for m in ASSERT_MESSAGES)
        check["as_expected"] = check["outcome"] == check["must"] and genuine
    return checks


def _real_code(spec) -> dict[str, Any]:
    """The ledger's fourth leg: the subject's registration method, symbolically."""
    from oracles.symbolic import symbolic_check

    verdict = symbolic_check(spec)
    return {"status": verdict.status.value, "target": verdict.target, "detail": verdict.detail,
            "counterexample": verdict.counterexample and {
                k: verdict.counterexample[k] for k in ("args", "real", "spec")},
            "seconds": verdict.seconds}


def complete_finding(proc, result, findings_dir: Path, versions: dict[str, str],
                     verify: bool = True) -> tuple[Finding, Path]:
    from oracles.sweep import sweep, sweep_range

    from kvspec.findings import fuzz_finding
    from kvspec.plot import render_svg
    from kvspec.regression_test import emit_test, test_file_name

    finding = fuzz_finding(result, versions)
    findings_dir.mkdir(parents=True, exist_ok=True)
    stem = _stem(finding)
    path = findings_dir / f"{stem}.json"
    artifacts = {"finding": str(path)}
    finding = attrs.evolve(finding, replay=f"kvspec replay {path}")
    if finding.category in _SWEPT:
        case = result.failure.case
        finding = attrs.evolve(finding, sweep=sweep(proc, case, sweep_range(case, finding.n)))
        plot = findings_dir / f"{stem}.svg"
        plot.write_text(render_svg(finding))
        artifacts["plot"] = str(plot)
    if finding.ledger is not None and finding.category in _SWEPT:
        finding = attrs.evolve(finding, ledger=attrs.evolve(finding.ledger, real_code=_real_code(proc.spec)))
    code = emit_test(finding, proc.capabilities)
    if code is not None:
        test_dir = findings_dir / stem
        test_dir.mkdir(exist_ok=True)
        test_path = test_dir / test_file_name(finding)
        test_path.write_text(code)
        artifacts["regression_test"] = str(test_path)
        checks = verify_test(test_path, proc.spec, finding.compared.get("mutant")) if verify else []
        finding = attrs.evolve(finding, regression_test={
            "file_name": test_path.name, "path": str(test_path), "code": code, "verified": checks})
    finding = attrs.evolve(finding, artifacts=artifacts)
    store_finding(finding, path)
    return finding, path


def store_finding(finding: Finding, path: Path) -> None:
    path.write_text(json.dumps(finding.to_dict(), indent=2, sort_keys=True) + "\n")
