"""One engine program's run (``kvspec run --engine-program``), an operation
a line: what vLLM's Scheduler did, in vLLM's terms, from its checked answer."""

from __future__ import annotations

from kvspec.model.engine import describe_engine_op

__all__ = ["step_line"]


def step_line(record) -> str:
    """What one operation did, in vLLM's terms, from its checked answer
    (``record``: one of ``diff_tests.engine.drive_engine_program``'s records;
    one without an answer, vLLM raised on: the operation alone)."""
    parts = [describe_engine_op(record.op) if record.op.get("do") in ("arrive", "step", "abort", "reset")
             else record.op.get("do", "?")]
    answer = record.answer
    if answer is None:
        return "; ".join(parts)
    # A step answers its schedule() apart (``scheduled``) from its output.
    schedule = answer.scheduled.result if answer.scheduled is not None else None
    result = answer.result
    if schedule is not None and schedule.scheduled:
        parts.append("scheduled " + ", ".join(f"{r}: {n}" for r, n in sorted(schedule.scheduled.items())))
    lookups = (schedule.lookups if schedule is not None else ()) + result.lookups
    if lookups:
        parts.append("lookups " + ", ".join(f"{lk.request} hit {lk.hit}" for lk in lookups))
    for key, values in (("preempted", schedule.preempted if schedule is not None else ()), ("finished", result.finished)):
        if values:
            parts.append(f"{key} {', '.join(map(str, values))}")
    state = answer.state or {}
    if "num_free" in state:
        parts.append(f"{state['num_free']} free blocks")
    if answer.running:
        parts.append("computed " + ", ".join(f"{r}: {n}" for r, n in sorted(answer.running.items())))
    return "; ".join(parts)
