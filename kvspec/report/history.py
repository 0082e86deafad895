"""The release history as a Markdown table: one row per release."""

from __future__ import annotations

from typing import Any

__all__ = ["render_table", "render_explanations"]

_COLUMNS = (("registration", None), ("lookup (hit length)", "lookup"), ("stateful", "stateful"),
            ("engine", "engine"))


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


def render_explanations(rows: list[dict[str, Any]]) -> str:
    """Each finding of the table, explained: the known vLLM bug
    (``model/known.py``) whose category and words it has and whose release
    range holds the row's release, or said to be unexplained (a new vLLM bug or
    a gap in kvspec's model, for a reader to settle)."""
    from kvspec.model.finding import Category
    from kvspec.model.known import known_bugs

    lines = []
    for row in rows:
        if row["status"] in ("unsupported", "error"):
            continue
        for label, key in _COLUMNS:
            cell = row if key is None else row.get(key)
            failure = (cell or {}).get("failure")
            if not failure:
                continue
            failures = [failure] + list((cell or {}).get("other_failures") or [])
            for one in failures:
                try:
                    category = Category(one["category"])
                except ValueError:
                    category = None
                summary = one["summary"][0] if one.get("summary") else ""
                bugs = known_bugs(row["version"], category, summary) if category else []
                what = (f"the known vLLM bug `{bugs[0].name}` (first in {bugs[0].first}, "
                        f"{'fixed in ' + bugs[0].fixed_in if bugs[0].fixed_in else 'still open'})" if bugs
                        else "not explained by a known bug: a new vLLM bug or a gap in kvspec's model, "
                             "not settled here")
                lines.append(f"- {row['version']}, {label}: `{one['category']}`: {what}")
    return "\n".join(lines) if lines else "Every column of every release held: nothing to explain."
