"""The kill matrix: one row per mutant, one column per technique.

Fuzzing's columns are named for what they count: the differential cases (or,
for the stateful differential, the programs) run until the first
discrepancy, and the seconds into fuzzing it took (not the whole run with
shrinking).  The renderer takes the matrix typed (``KillMatrixFile``,
``KillRow``), parsed once from the result file's JSON (``kvspec.mutants/1``)
or from the rows ``kvspec mutants`` holds in that form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = ["KillMatrixFile", "KillRow", "render_matrix"]


def _cell(value: Any) -> str:
    """A column that is empty when the technique was not run."""
    return "" if value is None else str(value)


@attrs.frozen
class KillRow:
    """One mutant against every technique, as the matrix shows it."""

    mutant: str
    model: str  # the proofs' verdict on the variant it models, or "lookup side" / "state side"
    status: str  # killed, survived, equivalent, not applicable, error
    fuzz: str  # the per-request differential's word (the status when it did not run)
    cases_to_kill: int | None = None
    seconds_to_kill: float | None = None
    stateful: str = ""
    programs_to_kill: int | None = None
    stateful_seconds_to_kill: float | None = None
    exhaustive: str = ""
    exhaustive_failing: str = ""  # "failing/cases"
    exhaustive_seconds: str = ""
    symbolic: str | None = None  # None: the symbolic column was not run
    symbolic_seconds: str = ""
    why: str = ""  # the first killing technique's category, or the error

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "KillRow":
        return cls(data["mutant"], data["model"], data["status"], data.get("fuzz", data["status"]),
                   data.get("cases_to_kill"), data.get("seconds_to_kill"), data.get("stateful", ""),
                   data.get("programs_to_kill"), data.get("stateful_seconds_to_kill"), data.get("exhaustive", ""),
                   _cell(data.get("exhaustive_failing")), _cell(data.get("exhaustive_seconds")),
                   None if "symbolic" not in data else _cell(data["symbolic"]), _cell(data.get("symbolic_seconds")),
                   data.get("category") or data.get("stateful_category") or data.get("error") or "")


@attrs.frozen
class KillMatrixFile:
    """A ``kvspec mutants`` result file."""

    schema: str
    status: str  # a RunStatus value
    vllm: str
    seed: int
    max_examples: int
    seconds: float
    mutants: tuple[KillRow, ...]

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "KillMatrixFile":
        return cls(data["schema"], data["status"], data["vllm"], data["seed"], data["max_examples"], data["seconds"],
                   tuple(KillRow.parse(row) for row in data["mutants"]))


def render_matrix(rows: Sequence[KillRow]) -> str:
    """One column per technique: the proof (model), the per-request
    differential (registration, or lookup for lookup- and state-side
    mutants), the stateful differential, the exhaustive two-group scope, and
    symbolic when run; the category is the first killing technique's."""
    width = max(len(r.mutant) for r in rows)
    symbolic = any(r.symbolic is not None for r in rows)
    head = (f"{'mutant':<{width}}  {'proof':<14} {'fuzzing':<14} {'cases to kill':>13} {'s to kill':>9}  "
            f"{'stateful':<14} {'programs to kill':>16} {'s':>5}  "
            f"{'exhaustive':<10} {'failing':>9} {'s':>5}")
    out = [head + (f"  {'symbolic':<14} {'s':>5}" if symbolic else "") + "  category"]
    for r in rows:
        secs = "" if r.seconds_to_kill is None else f"{r.seconds_to_kill:.2f}"
        ssecs = "" if r.stateful_seconds_to_kill is None else f"{r.stateful_seconds_to_kill:.2f}"
        line = (f"{r.mutant:<{width}}  {r.model:<14} {r.fuzz:<14} {_cell(r.cases_to_kill):>13} "
                f"{secs:>9}  {r.stateful:<14} {_cell(r.programs_to_kill):>16} {ssecs:>5}  "
                f"{r.exhaustive:<10} {r.exhaustive_failing:>9} {r.exhaustive_seconds:>5}")
        if symbolic:
            line += f"  {r.symbolic or '':<14} {r.symbolic_seconds:>5}"
        out.append((line + f"  {r.why}").rstrip())
    return "\n".join(out)
