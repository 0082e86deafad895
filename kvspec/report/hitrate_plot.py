"""The hit-rate replay as an SVG: written by hand (a few rectangles and
polylines need no plotting library).

Left: each subject's prefix-cache hit rate, a grey tick at its reference's
(the spec's ideal where that is exact, else the release a mutant came from).
Right: the hit rate per conversation turn, where a registration bug shows up
(turn 0 hits only the shared system prompts; later turns hit the history).
"""

from __future__ import annotations

from html import escape
from typing import Any

__all__ = ["render_svg"]

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
_IDEAL = "#7f7f7f"


def _text(x: float, y: float, body: str, size: int = 11, anchor: str = "start", weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" font-family="sans-serif">{escape(body)}</text>')


def render_svg(doc: dict[str, Any]) -> str:
    rows = doc["subjects"]
    width, height = 900, 120 + 34 * max(len(rows), 4)
    bar_x, bar_w = 220, 220
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">', '<rect width="100%" height="100%" fill="white"/>',
           _text(10, 20, "kvspec hitrate: prefix-cache hit rate of real vLLM", 14, weight="bold"),
           _text(10, 38, doc["workload"]["text"], 10), _text(10, 52, doc["layout"], 10)]
    top = 80
    out.append(_text(bar_x, top - 8, "hit rate (grey tick: its reference)", 11))
    for i, row in enumerate(rows):
        y = top + 34 * i
        colour = _COLOURS[i % len(_COLOURS)]
        out.append(_text(bar_x - 8, y + 15, f"{row['label']} (S={row['scheduler_block_size']})", 11, "end"))
        out.append(f'<rect x="{bar_x}" y="{y}" width="{bar_w * row["hit_rate"]:.1f}" height="20" fill="{colour}"/>')
        ref = row["reference"]
        shown = f"{100 * row['hit_rate']:.1f}%"
        if ref:
            ref_x = bar_x + bar_w * ref["hit_rate"]
            out.append(f'<line x1="{ref_x:.1f}" y1="{y - 3}" x2="{ref_x:.1f}" y2="{y + 23}" '
                       f'stroke="{_IDEAL}" stroke-width="2"/>')
            shown += f" ({ref['points']:+.1f} pts)"
        out.append(_text(bar_x + bar_w + 6, y + 15, shown, 11))
    # Right panel: hit rate per turn.
    px, py, pw, ph = 600, top, 270, 34 * max(len(rows), 4) - 10
    turns = len(rows[0]["per_turn"]) if rows else 0
    out.append(_text(px, top - 8, "hit rate per conversation turn", 11))
    out.append(f'<rect x="{px}" y="{py}" width="{pw}" height="{ph}" fill="none" stroke="#cccccc"/>')
    for frac in (0.0, 0.5, 1.0):
        y = py + ph * (1 - frac)
        out.append(_text(px - 4, y + 4, f"{int(frac * 100)}%", 9, "end"))
    for t in range(turns):
        x = px + (pw * t / max(turns - 1, 1))
        out.append(_text(x, py + ph + 14, f"turn {t}", 9, "middle"))

    def polyline(values: list[float], colour: str, dash: str = "") -> str:
        points = " ".join(f"{px + pw * t / max(turns - 1, 1):.1f},{py + ph * (1 - v):.1f}"
                          for t, v in enumerate(values))
        dashing = f' stroke-dasharray="{dash}"' if dash else ""
        return f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dashing}/>'

    if rows and rows[0]["ideal_exact"]:
        out.append(polyline(rows[0]["ideal_per_turn"], _IDEAL, "4 3"))
    for i, row in enumerate(rows):
        out.append(polyline(row["per_turn"], _COLOURS[i % len(_COLOURS)]))
    out.append("</svg>")
    return "\n".join(out) + "\n"
