"""The release history as a Markdown table: one row per release."""

from __future__ import annotations

from typing import Any

__all__ = ["render_table"]


def render_table(rows: list[dict[str, Any]], symbolic: bool) -> str:
    def yes(flag: Any) -> str:
        return "yes" if flag else "no"

    def verdict(cell: dict[str, Any]) -> str:
        if cell["failure"] is not None:
            return f"DISCREPANCY: {cell['failure']['summary'][0]}"
        if cell.get("stopped") or cell.get("outcome", "OK") != "OK":
            return f"INCOMPLETE after {cell['cases']} cases: {cell.get('stopped') or cell.get('outcome')}"
        return f"no discrepancy ({cell['cases']} cases)"

    header = ["release", "partial hits", "lookahead", "per-group EAGLE", "lookahead hashes",
              "rule (spec era)", "registration", "lookup (hit length)", "stateful (state invariants)"]
    engine = any("engine" in row for row in rows)
    if engine:
        header.append("engine (vLLM's Scheduler)")
    if symbolic:
        header.append("real code, symbolically")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if row["status"] in ("unsupported", "error"):
            cells = [row["version"]] + [""] * 5 + [f"{row['status']}: {row['detail']}", "", ""]
            cells += [""] if engine else []
            cells += [""] if symbolic else []
        else:
            caps = row["capabilities"]
            lookup = row["lookup"]
            cells = [row["version"], yes(caps["partial_hash_hits"]), yes(caps["reprefillable_tokens"]),
                     yes(caps["per_group_eagle"]), yes(caps["lookahead_block_hashes"]), row["rule"],
                     verdict(row), verdict(lookup), _stateful(row.get("stateful"))]
            if engine:
                cells.append(_stateful(row.get("engine")))
            if symbolic:
                cells.append(row["symbolic"]["status"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _stateful(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "not run"
    if cell["failure"] is None and (cell.get("stopped") or cell.get("outcome", "OK") != "OK"):
        return (f"INCOMPLETE after {cell['examples']} programs, {cell['operations']} operations: "
                f"{cell.get('stopped') or cell.get('outcome')}")
    if cell["failure"] is None:
        return f"no invariant broken ({cell['examples']} programs, {cell['operations']} operations)"
    failure = cell["failure"]
    text = f"BROKEN: {failure['summary'][0]} -- program: {failure['case_text']}"
    others = cell.get("other_failures") or []
    if others:  # found within Hypothesis's search after the first: not a complete list
        text += "; also broken: " + "; ".join(f"{o['summary'][0]} -- program: {o['case_text']}" for o in others)
    return text
