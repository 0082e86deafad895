"""The release history as a Markdown table: one row per release."""

from __future__ import annotations

from typing import Any

__all__ = ["render_table"]


def render_table(rows: list[dict[str, Any]], symbolic: bool) -> str:
    def yes(flag: Any) -> str:
        return "yes" if flag else "no"

    def verdict(cases: int, failure: dict[str, Any] | None) -> str:
        return f"no discrepancy ({cases} cases)" if failure is None else f"DISCREPANCY: {failure['summary'][0]}"

    header = ["release", "partial hits", "lookahead", "per-group EAGLE", "lookahead hashes",
              "rule (spec era)", "registration", "lookup (hit length)", "stateful (state invariants)"]
    if symbolic:
        header.append("real code, symbolically")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if row["status"] in ("unsupported", "error"):
            cells = [row["version"]] + [""] * 5 + [f"{row['status']}: {row['detail']}", "", ""]
            cells += [""] if symbolic else []
        else:
            caps = row["capabilities"]
            lookup = row["lookup"]
            cells = [row["version"], yes(caps["partial_hash_hits"]), yes(caps["reprefillable_tokens"]),
                     yes(caps["per_group_eagle"]), yes(caps["lookahead_block_hashes"]), row["rule"],
                     verdict(row["cases"], row["failure"]),
                     verdict(lookup["cases"], lookup["failure"]), _stateful(row.get("stateful"))]
            if symbolic:
                cells.append(row["symbolic"]["status"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _stateful(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "not run"
    if cell["failure"] is None:
        return f"no invariant broken ({cell['examples']} programs, {cell['operations']} operations)"
    failure = cell["failure"]
    return f"BROKEN: {failure['summary'][0]} -- program: {failure['case_text']}"
