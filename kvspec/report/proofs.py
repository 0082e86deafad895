"""Renders proof results: a compact terminal table and versioned JSON."""

from __future__ import annotations

import json
from typing import Any, Iterable

from kvspec.model.about import SCHEMAS, versions
from kvspec.proofs.verdict import Status, TheoremResult



def _counterexample_lines(result: TheoremResult) -> list[str]:
    cx = result.counterexample
    if cx is None:
        return []
    v = cx.values
    shown = ", ".join(
        f"{k}={v[k]}" for k in ("n", "n2", "t", "S", "H", "B", "L", "L2", "j", "E", "P", "F") if k in v
    ) or ", ".join(f"{k}={val}" for k, val in v.items())
    tag = "minimal" if cx.minimal else "not confirmed minimal"
    lines = [f"    counterexample ({tag}, replayed on integers): {shown}"]
    domain = cx.domain
    if domain:
        lines.append(f"    as vLLM config: {domain['config']}")
        for call in domain["calls"]:
            sides = [f"{label} {call[label]['tokens']}" for label in call if isinstance(call[label], dict)]
            lines.append(f"    cache_blocks(n={call['num_computed_tokens']}): " + " vs ".join(sides))
        lines.extend(f"    {line}" for line in domain.get("reading", ()))
    return lines


def render_table(results: Iterable[TheoremResult]) -> str:
    results = list(results)
    width = max((len(r.name) for r in results), default=10)
    out = [f"{'theorem':<{width}}  {'verdict':<8} {'expected':<8} {'time':>7}  vacuity"]
    for r in results:
        # A budget that ran out is no conclusion either way, never "unexpected".
        mark = ("ok" if r.as_expected else "UNKNOWN (budget exhausted)" if r.status is Status.UNKNOWN
                else "UNEXPECTED")
        vac = ""
        if r.vacuity is not None:
            if r.vacuity.not_refuted_by:
                vac = "NOT refuted by " + ", ".join(r.vacuity.not_refuted_by)
            elif r.vacuity.assumptions_satisfiable is Status.REFUTED:
                vac = "assumptions UNSATISFIABLE (vacuous)"
            elif r.vacuity.unknown:
                vac = "UNKNOWN: budget ran out for " + ", ".join(
                    (["the assumptions"] if r.vacuity.assumptions_satisfiable is Status.UNKNOWN else [])
                    + list(r.vacuity.unknown_refuters))
            elif r.vacuity.refuted_by:
                vac = f"refuted by {len(r.vacuity.refuted_by)} wrong variant(s)"
            else:
                vac = "assumptions satisfiable; " + (r.vacuity.note or "no refuter listed")
        out.append(
            f"{r.name:<{width}}  {r.status.value:<8} {r.expected.value:<8} {r.seconds:6.2f}s  "
            f"{mark}; {vac}"
        )
        if r.detail:
            out.append(f"    {r.detail}")
        out.extend(_counterexample_lines(r))
    return "\n".join(out)


def summary(results: Iterable[TheoremResult]) -> dict[str, int]:
    results = list(results)
    unknown = [r for r in results
               if r.status is Status.UNKNOWN or (r.vacuity is not None and r.vacuity.unknown)]
    return {
        "theorems": len(results),
        "proved": sum(r.status is Status.PROVED for r in results),
        "refuted": sum(r.status is Status.REFUTED for r in results),
        "unknown": len(unknown),
        # Not as expected, and not for want of budget (that is "unknown").
        "unexpected": sum(not r.as_expected and r.status is not Status.UNKNOWN for r in results),
    }


def to_json(results: Iterable[TheoremResult], settings: dict[str, Any],
            findings: Iterable[Any] = (), real_code: Iterable[dict[str, Any]] = ()) -> str:
    results = list(results)
    doc = {
        "schema": SCHEMAS["prove"],
        "versions": versions(),
        "settings": settings,
        "summary": summary(results),
        "theorems": [r.as_dict() for r in results],
        # Refuted theorems comparing the spec with a variant, as kvspec.finding/1.
        "findings": [f.to_dict() for f in findings],
        # The symbolic verdicts on real vLLM code (kvspec prove --vllm / --vllm-src).
        "real_code": list(real_code),
    }
    return json.dumps(doc, indent=2, sort_keys=True)
