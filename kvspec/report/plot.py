"""An SVG plot of registered versus computed tokens, spec against subject.

Written by hand (no plotting library): a few polylines per panel.  One panel
per group that differs somewhere in the sweep; the area between the spec's
line and the subject's is shaded, so a sawtooth loss is visible at a glance.
"""

from __future__ import annotations

from html import escape

from kvspec.model.finding import Finding

__all__ = ["render_svg"]

WIDTH, PANEL_HEIGHT, MARGIN = 640, 300, 48


def _panel(f: Finding, group: int, top: int) -> list[str]:
    sweep = f.sweep
    ns = sweep["n"]
    spec, subject = sweep["spec"][group], sweep["subject"][group]
    points = [(n, s, o) for n, s, o in zip(ns, spec, subject) if s is not None and o is not None]
    if not points:
        return []
    x_max = max(ns)
    y_max = max(max(n, s, o) for n, s, o in points) or 1
    plot_w, plot_h = WIDTH - 2 * MARGIN, PANEL_HEIGHT - 2 * MARGIN
    X = lambda n: MARGIN + plot_w * n / x_max
    Y = lambda y: top + MARGIN + plot_h * (1 - y / y_max)
    line = lambda values: " ".join(f"{X(n):.1f},{Y(v):.1f}" for n, v in values)
    row = f.groups[group] if group < len(f.groups) else None
    title = f"group {group}" + (f" ({row.kind}, block {row.block_size}{', EAGLE' if row.eagle else ''})"
                                if row else "")
    out = [
        f'<text x="{MARGIN}" y="{top + 20}" font-size="14" font-weight="bold">'
        f'{escape(title)}: registered vs computed tokens</text>',
        f'<line x1="{MARGIN}" y1="{Y(0):.1f}" x2="{X(x_max):.1f}" y2="{Y(0):.1f}" stroke="black"/>',
        f'<line x1="{MARGIN}" y1="{Y(0):.1f}" x2="{MARGIN}" y2="{Y(y_max):.1f}" stroke="black"/>',
        f'<text x="{WIDTH / 2:.0f}" y="{top + PANEL_HEIGHT - 8}" font-size="12" text-anchor="middle">'
        f'computed tokens n (one prefill)</text>',
        f'<text x="12" y="{top + PANEL_HEIGHT / 2:.0f}" font-size="12" '
        f'transform="rotate(-90 12 {top + PANEL_HEIGHT / 2:.0f})" text-anchor="middle">registered tokens</text>',
    ]
    config = f.inputs.get("config")
    step = config.get("scheduler_block_size", 0) if isinstance(config, dict) else 0
    step = step or max(1, x_max // 8)
    while x_max / step > 16:  # ticks on scheduler-block boundaries, at most 16
        step *= 2
    for tick in range(0, x_max + 1, step):
        out.append(f'<line x1="{X(tick):.1f}" y1="{Y(0):.1f}" x2="{X(tick):.1f}" y2="{Y(y_max):.1f}" '
                   f'stroke="#eee"/>')
        out.append(f'<text x="{X(tick):.1f}" y="{Y(0) + 14:.1f}" font-size="10" '
                   f'text-anchor="middle">{tick}</text>')
    # The loss: the region between the spec's line and the subject's.
    gap = [(n, s) for n, s, _ in points] + [(n, o) for n, _, o in reversed(points)]
    out += [
        f'<polygon points="{line(gap)}" fill="#d62728" fill-opacity="0.25" stroke="none"/>',
        f'<polyline points="{line([(n, n) for n, _, _ in points])}" fill="none" stroke="#999" '
        f'stroke-dasharray="4 3"/>',
        f'<polyline points="{line([(n, s) for n, s, _ in points])}" fill="none" stroke="#1f77b4" '
        f'stroke-width="2"/>',
        f'<polyline points="{line([(n, o) for n, _, o in points])}" fill="none" stroke="#d62728" '
        f'stroke-width="1.5" stroke-dasharray="6 2"/>',
    ]
    if f.n is not None and f.n <= x_max:
        out.append(f'<line x1="{X(f.n):.1f}" y1="{Y(0):.1f}" x2="{X(f.n):.1f}" y2="{Y(y_max):.1f}" '
                   f'stroke="black" stroke-dasharray="2 2"/>')
        out.append(f'<text x="{X(f.n) + 3:.1f}" y="{Y(0) - 6:.1f}" font-size="10">'
                   f'finding n = {f.n}</text>')
    label = sweep.get("label", "subject")
    if len(label) > 48:
        label = "..." + label[-45:]
    legend = [("#999", "computed (n)"), ("#1f77b4", "spec"), ("#d62728", label),
              ("#f4b6b6", "lost registrations")]
    for i, (colour, label) in enumerate(legend):
        y = top + MARGIN + 14 * i
        out.append(f'<line x1="{MARGIN + 10}" y1="{y}" x2="{MARGIN + 30}" y2="{y}" stroke="{colour}" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{MARGIN + 34}" y="{y + 4}" font-size="11">{escape(label)}</text>')
    return out


def render_svg(f: Finding) -> str:
    if not f.sweep:
        raise ValueError("the finding has no sweep to plot (it was not produced against a live subject)")
    groups = len(f.sweep["spec"])
    differing = [g for g in range(groups) if f.sweep["spec"][g] != f.sweep["subject"][g]] or [0]
    body: list[str] = []
    for i, g in enumerate(differing[:3]):
        body += _panel(f, g, i * PANEL_HEIGHT)
    height = PANEL_HEIGHT * len(differing[:3])
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        *body, "</svg>", ""])
