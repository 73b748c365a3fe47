"""Adaptive factors: how an adaptive limit's rules scale (the configured rules are a ceiling,
the upstream's answers set the rate; the decrease at a Backoff is :mod:`..feedback.adaptive`).

``{"rules": "10/s", "adaptive": True}``: at each :class:`~governor.celery.Backoff` under the
limit, its rate is multiplied by ``governor_adaptive_decrease`` (0.7); between them it climbs
back by ``governor_adaptive_rise`` (0.02) of the rules each second, never above them and never
below ``governor_adaptive_floor`` (AIMD, as TCP's congestion control and AWS's adaptive retry
mode). The factor lives in Redis (``adapt.lua``: one decrease per overload, however many
processes met its 429s) as its value at the last decrease and that moment, so every worker
computes the same factor at any time without another write; workers read it with the live
limits (:mod:`.live`), within about a second of a change.

A factor scales each rule's limit, or stretches its period when the limit is small (under 10
units after scaling), in steps of 1/20. The sliding log keeps its stamps across these steps;
the other algorithms keep state per rule set, so each step starts them afresh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ...rules import Rule
from ...text import as_text
from ..types import LimitConfig

__all__ = ["Factor", "adaptive_key", "read_factors", "scale_rules", "scaled"]

STEPS = 20
"""Factors are rounded down to multiples of 1/STEPS (fewer distinct rule sets)."""


@dataclass(frozen=True, slots=True)
class Factor:
    """An adaptive limit's factor: ``value`` at its last decrease, at ``since`` (Unix s)."""

    value: float
    since: float

    def at(self, now: float, rise: float) -> float:
        return min(1.0, self.value + rise * max(0.0, now - self.since))


def adaptive_key(prefix: str) -> str:
    return f"{prefix}:{{live}}:adaptive"


def read_factors(client: Any, prefix: str) -> dict[str, Factor]:
    """Every adaptive limit's factor by label (one HGETALL)."""
    out: dict[str, Factor] = {}
    for label, raw in client.hgetall(adaptive_key(prefix)).items():
        text = as_text(raw)
        value, _, since = text.partition(":")
        try:
            out[as_text(label)] = Factor(float(value), int(since) / 1e6)
        except ValueError:
            continue
    return out


def scaled(config: LimitConfig, factor: float) -> LimitConfig:
    """``config`` with its rules' rates times ``factor`` (rounded down to a step)."""
    rules = scale_rules(config.rules, factor)
    return config if rules is config.rules else replace(config, rules=rules)


def scale_rules(rules: tuple[Rule, ...], factor: float) -> tuple[Rule, ...]:
    """Each rule's rate times ``factor``, rounded down to a step of 1/:data:`STEPS` (``rules``
    itself at 1): its limit scaled, or its period stretched when the limit would fall under
    10 units."""
    step = max(1, math.floor(factor * STEPS + 1e-9)) / STEPS
    if step >= 1.0:
        return rules
    out = []
    for rule in rules:
        if rule.limit * step >= 10:
            out.append(Rule(math.floor(rule.limit * step), rule.period))
        else:  # too few units to scale: the same burst over a longer period
            out.append(Rule(rule.limit, math.ceil(rule.period / step * 1000) / 1000))
    return tuple(out)
