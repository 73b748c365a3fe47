"""One configured limit: :class:`LimitConfig` and :func:`limit_config`, which reads it from a
setting's value (``"10/s, 800/d"`` or ``{"rules": ..., "algorithm": ..., "concurrency": ...,
"shadow": ..., "adaptive": ...}``) or a live limit's. Rules may be given per meter
(``{"rules": {"requests": "500/m", "tokens": "30000/m"}}``, docs/token-quotas.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ...algorithms import get_algorithm
from ...caps import Cap
from ...costs import MAX_UNITS
from ...errors import ConfigError, GovernorError
from ...rules import Rule, parse_meters, parse_rules
from ..types import LimitConfig
from .defaults import LIMIT_KEYS

logger = logging.getLogger("governor.celery")

__all__ = ["fair_options", "limit_config"]


def limit_config(
    value: Any, default_algorithm: str, where: str, lease: float = 30.0
) -> LimitConfig:
    """Parse one configured limit; errors name ``where`` (e.g. "governor_queues['emails']")."""
    algorithm = default_algorithm
    rules = value
    concurrency = None
    shadow = adaptive = False
    transit: Any = 0
    fair_by: Any = None
    weights: Any = ()
    if isinstance(value, Mapping):
        unknown = set(value) - {key.name for key in LIMIT_KEYS}
        if unknown and not ("rules" in value or "concurrency" in value):
            try:
                parse_meters(value)
            except GovernorError:
                pass
            else:
                raise ConfigError(
                    f"{where}: rules per meter go under 'rules': "
                    f"{{'rules': {dict(value)!r}}}, got {value!r}"
                )
        if unknown or not ("rules" in value or "concurrency" in value):
            raise ConfigError(
                f"{where}: expected {{'rules': '10/s', 'algorithm': 'sliding_log', "
                f"'concurrency': 5, 'shadow': False, 'adaptive': False}} (rules, a concurrency "
                f"cap, or both), got {value!r}"
            )
        rules = value.get("rules")
        algorithm = value.get("algorithm", default_algorithm)
        concurrency = value.get("concurrency")
        shadow = value.get("shadow", False)
        if not isinstance(shadow, bool):
            raise ConfigError(f"{where}: shadow must be True or False, got {shadow!r}")
        if shadow and (concurrency is not None or rules is None):
            raise ConfigError(f"{where}: shadow mode tries rules; a concurrency cap cannot be one")
        adaptive = value.get("adaptive", False)
        if not isinstance(adaptive, bool) or (adaptive and rules is None):
            raise ConfigError(f"{where}: adaptive must be True or False, with rules: {adaptive!r}")
        fair_by, weights = fair_options(value, where, concurrency is not None)
        transit = value.get("transit", 0)
    try:
        meters = _meters(rules, algorithm) if isinstance(rules, Mapping) else ()
        if transit:
            meters = tuple((m, _lengthened(group, transit)) for m, group in meters)
        if meters:
            parsed: tuple[Rule, ...] = tuple(rule for _, group in meters for rule in group)
        else:
            parsed = () if rules is None else parse_rules(rules)
            if transit:
                parsed = _lengthened(parsed, transit)
            get_algorithm(algorithm).check(parsed)
        if concurrency is not None:
            Cap.make(concurrency, lease)
    except GovernorError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    name = get_algorithm(algorithm).name
    if fair_by is not None and not parsed:
        raise ConfigError(f"{where}: fair_by shares rules between tenants: give rules")
    if meters and adaptive:
        raise ConfigError(f"{where}: an adaptive limit cannot have meters (not supported yet)")
    return LimitConfig(
        parsed,
        name,
        concurrency,
        lease,
        shadow,
        adaptive,
        fair_by,
        weights,
        transit=float(transit or 0),
        meters=meters,
    )


def _lengthened(rules: tuple[Rule, ...], transit: Any) -> tuple[Rule, ...]:
    """The rules with windows ``transit`` seconds longer (the ``transit`` limit key).

    The upstream counts a call when it arrives, governor when it admits it: a call that takes
    ``d`` seconds to arrive leaves the upstream's window ``d`` later than governor's, and calls
    admitted in that gap meet the upstream's full window (a 429 at each window's end)."""
    if (
        isinstance(transit, bool)
        or not isinstance(transit, (int, float))
        or not 0 <= transit <= 60
        or round(transit * 1_000_000) % 1_000
    ):
        raise ConfigError(f"transit must be 0 to 60 seconds in whole ms, got {transit!r}")
    return tuple(Rule(r.limit, (r.period_us + round(transit * 1_000_000)) / 1e6) for r in rules)


def _meters(rules: Mapping[str, Any], algorithm: str) -> tuple[tuple[str, tuple[Rule, ...]], ...]:
    """Rules per meter, checked as the limiter checks them (units up to 10^12 per rule; the
    algorithms other than the sliding log keep their own bounds)."""
    meters = parse_meters(rules)
    every = tuple(rule for _, group in meters for rule in group)
    for rule in every:
        if rule.limit > MAX_UNITS:
            raise ConfigError(f"rule {rule.text!r}: a limit of at most {MAX_UNITS} units")
    if get_algorithm(algorithm).name != "sliding_log":
        get_algorithm(algorithm).check(every)
    return meters


def fair_options(value: Mapping[str, Any], where: str, capped: bool) -> tuple[Any, Any]:
    """``fair_by`` and ``weights`` of a limit's mapping, checked."""
    fair_by = value.get("fair_by")
    if fair_by is not None and not (
        callable(fair_by) or (isinstance(fair_by, str) and fair_by.isidentifier())
    ):
        raise ConfigError(
            f"{where}: fair_by must be a task argument's name or a callable, got {fair_by!r}"
        )
    if fair_by is not None and capped:
        raise ConfigError(f"{where}: fair_by shares rates; it cannot be combined with a cap yet")
    raw = value.get("weights") or {}
    if callable(raw):
        if fair_by is None:
            raise ConfigError(f"{where}: weights need fair_by")
        return fair_by, raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: weights must be a mapping tenant -> weight, got {raw!r}")
    weights = []
    for tenant, w in raw.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.001 <= w <= 1000:
            raise ConfigError(f"{where}: weight of {tenant!r} must be 0.001 to 1000, got {w!r}")
        weights.append((str(tenant), float(w)))
    if weights and fair_by is None:
        raise ConfigError(f"{where}: weights need fair_by")
    return fair_by, tuple(sorted(weights))
