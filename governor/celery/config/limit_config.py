"""One configured limit: :class:`LimitConfig` and :func:`limit_config`, which reads it from a
setting's value (``"10/s, 800/d"`` or ``{"rules": ..., "algorithm": ..., "concurrency": ...,
"shadow": ..., "adaptive": ...}``) or a live limit's."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ...algorithms import get_algorithm
from ...caps import Cap
from ...errors import ConfigError, GovernorError
from ...rules import parse_rules
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
    fair_by: Any = None
    weights: Any = ()
    if isinstance(value, Mapping):
        unknown = set(value) - {key.name for key in LIMIT_KEYS}
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
    try:
        parsed = () if rules is None else parse_rules(rules)
        get_algorithm(algorithm).check(parsed)
        if concurrency is not None:
            Cap.make(concurrency, lease)
    except GovernorError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    name = get_algorithm(algorithm).name
    if fair_by is not None and not parsed:
        raise ConfigError(f"{where}: fair_by shares rules between tenants: give rules")
    return LimitConfig(parsed, name, concurrency, lease, shadow, adaptive, fair_by, weights)


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
