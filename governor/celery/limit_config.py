"""One configured limit: :class:`LimitConfig` and :func:`limit_config`, which reads it from a
setting's value (``"10/s, 800/d"`` or ``{"rules": ..., "algorithm": ..., "concurrency": ...,
"shadow": ..., "adaptive": ...}``) or a live limit's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..algorithms import get_algorithm
from ..caps import Cap
from ..errors import ConfigError, GovernorError
from ..rules import Rule, parse_rules

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
    if isinstance(value, Mapping):
        unknown = set(value) - {"rules", "algorithm", "concurrency", "shadow", "adaptive"}
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
    try:
        parsed = () if rules is None else parse_rules(rules)
        get_algorithm(algorithm).check(parsed)
        if concurrency is not None:
            Cap.make(concurrency, lease)
    except GovernorError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    name = get_algorithm(algorithm).name
    return LimitConfig(parsed, name, concurrency, lease, shadow, adaptive)
