"""The plot of a finding's sweep: registered versus computed tokens, spec
against subject, drawn with matplotlib to SVG (the report) and PNG (a pull
request).

One pair of panels per group that differs somewhere in the sweep (at most
three): above, the tokens each side lets the group register after a single
prefill of n tokens, as steps (the bound is a step function of n) -- the
spec thick and pale, the subject thin, dark and dashed on top of it, so
both stay visible where they agree (and n itself, thin, where the spec
does not register every computed token); below, the tokens lost at each n as
bars on their own axis, so a one-token loss is as visible as a large one.
The finding's n is marked in both; the legend sits outside the data.

``plot_data`` is what is drawn, as plain values (the snapshot tests read
it); ``render_svg`` and ``render_png`` draw it.
"""

from __future__ import annotations

import io
from typing import Any

from kvspec.model.finding import Finding

__all__ = ["plot_data", "render_svg", "render_png", "MAX_PANELS"]

MAX_PANELS = 3
_SPEC, _SUBJECT, _COMPUTED, _LOSS, _MARK = "#9ecae1", "#b2182b", "#777777", "#d6604d", "#222222"
_KINDS = {"full_attention": "full attention", "sliding_window": "sliding window",
          "mamba_align": "Mamba align"}


def _subject_name(f: Finding) -> str:
    from .finding import public_label

    return public_label(str((f.sweep or {}).get("label") or "subject"))


def plot_data(f: Finding) -> dict[str, Any]:
    """What the figure shows: per differing group, n, both sides' tokens,
    the loss, and the marked finding."""
    sweep = f.sweep
    if not sweep:
        raise ValueError("the finding has no sweep to plot (it was not produced against a live subject)")
    ns = [int(n) for n in sweep["n"]]
    groups = len(sweep["spec"])
    differing = [g for g in range(groups) if sweep["spec"][g] != sweep["subject"][g]] or [0]
    panels = []
    for g in differing[:MAX_PANELS]:
        points = [(n, s, o) for n, s, o in zip(ns, sweep["spec"][g], sweep["subject"][g])
                  if s is not None and o is not None]
        row = f.groups[g] if g < len(f.groups) else None
        about = (f" ({_KINDS.get(row.kind, row.kind)}, block {row.block_size}"
                 f"{', EAGLE' if row.eagle else ''})") if row else ""
        panels.append({
            "group": g,
            "title": f"group {g}{about}",
            "n": [p[0] for p in points],
            "spec": [p[1] for p in points],
            "subject": [p[2] for p in points],
            "lost": [p[1] - p[2] for p in points],
        })
    marked = f.n if f.n is not None and ns and ns[0] <= f.n <= ns[-1] else None
    return {
        "title": f"Registered vs computed tokens: spec vs {_subject_name(f)}",
        "x_label": "computed tokens n (a single prefill of n tokens)",
        "y_label": "tokens registered",
        "loss_label": "tokens lost\n(spec - subject)",
        "subject": _subject_name(f),
        "finding_n": marked,
        "panels": panels,
        "hidden_groups": max(0, len(differing) - MAX_PANELS),
    }


def _figure(f: Finding):
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    data = plot_data(f)
    panels = data["panels"]
    fig = Figure(figsize=(10, 4.2 * len(panels)), layout="constrained")
    grid = fig.add_gridspec(2 * len(panels), 1, height_ratios=[3, 1] * len(panels))
    handles = None
    # One legend for every panel: the spec is "= n" only if it is so in each.
    everything = all(panel["spec"] == panel["n"] for panel in panels)
    for i, panel in enumerate(panels):
        top = fig.add_subplot(grid[2 * i])
        bottom = fig.add_subplot(grid[2 * i + 1], sharex=top)
        ns = panel["n"]
        computed = None
        if not everything:
            computed, = top.plot(ns, ns, drawstyle="steps-mid", color=_COMPUTED, linewidth=0.9,
                                 label="computed tokens n", zorder=1)
        spec, = top.plot(ns, panel["spec"], drawstyle="steps-mid", color=_SPEC, linewidth=5,
                         solid_capstyle="butt", zorder=2,
                         label="spec: may register" + (" (= n: every computed token)" if everything else ""))
        subject, = top.plot(ns, panel["subject"], drawstyle="steps-mid", color=_SUBJECT, linewidth=1.6,
                            linestyle="--", label=f"{data['subject']}: registers", zorder=3)
        lost = [n for n, loss in zip(ns, panel["lost"]) if loss]
        if len(lost) <= 12:  # a few losses marked where they are; many would blot the line
            top.plot(lost, [o for n, o, loss in zip(ns, panel["subject"], panel["lost"]) if loss],
                     linestyle="none", marker="v", color=_SUBJECT, markersize=5, zorder=4)
        bars = bottom.bar(ns, panel["lost"], width=0.8, color=_LOSS, label="tokens lost at n")
        top.set_title(panel["title"], loc="left", fontsize=11)
        top.set_ylabel(data["y_label"])
        bottom.set_ylabel(data["loss_label"], fontsize=9)
        bottom.set_xlabel(data["x_label"])
        for ax in (top, bottom):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=16))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
            ax.grid(True, color="#e5e5e5", linewidth=0.6)
            ax.set_axisbelow(True)
        top.tick_params(labelbottom=True)
        top.set_ylim(bottom=0)
        low = min(0, *panel["lost"]) if panel["lost"] else 0
        high = max(1, *panel["lost"]) if panel["lost"] else 1
        bottom.set_ylim(low - 0.1 * (high - low), high + 0.25 * (high - low))
        bottom.axhline(0, color="#444444", linewidth=0.8)
        mark = None
        if data["finding_n"] is not None:
            for ax in (top, bottom):
                mark = ax.axvline(data["finding_n"], color=_MARK, linestyle=(0, (2, 2)), linewidth=1,
                                  label=f"the finding (n = {data['finding_n']})")
        if handles is None:
            handles = [h for h in (computed, spec, subject, bars, mark) if h is not None]
    fig.suptitle(data["title"], fontsize=12, x=0.01, ha="left")
    fig.legend(handles=handles, loc="outside right upper", fontsize=9, frameon=False)
    if data["hidden_groups"]:
        fig.text(0.01, 0.0, f"{data['hidden_groups']} more differing group(s) not shown", fontsize=8)
    return fig


def figure_bytes(make_figure, fmt: str) -> bytes:
    """``make_figure()`` saved as ``fmt`` (svg or png), byte for byte the same
    on every run (no dates, a fixed hash salt, one font), so snapshots hold."""
    import matplotlib

    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "kvspec", "svg.fonttype": "none",
                                "font.family": "DejaVu Sans"}):
        fig = make_figure()
        metadata = {"Date": None, "Creator": None} if fmt == "svg" else {"Software": None}
        fig.savefig(buffer, format=fmt, dpi=110, metadata=metadata, facecolor="white")
    return buffer.getvalue()


def _render(f: Finding, fmt: str) -> bytes:
    return figure_bytes(lambda: _figure(f), fmt)


def render_svg(f: Finding) -> str:
    return _render(f, "svg").decode()


def render_png(f: Finding) -> bytes:
    return _render(f, "png")
