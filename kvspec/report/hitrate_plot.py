"""The hit-rate replay, drawn with matplotlib (SVG and PNG).

Left: each subject's prefix-cache hit rate as a bar, its reference's (the
spec's ideal where that is exact, else the release a mutant came from) as a
black tick on the same row, the difference written beside it.  Right: the
hit rate per conversation turn, one step series per subject (turns are
discrete), where a registration bug shows up (turn 0 hits only the shared
system prompts; later turns hit the history).  The legend sits outside the
data.

``plot_data`` is what is drawn, as plain values, from the typed replay
(``report.hitrate.HitrateFile``); ``render_svg`` and ``render_png`` draw it.
"""

from __future__ import annotations

from typing import Any

from .hitrate import HitrateFile

__all__ = ["plot_data", "render_svg", "render_png"]

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
_IDEAL = "#555555"


def plot_data(doc: HitrateFile) -> dict[str, Any]:
    rows = doc.subjects
    bars = []
    for row in rows:
        ref = row.reference
        bars.append({"label": f"{row.label} (S={row.scheduler_block_size})",
                     "hit_rate": 100 * row.hit_rate,
                     "reference": None if not ref else 100 * ref.hit_rate,
                     "points": None if not ref else ref.points})
    ideal = rows[0].ideal_per_turn if rows and rows[0].ideal_exact else None
    return {
        "title": "Prefix-cache hit rate of real vLLM",
        "subtitle": f"{doc.workload}; {doc.layout}",
        "bars": bars,
        "turns": list(range(len(rows[0].per_turn))) if rows else [],
        "per_turn": [{"label": b["label"], "values": [100 * v for v in row.per_turn]}
                     for b, row in zip(bars, rows)],
        "ideal_per_turn": None if ideal is None else [100 * v for v in ideal],
    }


def _figure(doc: HitrateFile):
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    data = plot_data(doc)
    bars = data["bars"]
    fig = Figure(figsize=(12, 1.6 + 0.45 * max(len(bars), 4)), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 1])
    ys = list(range(len(bars)))[::-1]
    for y, bar, colour in zip(ys, bars, _COLOURS * (len(bars) // len(_COLOURS) + 1)):
        left.barh(y, bar["hit_rate"], color=colour, height=0.6)
        text = f"{bar['hit_rate']:.1f}%"
        if bar["reference"] is not None:
            left.plot([bar["reference"]] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
            text += f" ({bar['points']:+.1f} pts)"
        left.text(max(bar["hit_rate"], bar["reference"] or 0) + 3, y, text, va="center", fontsize=9)
    left.set_yticks(ys, [b["label"] for b in bars], fontsize=9)
    left.set_xlim(0, 118)
    left.set_xticks(range(0, 101, 20))
    left.set_xlabel("hit rate (%)")
    left.set_title("hit rate (black tick: its reference)", loc="left", fontsize=10)
    for i, series in enumerate(data["per_turn"]):
        right.plot(data["turns"], series["values"], drawstyle="steps-mid", marker="o", markersize=4,
                   color=_COLOURS[i % len(_COLOURS)], linewidth=1.8, label=series["label"])
    handles = [Line2D([], [], color=_COLOURS[i % len(_COLOURS)], marker="o", label=s["label"])
               for i, s in enumerate(data["per_turn"])]
    if data["ideal_per_turn"] is not None:
        right.plot(data["turns"], data["ideal_per_turn"], drawstyle="steps-mid", color=_IDEAL,
                   linestyle="--", linewidth=1.2, label="spec's ideal", zorder=5)
        handles.append(Line2D([], [], color=_IDEAL, linestyle="--", label="spec's ideal"))
    right.set_ylim(0, 100)
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel("conversation turn")
    right.set_ylabel("hit rate (%)")
    right.set_title("hit rate per conversation turn", loc="left", fontsize=10)
    for ax in (left, right):
        ax.grid(True, color="#e5e5e5", linewidth=0.6)
        ax.set_axisbelow(True)
    fig.suptitle(f"{data['title']}\n{data['subtitle']}", fontsize=10, x=0.01, ha="left")
    fig.legend(handles=handles, loc="outside right upper", fontsize=9, frameon=False)
    return fig


def _render(doc: HitrateFile, fmt: str) -> bytes:
    from .plot import figure_bytes

    return figure_bytes(lambda: _figure(doc), fmt)


def render_svg(doc: HitrateFile) -> str:
    return _render(doc, "svg").decode()


def render_png(doc: HitrateFile) -> bytes:
    return _render(doc, "png")
