"""One configured limit: :class:`LimitConfig` and :func:`limit_config`, which reads it from a
setting's value (``"10/s, 800/d"`` or ``{"rules": ..., "algorithm": ..., "concurrency": ...,
"shadow": ..., "adaptive": ...}``) or a live limit's."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..algorithms import get_algorithm
from ..caps import Cap
from ..errors import ConfigError, GovernorError
from ..rules import Rule, parse_rules

logger = logging.getLogger("governor.celery")

__all__ = ["LimitConfig", "limit_config"]


@dataclass(frozen=True, slots=True)
class LimitConfig:
    """One configured limit: its rules (maybe none) and its concurrency cap (maybe none)."""

    rules: tuple[Rule, ...]
    algorithm: str
    concurrency: int | None = None
    lease: float = 30.0
    """Seconds a concurrency slot outlives its holder's last renewal."""
    shadow: bool = False
    """Count and log what the limit would deny, but deny nothing (a trial on real traffic)."""
    adaptive: bool = False
    """Lower the rules' rates when the upstream pushes back (Backoff), raise them back while
    it does not (AIMD; see governor.celery.adaptive)."""
    fair_by: Any = None
    """Share the limit fairly between tenants: a task argument's name, or a callable getting the
    task's arguments by name (see governor.celery.fairness); None: first come, first served."""
    weights: Any = ()
    """Tenants' weights (default 1): sorted (tenant, weight) pairs, or a callable
    ``weight(tenant) -> number`` (its errors and out-of-range answers count as 1, logged)."""

    def weight(self, tenant: str) -> float:
        if callable(self.weights):
            try:
                w = self.weights(tenant)
                if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.001 <= w <= 1000:
                    raise ValueError(f"weight {w!r} is not a number from 0.001 to 1000")
                return float(w)
            except Exception as exc:
                logger.warning("governor: weight of tenant %r: %r; using 1", tenant, exc)
                return 1.0
        for name, w in self.weights:
            if name == tenant:
                return float(w)
        return 1.0

    @property
    def text(self) -> str:
        parts = [r.text for r in self.rules]
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        marks = [m for m, on in (("shadow", self.shadow), ("adaptive", self.adaptive)) if on]
        return ", ".join(parts) + (f" ({', '.join(marks)})" if marks else "")


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
        unknown = set(value) - {
            "rules",
            "algorithm",
            "concurrency",
            "shadow",
            "adaptive",
            "fair_by",
            "weights",
        }
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
