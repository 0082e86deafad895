"""Renders proof results: a compact terminal table and versioned JSON."""

from __future__ import annotations

import json
import platform
from typing import Any, Iterable

from proofs.verdict import Status, TheoremResult

PROVE_SCHEMA = "kvspec.prove/1"


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
        mark = "ok" if r.as_expected else "UNEXPECTED"
        vac = ""
        if r.vacuity is not None:
            if r.vacuity.not_refuted_by:
                vac = "NOT refuted by " + ", ".join(r.vacuity.not_refuted_by)
            elif r.vacuity.assumptions_satisfiable is not Status.PROVED:
                vac = "assumptions NOT shown satisfiable"
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
    return {
        "theorems": len(results),
        "proved": sum(r.status is Status.PROVED for r in results),
        "refuted": sum(r.status is Status.REFUTED for r in results),
        "unknown": sum(r.status is Status.UNKNOWN for r in results),
        "unexpected": sum(not r.as_expected for r in results),
    }


def versions() -> dict[str, str]:
    import hypothesis
    import z3

    import kvspec

    return {
        "kvspec": kvspec.__version__,
        "z3": z3.get_version_string(),
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
    }


def to_json(results: Iterable[TheoremResult], settings: dict[str, Any],
            findings: Iterable[Any] = (), real_code: Iterable[dict[str, Any]] = ()) -> str:
    results = list(results)
    doc = {
        "schema": PROVE_SCHEMA,
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
