"""A fuzz run as JSON (``kvspec.fuzz/4``) and as Markdown: each finding's
impact sentence first, then the run's status and verdict, a row per subject
and differential (examples, what was checked -- cases or operations --, how
far in the first discrepancy came and the time of fuzzing with shrinking,
each under its own name), then each finding.

"no discrepancy" is printed only for a run that covered every subject it was
asked to, in full; a run that stopped says INCOMPLETE or INTERRUPTED and why,
with whatever it had found.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.about import SCHEMAS, versions
from kvspec.model.outcome import Outcome, RunStatus

from .escape import md_inline as _md
from .finding import impact_sentence, public_label
from .finding import render_markdown as render_finding_markdown
from .finding import render_text

__all__ = ["fuzz_document", "render_markdown", "subject_run_lines", "verdict_line"]


def fuzz_document(run) -> dict[str, Any]:
    """The machine-readable twin of a ``usecases.fuzz.FuzzRun``."""
    return {
        "schema": SCHEMAS["fuzz"],
        "versions": versions(),
        "status": run.status.value,
        "outcome": run.outcome.name,
        "stopped": run.why or None,
        "planned_subjects": list(run.planned),
        "settings": run.settings.as_dict(),
        "subjects": [{**s.result.as_dict(), "control_reused": s.reused,
                      "finding": None if s.finding is None else s.finding.to_dict(),
                      "other_findings": [{"finding": f.to_dict(), "path": str(p)} for f, p in s.others]}
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
    if run.status is not RunStatus.COMPLETE:
        # Covered: run to the end of its budget (or to its finding); a run the
        # stop cut short is said apart, never counted as covered.
        cut = sum(1 for s in run.subjects if getattr(s.result, "stopped", None) is not None)
        done = len(run.subjects) - cut + len(run.errors)
        also = f", {cut} stopped part-way" if cut else ""
        verdict = (f"{run.status.value} ({run.why}; {done} of {len(run.planned)} subjects covered{also}): "
                   + verdict)
    return verdict


def render_markdown(run) -> str:
    """Each finding's impact first (the sentence a reviewer decides on), then
    the run's verdict and a row per subject, then each finding in full."""
    v = versions()
    findings = [s.finding for s in run.subjects if s.finding is not None]
    lines = [f"**Impact:** {_md(public_label(impact_sentence(f)))}" for f in findings]
    lines += [""] if lines else []
    lines += [f"## kvspec fuzz: {_md(public_label(verdict_line(run)))}", "",
              f"seed {run.settings.seed}, kvspec {v['kvspec']}, z3 {v['z3']}, hypothesis {v['hypothesis']}", "",
              "| subject | vLLM | differential | verdict | Hypothesis examples | checked | "
              "to the first discrepancy | fuzzing and shrinking (s) |",
              "|---|---|---|---|---|---|---|---|"]
    for s in run.subjects:
        subj = s.result.subject
        version = subj.get("vllm_version") or ""
        if subj.get("git_commit"):
            version += f" @ {subj['git_commit'][:12]}"
        first = s.result.first_failure() or "-"
        verdict = s.result.verdict + (" (reused control, below)" if s.reused else "")
        lines.append(f"| {_md(public_label(subj['label']))} | {_md(version)} | {s.differential} | "
                     f"{_md(verdict)} | {s.result.examples} | {s.result.cases} {s.result.units} | "
                     f"{first} | {s.result.seconds:.1f} |")
    for e in run.errors:
        lines.append(f"| {_md(public_label(e['subject']['label']))} | | | error: "
                     f"{_md(public_label(str(e['error'])))} | | | | |")
    covered = {s.result.subject["label"] for s in run.subjects} | {e["subject"]["label"] for e in run.errors}
    for label in run.planned:
        if label not in covered:
            lines.append(f"| {_md(public_label(label))} | | | not run | | | | |")
    lines.append("")
    lines += [f"{_md(public_label(s.reused))}." for s in run.subjects if s.reused]
    lines += [""] if any(s.reused for s in run.subjects) else []
    # What a program differential's verdict covers and leaves out, said in every format.
    for s in run.subjects:
        if s.differential in ("stateful", "engine"):
            lines += [f"<details><summary>what the {s.differential} differential on "
                      f"{_md(public_label(s.result.subject['label']))} covered and did not</summary>", "",
                      _md(public_label(s.result.scope())), "", "</details>", ""]
    for f in findings:
        if f.run.get("incomplete"):  # kept as found: its completion or storage did not finish
            lines += [f"**INCOMPLETE finding:** {_md(public_label(str(f.run['incomplete'])))}", ""]
        lines.append(render_finding_markdown(f, heading="###", lead=False))
    return "\n".join(lines).rstrip("\n") + "\n"


