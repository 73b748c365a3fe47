"""The SVG charts of ``governor demo --report`` (see :mod:`.page`): bars, stacked or side
by side, under dashed ceilings, and step lines of how many things happened by when. Plain SVG
text with every label escaped; scales and colours as :mod:`..svg` gives them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from ..svg import CEILING_COLOURS, nice_step, number_text

__all__ = ["Series", "bar_chart", "steps_chart"]

WIDTH, HEIGHT = 760, 290
LEFT, RIGHT, TOP, BOTTOM = 56, 210, 14, 46
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
LEGEND = 30
WIDE, DASHED = 'stroke-width="4"', 'stroke-width="2" stroke-dasharray="5 4"'
"""Legend texts longer than this are cut short (whole in their tooltip)."""

Series = tuple[str, str, Sequence[float]]
"""A chart's series: its name, colour, and one value per bar (or one time per step)."""


def _svg(title: str, css: str, y_max: float, step: float, y_label: str) -> list[str]:
    """An SVG's opening: title, background, the y axis's grid and labels."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{css}" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" '
        f'font-size="12"><title>{escape(title)}</title>',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
    ]
    value = 0.0
    while value <= y_max + step / 2:
        y = _y(value, y_max)
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{number_text(value)}</text>'
        )
        value += step
    out.append(
        f'<text transform="translate(16 {TOP + PLOT_H / 2}) rotate(-90)" text-anchor="middle">'
        f"{escape(y_label)}</text>"
    )
    return out


def _y(value: float, y_max: float) -> float:
    return TOP + PLOT_H * (1 - value / y_max)


def _scale(top: float) -> tuple[float, float]:
    """(y_max, step): round ticks a tenth above ``top``."""
    step = nice_step(top * 1.1)
    return step * math.ceil(max(top, 1) * 1.1 / step), step


def _legend(out: list[str], entries: Sequence[tuple[str, str, bool]]) -> None:
    """Legend on the right: (text, colour, dashed line rather than a box)."""
    x = LEFT + PLOT_W + 14
    for k, (text, colour, dashed) in enumerate(entries):
        y = TOP + 12 + 20 * k
        mark = (
            f'<line x1="{x}" x2="{x + 14}" y1="{y - 4}" y2="{y - 4}" stroke="{colour}" '
            'stroke-width="2" stroke-dasharray="4 3"/>'
            if dashed
            else f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour}"/>'
        )
        short = text if len(text) <= LEGEND else text[: LEGEND - 1] + "\u2026"
        out.append(
            f'{mark}<text class="legend" x="{x + 20}" y="{y}"><title>{escape(text)}</title>'
            f"{escape(short)}</text>"
        )


def bar_chart(
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    y_label: str,
    *,
    stacked: bool = False,
    ceilings: Sequence[tuple[str, float]] = (),
    css: str = "chart",
) -> str:
    """Bars (side by side, or ``stacked``) with one x label per bar, and dashed ceilings
    (legend, value) drawn across when they fit (else marked "above the chart" in the legend)."""
    n = max(1, len(labels))
    heights = [
        sum(s[2][i] for s in series) if stacked else max((s[2][i] for s in series), default=0)
        for i in range(len(labels))
    ]
    y_max, step = _scale(max([*heights, min((v for _, v in ceilings), default=0)]))
    out = _svg(title, css, y_max, step, y_label)
    slot = PLOT_W / n
    width = max(slot * 0.8, 0.5)
    each = width if stacked or not series else width / len(series)
    for i, label in enumerate(labels):
        base = 0.0
        for k, (name, colour, values) in enumerate(series):
            value = values[i]
            x = LEFT + i * slot + (slot - width) / 2 + (0 if stacked else k * each)
            top, bottom = _y(base + value, y_max), _y(base, y_max)
            base += value if stacked else 0
            if value:
                tip = f"{label}: {name} {number_text(value)}"
                out.append(
                    f'<rect class="bar" x="{x:.2f}" y="{top:.2f}" width="{each:.2f}" '
                    f'height="{bottom - top:.2f}" fill="{colour}"><title>{escape(tip)}</title>'
                    "</rect>"
                )
    _x_axis(out)
    every = max(1, math.ceil(n / 12))
    for i in range(0, len(labels), every):
        out.append(
            f'<text x="{LEFT + (i + 0.5) * slot:.1f}" y="{TOP + PLOT_H + 16}" '
            f'text-anchor="middle">{escape(labels[i])}</text>'
        )
    entries = [(name, colour, False) for name, colour, _ in series]
    for k, (name, value) in enumerate(ceilings):
        colour = CEILING_COLOURS[k % len(CEILING_COLOURS)]
        if value <= y_max:
            y = _y(value, y_max)
            out.append(
                f'<line class="ceiling" data-name="{escape(name)}" x1="{LEFT}" '
                f'x2="{LEFT + PLOT_W}" y1="{y:.2f}" y2="{y:.2f}" stroke="{colour}" '
                'stroke-width="2" stroke-dasharray="6 4"/>'
            )
        entries.append((name + ("" if value <= y_max else " (above the chart)"), colour, True))
    _legend(out, entries)
    out.append("</svg>")
    return "\n".join(out)


def steps_chart(title: str, series: Sequence[Series], y_label: str, *, css: str = "steps") -> str:
    """Step lines, one per series of sorted times (seconds from 0): the ``k``-th time raises
    its line to ``k``, so each line shows how many had happened by when. The first series is
    drawn solid and wide, the others dashed on top (they may run along it)."""
    x_max, x_step = _scale(max([0.001, *(s[2][-1] for s in series if s[2])]) / 1.1)
    y_max, step = _scale(max([1, *(len(s[2]) for s in series)]) / 1.1)
    out = _svg(title, css, y_max, step, y_label)

    def x(t: float) -> float:
        return LEFT + PLOT_W * t / x_max

    for k, (name, colour, times) in enumerate(series):
        points = [f"{x(0):.1f},{_y(0, y_max):.1f}"]
        for i, t in enumerate(times):
            points.append(f"{x(t):.1f},{_y(i, y_max):.1f} {x(t):.1f},{_y(i + 1, y_max):.1f}")
        out.append(
            f'<polyline class="line" data-name="{escape(name)}" fill="none" stroke="{colour}" '
            f'{WIDE if k == 0 else DASHED} points="{" ".join(points)}">'
            f"<title>{escape(name)}</title></polyline>"
        )
    _x_axis(out)
    value = 0.0
    while value <= x_max + x_step / 2:
        out.append(
            f'<text x="{x(value):.1f}" y="{TOP + PLOT_H + 16}" text-anchor="middle">'
            f"{number_text(value)}s</text>"
        )
        value += x_step
    _legend(out, [(name, colour, k > 0) for k, (name, colour, _) in enumerate(series)])
    out.append("</svg>")
    return "\n".join(out)


def _x_axis(out: list[str]) -> None:
    bottom = TOP + PLOT_H
    out.append(
        f'<line x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{bottom}" y2="{bottom}" stroke="#000"/>'
    )
