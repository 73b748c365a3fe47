"""``governor plan ... --chart plan.svg``: the planned schedule as an SVG bar chart.

Jobs starting in each bucket (a second, minute, hour, day or week: the smallest that keeps the
chart within :data:`MAX_BARS` bars) as bars, and each rule's ceiling for a bucket of that size
as a dashed horizontal line: a rule "N per W" lets at most ``N // cost * ceil(bucket / W)`` jobs
start in any bucket (split it into windows of W). The y axis reaches the tallest bar and the
lowest ceiling; a higher ceiling is listed in the legend as above the chart. Pure Python: plain
SVG text, no plotting library.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from ..plan import Plan
from .common import format_duration
from .svg import (
    BAR,
    CEILING_COLOURS,
    bucket_for,
    ceiling,
    nice_step,
    number_text,
    tick_label,
)

__all__ = ["render", "write"]


WIDTH, HEIGHT = 900, 460
LEFT, RIGHT, TOP, BOTTOM = 70, 230, 50, 70
"""Margins around the plot area: the legend sits on the right."""


def render(plan: Plan, origin: float | None = None) -> str:
    """The chart as SVG text. ``origin``: the batch's clock time, to label the x axis with
    local times (else offsets from the start)."""
    bucket = bucket_for(plan.last)
    counts = dict(plan.counts(bucket.size))
    n = max(counts, default=0) + 1
    bars = [counts.get(i, 0) for i in range(n)]
    ceilings = [(rule, ceiling(rule, bucket.size, plan.cost)) for rule in plan.rules]
    top = max(max(bars), min(c for _, c in ceilings))
    step = nice_step(top * 1.1)
    y_max = step * math.ceil(top * 1.1 / step)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / y_max)

    rules = ", ".join(r.text for r in plan.rules)
    title = f"{plan.jobs} jobs under {rules}: the last starts after {format_duration(plan.last)}"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text class="title" x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="15">'
        f"{escape(title)}</text>",
    ]
    # y axis: grid lines and ticks
    out.append('<g class="y-axis">')
    value = 0.0
    while value <= y_max + step / 2:
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#ddd"/><text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
            f"{number_text(value)}</text>"
        )
        value += step
    out.append(
        f'<text class="y-label" transform="translate(18 {TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">jobs per {escape(bucket.name)}</text></g>'
    )
    # bars, one per bucket (an empty bucket has a bar of height 0)
    slot = plot_w / n
    width = max(slot * 0.8, 0.5)
    out.append('<g class="bars">')
    for i, count in enumerate(bars):
        x = LEFT + i * slot + (slot - width) / 2
        label = f"{tick_label(i, bucket, origin)}: {count} jobs"
        out.append(
            f'<rect class="bar" x="{x:.2f}" y="{y(count):.2f}" width="{width:.2f}" '
            f'height="{TOP + plot_h - y(count):.2f}" fill="{BAR}">'
            f"<title>{escape(label)}</title></rect>"
        )
    out.append("</g>")
    # x axis: at most about 12 labels
    every = max(1, math.ceil(n / 12))
    out.append(
        f'<g class="x-axis"><line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{TOP + plot_h}" '
        f'y2="{TOP + plot_h}" stroke="black"/>'
    )
    for i in range(0, n, every):
        x = LEFT + (i + 0.5) * slot
        out.append(
            f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">'
            f"{escape(tick_label(i, bucket, origin))}</text>"
        )
    x_label = (
        f"{bucket.plural} after the start"
        if origin is None
        else f"local time, from {datetime.fromtimestamp(origin):%Y-%m-%d %H:%M:%S}"
    )
    out.append(
        f'<text class="x-label" x="{LEFT + plot_w / 2}" y="{HEIGHT - 20}" '
        f'text-anchor="middle">{escape(x_label)}</text></g>'
    )
    # each rule's ceiling: a dashed line when it fits, a legend entry always
    out.append('<g class="rules">')
    legend_y = TOP + 10
    out.append(
        f'<text x="{LEFT + plot_w + 16}" y="{legend_y}" font-weight="bold">'
        f"ceiling per {escape(bucket.name)}</text>"
    )
    for k, (rule, most) in enumerate(ceilings):
        colour = CEILING_COLOURS[k % len(CEILING_COLOURS)]
        legend_y += 20
        text = f"{rule.text}: {number_text(most)}"
        if most <= y_max:
            out.append(
                f'<line class="ceiling" data-rule={quoteattr(rule.text)} x1="{LEFT}" '
                f'x2="{LEFT + plot_w}" y1="{y(most):.2f}" y2="{y(most):.2f}" stroke="{colour}" '
                f'stroke-width="2" stroke-dasharray="6 4"/>'
            )
        else:
            text += " (above the chart)"
        out.append(
            f'<text class="rule" x="{LEFT + plot_w + 16}" y="{legend_y}" fill="{colour}">'
            f"{escape(text)}</text>"
        )
    out.append("</g></svg>")
    return "\n".join(out) + "\n"


def write(path: Path, plan: Plan, origin: float | None = None) -> None:
    """Write :func:`render`'s SVG to ``path`` (``OSError`` if it cannot be written)."""
    path.write_text(render(plan, origin), encoding="utf-8")
