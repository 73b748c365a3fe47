"""What governor's SVG charts share (``governor plan --chart`` and ``governor demo --report``):
time buckets a bar stands for, a rule's ceiling per bucket, round tick steps, number and tick
labels, colours. Pure Python: the charts are plain SVG text, no plotting library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from ..rules import Rule

__all__ = [
    "BAR",
    "CEILING_COLOURS",
    "MAX_BARS",
    "Bucket",
    "bucket_for",
    "ceiling",
    "nice_step",
    "number_text",
    "tick_label",
]

MAX_BARS = 180
UNITS = (("second", 1), ("minute", 60), ("hour", 3600), ("day", 86400), ("week", 604800))
BAR, CEILING_COLOURS = "#4c78a8", ("#e45756", "#f58518", "#54a24b", "#b279a2", "#9d755d")


@dataclass(frozen=True)
class Bucket:
    """The width of one bar: ``size`` seconds, named ``name`` (``hour``, ``4 weeks``)."""

    name: str
    size: int
    letter: str

    @property
    def plural(self) -> str:
        """``hours``; ``weeks`` for a bucket of several weeks."""
        return "weeks" if self.name[0].isdigit() else f"{self.name}s"


def bucket_for(span: float) -> Bucket:
    """The smallest unit giving at most :data:`MAX_BARS` bars over ``span`` seconds; past that,
    several weeks a bar.

    >>> bucket_for(50), bucket_for(3000).name, bucket_for(12 * 86400).name
    (Bucket(name='second', size=1, letter='s'), 'minute', 'day')
    """
    for name, size in UNITS:
        if span // size + 1 <= MAX_BARS:
            return Bucket(name, size, name[0])
    weeks = math.ceil((span // 604800 + 1) / MAX_BARS)
    return Bucket(f"{weeks} weeks", weeks * 604800, "w")


def ceiling(rule: Rule, bucket_seconds: int, cost: int = 1) -> int:
    """The most jobs ``rule`` lets start in any ``bucket_seconds`` long bucket.

    >>> ceiling(Rule.parse("200/h"), 86400), ceiling(Rule.parse("800/d"), 3600)
    (4800, 800)
    """
    windows = -(-bucket_seconds * 1_000_000 // rule.period_us)
    return (rule.limit // cost) * windows


def nice_step(top: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about ``ticks`` ticks."""
    raw = max(top, 1.0) / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def number_text(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.3g}"


def tick_label(index: int, bucket: Bucket, origin: float | None) -> str:
    if origin is None:
        return f"+{index * bucket.size // _unit_size(bucket)}{bucket.letter}"
    at = datetime.fromtimestamp(origin + index * bucket.size)
    fmt = {1: "%H:%M:%S", 60: "%H:%M", 3600: "%m-%d %H:%M"}.get(bucket.size, "%Y-%m-%d")
    return at.strftime(fmt)


def _unit_size(bucket: Bucket) -> int:
    return 604800 if bucket.letter == "w" else bucket.size
