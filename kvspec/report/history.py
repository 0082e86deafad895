"""The release history as a Markdown table: one row per release.

The renderers take the history typed (``HistoryFile``, ``ReleaseRow``, one
``Cell`` per differential), parsed once from the result file's JSON
(``kvspec.history/1``, what ``kvspec history --json`` writes and
``docs/results`` commits) or from the rows the command holds in that form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = ["Cell", "Failed", "HistoryFile", "ReleaseRow", "render_table", "render_explanations"]


@attrs.frozen
class Failed:
    """A discrepancy of one differential: its category, the first line of its
    summary, and (programs) the program that shows it."""

    category: str
    summary: str
    case_text: str = ""

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "Failed":
        summary = data.get("summary") or [""]
        return cls(data.get("category", ""), summary[0], data.get("case_text", ""))


@attrs.frozen
class Cell:
    """One differential on one release: what it ran and what it found."""

    cases: int | None = None
    examples: int | None = None  # Hypothesis examples (programs, for the program differentials)
    operations: int | None = None
    failure: Failed | None = None
    other_failures: tuple[Failed, ...] = ()  # found after the first: not a complete list
    outcome: str = "OK"
    stopped: str | None = None  # why the run stopped early

    @property
    def incomplete(self) -> bool:
        """Ran short of its budget: never "no discrepancy"."""
        return bool(self.stopped) or self.outcome != "OK"

    @property
    def why(self) -> str:
        return self.stopped or self.outcome

    @property
    def failures(self) -> tuple[Failed, ...]:
        return () if self.failure is None else (self.failure, *self.other_failures)

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "Cell":
        failure = data.get("failure")
        return cls(data.get("cases"), data.get("examples"), data.get("operations"),
                   None if failure is None else Failed.parse(failure),
                   tuple(Failed.parse(f) for f in data.get("other_failures") or ()),
                   data.get("outcome", "OK"), data.get("stopped"))


@attrs.frozen
class ReleaseRow:
    """One release: why it was not run (``status`` "unsupported" or "error",
    with ``detail``), or its capabilities, rule and each differential's cell
    (``registration`` is the row's own top-level fields)."""

    version: str
    status: str
    detail: str | None = None
    partial_hash_hits: bool = False
    reprefillable_tokens: bool = False
    per_group_eagle: bool = False
    lookahead_block_hashes: bool = False
    rule: str = ""
    registration: Cell | None = None
    lookup: Cell | None = None
    stateful: Cell | None = None
    engine: Cell | None = None
    symbolic: str | None = None  # the real code's symbolic verdict (with --symbolic)

    @property
    def not_run(self) -> bool:
        return self.status in ("unsupported", "error")

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "ReleaseRow":
        if data["status"] in ("unsupported", "error"):
            return cls(data["version"], data["status"], data.get("detail"))
        caps = data.get("capabilities") or {}

        def cell(key: str) -> Cell | None:
            return None if data.get(key) is None else Cell.parse(data[key])

        return cls(data["version"], data["status"], data.get("detail"),
                   **{flag: bool(caps.get(flag)) for flag in ("partial_hash_hits", "reprefillable_tokens",
                                                              "per_group_eagle", "lookahead_block_hashes")},
                   rule=data.get("rule", ""), registration=Cell.parse(data), lookup=cell("lookup"),
                   stateful=cell("stateful"), engine=cell("engine"),
                   symbolic=(data.get("symbolic") or {}).get("status"))


@attrs.frozen
class HistoryFile:
    """A ``kvspec history`` result file."""

    schema: str
    status: str  # a RunStatus value
    seed: int
    max_examples: int
    planned: tuple[str, ...]
    releases: tuple[ReleaseRow, ...]

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "HistoryFile":
        return cls(data["schema"], data["status"], data["seed"], data["max_examples"], tuple(data["planned"]),
                   tuple(ReleaseRow.parse(row) for row in data["releases"]))

_COLUMNS = (("registration", None), ("lookup (hit length)", "lookup"), ("stateful", "stateful"),
            ("engine", "engine"))


def render_table(rows: Sequence[ReleaseRow], symbolic: bool) -> str:
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    def verdict(cell: Cell | None) -> str:
        cell = cell or Cell()
        if cell.failure is not None:
            return f"DISCREPANCY: {cell.failure.summary}"
        if cell.incomplete:
            return f"INCOMPLETE after {cell.cases} cases: {cell.why}"
        return f"no discrepancy ({cell.cases} cases)"

    header = ["release", "partial hits", "lookahead", "per-group EAGLE", "lookahead hashes",
              "rule (spec era)", "registration", "lookup (hit length)", "stateful (state invariants)"]
    engine = any(row.engine is not None for row in rows)
    if engine:
        header.append("engine (vLLM's Scheduler)")
    if symbolic:
        header.append("real code, symbolically")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if row.not_run:
            cells = [row.version] + [""] * 5 + [f"{row.status}: {row.detail}", "", ""]
            cells += [""] if engine else []
            cells += [""] if symbolic else []
        else:
            cells = [row.version, yes(row.partial_hash_hits), yes(row.reprefillable_tokens),
                     yes(row.per_group_eagle), yes(row.lookahead_block_hashes), row.rule,
                     verdict(row.registration), verdict(row.lookup), _programs(row.stateful)]
            if engine:
                cells.append(_programs(row.engine))
            if symbolic:
                cells.append(row.symbolic or "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _programs(cell: Cell | None) -> str:
    """A program differential's cell (stateful, engine)."""
    if cell is None:
        return "not run"
    if cell.failure is None and cell.incomplete:
        return f"INCOMPLETE after {cell.examples} programs, {cell.operations} operations: {cell.why}"
    if cell.failure is None:
        return f"no invariant broken ({cell.examples} programs, {cell.operations} operations)"
    text = f"BROKEN: {cell.failure.summary} -- program: {cell.failure.case_text}"
    if cell.other_failures:  # found within Hypothesis's search after the first: not a complete list
        text += "; also broken: " + "; ".join(f"{o.summary} -- program: {o.case_text}" for o in cell.other_failures)
    return text


def render_explanations(rows: Sequence[ReleaseRow]) -> str:
    """Each finding of the table, explained: the known vLLM bug
    (``model/known.py``) whose category and words it has and whose release
    range holds the row's release, or said to be unexplained (a new vLLM bug or
    a gap in kvspec's model, for a reader to settle)."""
    from kvspec.model.finding import Category
    from kvspec.model.known import known_bugs

    lines = []
    for row in rows:
        if row.not_run:
            continue
        for label, cell in (("registration", row.registration), ("lookup (hit length)", row.lookup),
                            ("stateful", row.stateful), ("engine", row.engine)):
            for one in (cell or Cell()).failures:
                try:
                    category = Category(one.category)
                except ValueError:
                    category = None
                bugs = known_bugs(row.version, category, one.summary) if category else []
                what = (f"the known vLLM bug `{bugs[0].name}` (first in {bugs[0].first}, "
                        f"{'fixed in ' + bugs[0].fixed_in if bugs[0].fixed_in else 'still open'})" if bugs
                        else "not explained by a known bug: a new vLLM bug or a gap in kvspec's model, "
                             "not settled here")
                lines.append(f"- {row.version}, {label}: `{one.category}`: {what}")
    return "\n".join(lines) if lines else "Every column of every release held: nothing to explain."
