"""Adaptive factors: how an adaptive limit's rules scale (the configured rules are a ceiling,
the upstream's answers set the rate; the decrease at a Backoff is :mod:`..feedback.adaptive`).

``{"rules": "10/s", "adaptive": True}``: at each :class:`~governor.celery.Backoff` under the
limit, its rate is multiplied by ``governor_adaptive_decrease`` (0.7); between them it climbs
back by ``governor_adaptive_rise`` (0.02) of the rules each second, never above them and never
below ``governor_adaptive_floor`` (AIMD, as TCP's congestion control and AWS's adaptive retry
mode). It remembers where the upstream refused, as CUBIC does: the climb stops at
:data:`HOLD_AT` of that factor for ``governor_adaptive_hold`` seconds before it probes higher,
so a learned quota is kept with few refusals instead of a sawtooth that meets one every few
seconds. At or under that hold, a refusal lowers the rate only when another comes within
:data:`CONFIRM` pauses: at a learned quota, a lone 429 from a call that reached the upstream's
window edge a few ms early pauses the limit and keeps its rate. The factor lives in
Redis (``adapt.lua``: one decrease per overload, however many processes met its 429s) as its
value after the last decrease, that moment and the factor the upstream refused, so every worker
computes the same factor at any time without another write; workers read it with the live
limits (:mod:`.live`), within about a second of a change.

A factor scales each rule's limit (its burst shrinks with its rate: ``10/s`` at 0.5 is
``5/s``, not ten at once every two seconds), in steps of 1/:data:`STEPS`. Under one unit per
period, the sliding log and gcra stretch the period (one unit per longer period); the other
algorithms count per period, so their rate goes no lower than one unit per period.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ...algorithms import STRETCH
from ...rules import MAX_PERIOD_US, Rule
from ...text import as_text
from ..types import LimitConfig

__all__ = [
    "CONFIRM",
    "HOLD_AT",
    "STEPS",
    "Factor",
    "adaptive_key",
    "configured",
    "limiter_rules",
    "read_factors",
    "scale_rules",
    "scaled",
]

STEPS = 100
"""Factors are rounded down to multiples of 1/STEPS (a bounded number of rule sets)."""
HOLD_AT = 0.9
"""The climb back holds at this share of the factor the upstream refused (``adapt.lua`` too)."""
CONFIRM = 4
"""At or under the hold, a refusal lowers the rate when another comes within this many pauses
(``adapt.lua``)."""


@dataclass(frozen=True, slots=True)
class Factor:
    """An adaptive limit's factor: ``value`` after its last decrease, at ``since`` (Unix s),
    when the upstream refused at factor ``refused`` (0: no refusal known)."""

    value: float
    since: float
    refused: float = 0.0

    def at(self, now: float, rise: float, hold: float = 0.0) -> float:
        """The factor at ``now``: up by ``rise`` a second, pausing ``hold`` seconds where it
        reaches :data:`HOLD_AT` of ``refused``; at most 1."""
        climbed = max(0.0, now - self.since)
        if self.refused > 0 and rise > 0:
            reach = max(0.0, (HOLD_AT * self.refused - self.value) / rise)
            climbed -= min(max(climbed - reach, 0.0), hold)
        return min(1.0, self.value + rise * climbed)


def adaptive_key(prefix: str) -> str:
    return f"{prefix}:{{live}}:adaptive"


def read_factors(client: Any, prefix: str) -> dict[str, Factor]:
    """Every adaptive limit's factor by label (one HGETALL)."""
    out: dict[str, Factor] = {}
    for label, raw in client.hgetall(adaptive_key(prefix)).items():
        text = as_text(raw)
        fields = text.split(":")  # factor, since (us), refused, doubt (us); older: fewer
        try:
            out[as_text(label)] = Factor(
                float(fields[0]), int(fields[1]) / 1e6, float(fields[2]) if fields[2:] else 0.0
            )
        except (ValueError, IndexError):
            continue
    return out


def scaled(config: LimitConfig, factor: float) -> LimitConfig:
    """``config`` with its rules' rates times ``factor`` (rounded down to a step); its
    ``ceiling`` keeps the configured rules."""
    rules = scale_rules(config.rules, factor, config.algorithm)
    return config if rules is config.rules else replace(config, rules=rules, ceiling=config.rules)


def limiter_rules(
    rules: tuple[Rule, ...], ceiling: tuple[Rule, ...], algorithm: str, adaptive: bool
) -> tuple[tuple[Rule, ...], tuple[Rule, ...] | None]:
    """The rules a limiter runs for a limit whose rules in force are ``rules`` (a share of
    ``ceiling``, its configured rules; empty: ``rules`` are), and the ceiling its state is named
    after. A token bucket keeps no key for a full bucket and reads a missing key as full: full
    for a share, read later as full for a larger one, would admit past the configured rules.
    So an adaptive token bucket runs the configured buckets beside the share's, always (one
    state, whatever the share): its key goes only when they are full too."""
    top = ceiling or rules
    if adaptive and algorithm == "token_bucket":
        return rules + top, top + top
    return rules, ceiling or None


def configured(config: LimitConfig) -> LimitConfig:
    """``config`` with its configured rules again (the inverse of :func:`scaled`)."""
    return replace(config, rules=config.ceiling, ceiling=()) if config.ceiling else config


def scale_rules(
    rules: tuple[Rule, ...], factor: float, algorithm: str = "sliding_log"
) -> tuple[Rule, ...]:
    """Each rule's rate times ``factor``, rounded down to a step of 1/:data:`STEPS` (``rules``
    itself at 1): its limit scaled down to a whole number of units; under one unit, one unit
    over a stretched period (the sliding log and gcra) or one unit per period (the others,
    whose state counts per period)."""
    step = max(1, math.floor(factor * STEPS + 1e-9))
    if step >= STEPS:
        return rules
    out = []
    for rule in rules:
        units = rule.limit * step // STEPS
        if units >= 1 or algorithm not in STRETCH:
            out.append(Rule(max(1, units), rule.period))
        else:  # one unit over the period that keeps the rate (whole ms, rounded up)
            period_ms = math.ceil(rule.period_us * STEPS / (rule.limit * step) / 1000)
            out.append(Rule(1, min(period_ms * 1000, MAX_PERIOD_US) / 1e6))
    return tuple(out)
