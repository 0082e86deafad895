"""A fuzz run as JSON (``kvspec.fuzz/3``) and as Markdown: the run's status
and verdict first, a row per subject, then each finding.

"no discrepancy" is printed only for a run that covered every subject it was
asked to, in full; a run that stopped says INCOMPLETE or INTERRUPTED and why,
with whatever it had found.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.about import SCHEMAS, versions
from kvspec.model.outcome import Outcome

from .finding import render_markdown as render_finding_markdown

__all__ = ["fuzz_document", "render_markdown", "verdict_line"]


def fuzz_document(run) -> dict[str, Any]:
    """The machine-readable twin of a ``usecases.FuzzRun``."""
    return {
        "schema": SCHEMAS["fuzz"],
        "versions": versions(),
        "status": run.status,
        "outcome": run.outcome.name,
        "stopped": run.why or None,
        "planned_subjects": list(run.planned),
        "settings": run.settings.as_dict(),
        "subjects": [{**s.result.as_dict(), "finding": None if s.finding is None else s.finding.to_dict()}
                     for s in run.subjects],
        "errors": run.errors,
    }


def verdict_line(run) -> str:
    findings = [s.finding for s in run.subjects if s.finding is not None]
    if findings:
        verdicts = sorted({f.ledger.blame.value for f in findings if f.ledger})
        verdict = "DISCREPANCY" + (f" ({', '.join(verdicts)})" if verdicts else "")
    elif run.errors:
        verdict = "ERROR"
    elif run.outcome is Outcome.OK:
        verdict = "no discrepancy"
    else:
        verdict = "no discrepancy found so far"
    if run.status != "COMPLETE":
        done = len(run.subjects) + len(run.errors)
        verdict = f"{run.status} ({run.why}; {done} of {len(run.planned)} subjects covered): " + verdict
    return verdict


def render_markdown(run) -> str:
    v = versions()
    lines = [f"## kvspec fuzz: {verdict_line(run)}", "",
             f"seed {run.settings.seed}, kvspec {v['kvspec']}, z3 {v['z3']}, hypothesis {v['hypothesis']}", "",
             "| subject | vLLM | verdict | cases | seconds |", "|---|---|---|---|---|"]
    for s in run.subjects:
        subj = s.result.subject
        version = subj.get("vllm_version") or ""
        if subj.get("git_commit"):
            version += f" @ {subj['git_commit'][:12]}"
        lines.append(f"| {subj['label']} | {version} | {s.result.verdict} | {s.result.cases} | "
                     f"{round(s.result.seconds, 1)} |")
    for e in run.errors:
        lines.append(f"| {e['subject']['label']} | | error: {e['error']} | | |")
    covered = {s.result.subject["label"] for s in run.subjects} | {e["subject"]["label"] for e in run.errors}
    for label in run.planned:
        if label not in covered:
            lines.append(f"| {label} | | not run | | |")
    lines.append("")
    for s in run.subjects:
        if s.finding is not None:
            lines.append(render_finding_markdown(s.finding, heading="###",
                                                 plot_path=s.finding.artifacts.get("plot")))
    return "\n".join(lines).rstrip("\n") + "\n"
