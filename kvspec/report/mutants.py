"""The kill matrix: one row per mutant, one column per technique.

Fuzzing's columns are named for what they count: the differential cases (or,
for the stateful differential, the programs) run until the first
discrepancy, and the seconds into fuzzing it took (not the whole run with
shrinking)."""

from __future__ import annotations

from typing import Any

__all__ = ["render_matrix"]


def render_matrix(rows: list[dict[str, Any]]) -> str:
    """One column per technique: the proof (model), the per-request
    differential (registration, or lookup for lookup- and state-side
    mutants), the stateful differential, the exhaustive two-group scope, and
    symbolic when run; the category is the first killing technique's."""
    width = max(len(r["mutant"]) for r in rows)
    symbolic = any("symbolic" in r for r in rows)
    head = (f"{'mutant':<{width}}  {'proof':<14} {'fuzzing':<14} {'cases to kill':>13} {'s to kill':>9}  "
            f"{'stateful':<14} {'programs to kill':>16} {'s':>5}  "
            f"{'exhaustive':<10} {'failing':>9} {'s':>5}")
    out = [head + (f"  {'symbolic':<14} {'s':>5}" if symbolic else "") + "  category"]
    for r in rows:
        cases = "" if r.get("cases_to_kill") is None else str(r["cases_to_kill"])
        secs = "" if r.get("seconds_to_kill") is None else f"{r['seconds_to_kill']:.2f}"
        programs = "" if r.get("programs_to_kill") is None else str(r["programs_to_kill"])
        ssecs = "" if r.get("stateful_seconds_to_kill") is None else f"{r['stateful_seconds_to_kill']:.2f}"
        line = (f"{r['mutant']:<{width}}  {r['model']:<14} {r.get('fuzz', r['status']):<14} {cases:>13} "
                f"{secs:>9}  {r.get('stateful', ''):<14} {programs:>16} {ssecs:>5}  "
                f"{r.get('exhaustive', ''):<10} {r.get('exhaustive_failing', ''):>9} "
                f"{r.get('exhaustive_seconds', ''):>5}")
        if symbolic:
            line += f"  {r.get('symbolic', ''):<14} {r.get('symbolic_seconds', ''):>5}"
        out.append((line + f"  {r.get('category') or r.get('stateful_category') or r.get('error') or ''}").rstrip())
    return "\n".join(out)