def subject_run_lines(entry) -> list[str]:
    """The lines that say one differential's result on one subject as a run
    goes (a ``usecases.fuzz.SubjectRun``): its verdict, coverage and rate, or
    why it stopped, or its finding in full; then what it holds under and what
    was not driven."""
    lines: list[str] = []
    add = lines.append
    result, finding = entry.result, entry.finding
    label = f"{result.subject['label']} [{entry.differential}]"
    rate = result.cases / result.seconds if result.seconds else 0.0
    in_parallel = f", {entry.jobs} jobs" if entry.jobs > 1 else ""
    restarts = (f"; {len(result.restarts)} worker restart(s) the retry did not reproduce (the machine's, "
                f"not vLLM's): {result.restarts[0]}" if result.restarts else "")
    if finding is None and result.stopped is None and result.scope_reduction:
        add(f"{label}: {RunStatus.REDUCED_SCOPE.value}: {result.scope_reduction}")
    if entry.reused:
        add(f"{label}: {result.verdict} in {result.coverage()}; {entry.reused} (it took {result.seconds:.1f} s "
            "then)")
    elif finding is None and result.stopped is None:
        add(f"{label}: {result.verdict} in {result.coverage()} ({result.seconds:.1f} s, "
            f"{rate:.0f} {result.units}/s{in_parallel}){restarts}")
        if entry.drives_programs:
            add(f"  scope: {result.scope()}")
    elif finding is None:
        add(f"{label}: STOPPED after {result.cases} {result.units}: {result.stopped_why}")
    else:
        add(render_text(finding))
        if finding.reach is not None:
            add(f"  who is affected: {finding.reach.summary}")
        if entry.finding.run.get("incomplete"):
            add(f"  INCOMPLETE finding: {entry.finding.run['incomplete']}")
        add(f"  stored: {entry.finding_path}" if entry.finding_path is not None
            else "  NOT STORED: it is only in this run's reports")
        if getattr(result, "other_failures", ()) and not entry.drives_programs:
            add(f"  {len(result.other_failures)} other distinct failure(s) found by other jobs: "
                + "; ".join(f.case.describe() for f in result.other_failures))
        for other, path in entry.others:
            add(f"  also broken in this run (found within Hypothesis's search after the first; not a complete "
                f"list): {other.detail}; program: {other.inputs.get('describe')}; stored: {path}")
    # Under which hash schemes and scopes the result holds, and what was not driven.
    if entry.differential == "engine":
        if finding is not None:
            add(f"  {finding.inputs.get('how_a_user_reaches_it')}")
        return lines
    if entry.differential == "stateful":
        return lines
    add(f"  {result.scheme_text}; deployment profiles: "
        + (f"{result.tally.deployment_cases} cases on {result.deployment_configs} derived configurations"
           if result.deployment_configs else result.deployments_note))
    for item in result.capabilities.not_covered():
        add(f"  not covered: {item}")
    for name, first in sorted(result.known_first.items()):
        add(f"  known vLLM bug {name} (model/known.py) met in {result.known_met[name]} example(s), each ended "
            f"at that case (the rest of its batch is not compared; the search went on); first: {first}")
    return lines
