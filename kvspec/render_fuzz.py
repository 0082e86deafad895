"""Markdown for a fuzz run: verdict first, a row per subject, then each finding."""

from __future__ import annotations

from typing import Any

from model.finding import Finding

from kvspec.render_finding import render_markdown as render_finding_markdown


def render_markdown(doc: dict[str, Any]) -> str:
    subjects, errors = doc["subjects"], doc["errors"]
    findings = [Finding.from_dict(s["finding"]) for s in subjects if s.get("finding")]
    if findings:
        verdicts = sorted({f.ledger.verdict.value for f in findings if f.ledger})
        verdict = "DISCREPANCY" + (f" ({', '.join(verdicts)})" if verdicts else "")
    else:
        verdict = "ERROR" if errors else "no discrepancy"
    lines = [f"## kvspec fuzz: {verdict}", "",
             f"seed {doc['settings']['seed']}, kvspec {doc['versions']['kvspec']}, "
             f"z3 {doc['versions']['z3']}, hypothesis {doc['versions']['hypothesis']}", "",
             "| subject | vLLM | verdict | cases | seconds |", "|---|---|---|---|---|"]
    for s in subjects:
        subj = s["subject"]
        version = subj.get("vllm_version") or ""
        if subj.get("git_commit"):
            version += f" @ {subj['git_commit'][:12]}"
        lines.append(f"| {subj['label']} | {version} | {s['verdict']} | {s['cases']} | {s['seconds']} |")
    for e in errors:
        lines.append(f"| {e['subject']['label']} | | error: {e['error']} | | |")
    lines.append("")
    for f in findings:
        lines.append(render_finding_markdown(f, heading="###", plot_path=f.artifacts.get("plot")))
    return "\n".join(lines).rstrip("\n") + "\n"
