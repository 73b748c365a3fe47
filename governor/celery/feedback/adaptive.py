"""Adaptive limits, the upstream's side: a :class:`~governor.celery.Backoff` under an adaptive
limit multiplies its factor down, once per overload however many processes met its 429s
(``adapt.lua``); how the factor scales the rules and climbs back is :mod:`..config.factors`.
"""

from __future__ import annotations

from typing import Any

from ...scripts import package_script, run_script
from ..config.factors import adaptive_key
from ..config.settings import Settings

__all__ = ["decrease"]


def decrease(client: Any, settings: Settings, label: str, gap: float) -> tuple[float, bool]:
    """Multiply ``label``'s factor down (once per ``gap`` seconds): (factor, whether it
    changed)."""
    keys = [adaptive_key(settings.prefix), f"{settings.prefix}:{{live}}:version"]
    args = [
        label,
        settings.adaptive_decrease,
        settings.adaptive_rise,
        settings.adaptive_floor,
        round(max(1.0, gap) * 1e6),
        settings.adaptive_hold,
    ]
    factor, changed, _ = run_script(
        client, package_script("governor.celery.feedback", "adapt"), keys, args
    )
    return float(factor), int(changed) == 1
