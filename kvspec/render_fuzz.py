"""Markdown for a fuzz run: verdict first, one table per finding, details folded."""

from __future__ import annotations

import json
from typing import Any


def _finding_md(subject: dict[str, Any]) -> list[str]:
    finding = subject["finding"]
    lines = [f"**Minimal example:** `{finding['case_text']}`", ""]
    for d in finding["discrepancies"]:
        if d["call"] is None:
            lines.append(f"- {d['category']}: {d['detail']}")
            continue
        lines += [
            f"`cache_blocks` call {d['call']} (n = {d['n']}), {d['category'].replace('_', '-')}:",
            "",
            "| group | spec tokens | vLLM tokens | spec blocks | vLLM blocks |",
            "|---|---|---|---|---|",
        ]
        for g, (et, ot, eb, ob) in enumerate(zip(d["expected_tokens"], d["observed_tokens"],
                                                 d["expected_blocks"], d["observed_blocks"])):
            mark = "" if et == ot else " **≠**"
            lines.append(f"| {g} | {et} | {ot}{mark} | {eb} | {ob} |")
        lines.append("")
    traceback = finding["observed"].get("traceback")
    if traceback:
        lines += ["<details><summary>vLLM traceback</summary>", "", "```", traceback.strip(), "```",
                  "", "</details>", ""]
    lines += ["<details><summary>observations (JSON)</summary>", "", "```json",
              json.dumps(finding["observed"], indent=1)[:20000], "```", "", "</details>", ""]
    return lines


def render_markdown(doc: dict[str, Any]) -> str:
    subjects, errors = doc["subjects"], doc["errors"]
    failing = [s for s in subjects if s["finding"]]
    verdict = "DISCREPANCY" if failing else ("ERROR" if errors else "no discrepancy")
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
    for s in failing:
        lines += [f"### {s['subject']['label']}: {s['finding']['category'].replace('_', ' ')}", ""]
        lines += _finding_md(s)
    return "\n".join(lines) + "\n"
