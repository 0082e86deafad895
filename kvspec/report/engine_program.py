"""One engine program's run (``kvspec run --engine-program``), an operation
a line: what vLLM's Scheduler did, in vLLM's terms, from its checked answer."""

from __future__ import annotations

from kvspec.model.engine import describe_engine_op

__all__ = ["step_line"]


def step_line(record) -> str:
    """What one operation did, in vLLM's terms, from its checked answer
    (``record``: one of ``diff_tests.engine.drive_engine_program``'s records)."""
    answer = record.answer
    parts = [describe_engine_op(record.op) if record.op.get("do") in ("arrive", "step", "abort", "reset")
             else record.op.get("do", "?")]
    # A step answers its schedule() apart (``scheduled``) from its output.
    schedule = (answer.get("scheduled") or {}).get("result") or {}
    result = answer.get("result") or {}
    tokens = schedule.get("scheduled")
    if tokens:
        parts.append("scheduled " + ", ".join(f"{r}: {n}" for r, n in sorted(tokens.items())))
    lookups = list(schedule.get("lookups") or ()) + list(result.get("lookups") or ())
    if lookups:
        parts.append("lookups " + ", ".join(f"{lk['request']} hit {lk['hit']}" for lk in lookups))
    for key, part in (("preempted", schedule), ("finished", result)):
        if part.get(key):
            parts.append(f"{key} {', '.join(map(str, part[key]))}")
    state = answer.get("state") or {}
    if "num_free" in state:
        parts.append(f"{state['num_free']} free blocks")
    if answer.get("running"):
        parts.append("computed " + ", ".join(f"{r}: {n}" for r, n in sorted(answer["running"].items())))
    return "; ".join(parts)
