"""The hit-rate replay's report: a table per subject against its reference,
and the verdict."""

from __future__ import annotations

from typing import Any

from kvspec.model.outcome import Outcome

__all__ = ["render_text", "verdict"]


def render_text(doc: dict[str, Any]) -> str:
    out = ["kvspec hitrate: prefix-cache hit rate of real vLLM on a synthetic workload",
           f"workload: {doc['workload']['text']}", f"layout:   {doc['layout']}", "",
           f"{'subject':<34} {'S':>4} {'hit rate':>8}  {'reference':<28} {'ref rate':>8} {'diff':>8}  model of its rule",
           "-" * 118]
    for r in doc["subjects"]:
        ref = r["reference"]
        model = (f"{r['model_rule']}: {100 * r['model_hit_rate']:.2f}% "
                 f"({'equal per request' if r['model_matches_per_request'] else 'differs'})"
                 if r["ideal_exact"] else "not exact with a Mamba group")
        refs = (f"{ref['label']:<28} {100 * ref['hit_rate']:7.2f}% {ref['points']:+7.2f}p" if ref
                else f"{'(none exact: Mamba layout)':<28} {'':>8} {'':>8}")
        out.append(f"{r['label']:<34} {r['scheduler_block_size']:>4} {100 * r['hit_rate']:7.2f}%  {refs}  {model}")
    for r in doc["subjects"]:
        ref = r["reference"]
        if not ref or not ref["requests_differing"]:
            continue
        f = ref["first_difference"]
        turns = ", ".join(f"turn {t}: {100 * a:.1f}% vs {100 * b:.1f}%"
                          for t, (a, b) in enumerate(zip(r["per_turn"], ref["per_turn"])))
        out += ["", f"{r['label']} (S={r['scheduler_block_size']}): {ref['requests_differing']} of {r['requests']} "
                    f"requests differ from {ref['label']}, {ref['hit_tokens_lost']} hit tokens lost "
                    f"({ref['hit_tokens_lost'] / ref['requests_differing']:.1f} per affected request)",
                f"  first: request {f['request']} (turn {f['turn']}, {f['prompt_tokens']} prompt tokens) "
                f"hit {f['observed_hit']}, reference {f['reference_hit']}",
                f"  per turn: {turns}"]
    for e in doc["errors"]:
        out.append(f"ERROR {e['label']}: {e['error']}")
    out += ["", f"VERDICT: {doc['verdict']}"]
    return "\n".join(out)


def verdict(rows: list[dict[str, Any]], errors: list[dict[str, Any]]) -> tuple[str, Outcome]:
    off = [f"{r['label']} (S={r['scheduler_block_size']}, {r['reference']['points']:+.2f} pts)"
           for r in rows if r["reference"] and r["reference"]["requests_differing"]]
    if off:
        return f"HIT-RATE DIFFERENCE against the reference on {', '.join(off)}", Outcome.FINDING
    if errors:
        return "ERROR: some subjects could not be replayed (see above)", Outcome.USAGE
    return "every subject's hits equal its reference's, request by request", Outcome.OK
