"""The CLI's view of a limit: :class:`Config` (rules, algorithm, cap) and :class:`LimitEntry`
(a limit with its name, kind and subject, and the limiter that reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..limiter import Limiter
from ..rules import Rule
from .common import State

__all__ = ["Config", "LimitEntry"]

_ANY_RULE = (Rule(1, 1.0),)
"""A stand-in for unknown rules: blocks and sliding-log bookings do not depend on the rules."""


@dataclass(frozen=True)
class Config:
    """Rules and algorithm of one limit (the CLI's view of a ``LimitConfig``)."""

    rules: tuple[Rule, ...]
    algorithm: str
    concurrency: int | None = None
    lease: float = 30.0
    shadow: bool = False
    live: bool = False
    """Set live (``governor limits set``), replacing the configuration."""
    live_by: str | None = field(default=None, compare=False)
    live_at: float | None = field(default=None, compare=False)
    """Who set it live and when (Unix seconds)."""
    configured: str | None = field(default=None, compare=False)
    """For a live limit: the configuration it replaces (:attr:`text`), if any."""
    adaptive: bool = False
    factor: float = 1.0
    """An adaptive limit's factor now: ``rules`` are already scaled by it."""
    ceiling: tuple[Rule, ...] = ()
    """An adaptive limit's configured rules, when ``rules`` are scaled (its state is named
    after them)."""
    fair: bool = False
    """Shared fairly between tenants (``fair_by``): calls wait in a fair queue."""
    weight: Any = field(default=None, compare=False)
    """Under a fair limit: ``weight(tenant) -> float``."""
    meters: tuple[tuple[str, tuple[Rule, ...]], ...] = ()
    """Rules per meter (``rules`` then holds them all, meter after meter)."""

    @property
    def rule_spec(self) -> Any:
        """What :class:`~governor.Limiter` takes: the rules, or rules per meter."""
        return {m: rules for m, rules in self.meters} if self.meters else (self.rules or None)

    @property
    def text(self) -> str:
        parts = [r.text for r in self.rules]
        if self.meters:
            parts = [f"{m}: {', '.join(r.text for r in rules)}" for m, rules in self.meters]
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        marks = [m for m, on in (("shadow", self.shadow), ("live", self.live)) if on]
        if self.adaptive:
            marks.append(f"adaptive, {self.factor:.0%} of its rules now")
        if self.fair:
            marks.append("fair")
        return ", ".join(parts) + (f" ({'; '.join(marks)})" if marks else "")


@dataclass(frozen=True)
class LimitEntry:
    """One limit: ``kind`` is ``queue``, ``task``, ``key`` (per-key, one limiter, many subjects)
    or ``found`` (seen in Redis, rules unknown)."""

    kind: str
    name: str
    config: Config | None
    subject: str | None = None
    tasks: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ()
    """For ``found`` limits: the algorithms whose state keys were seen."""

    @property
    def label(self) -> str:
        """``queue:emails``, ``task:proj.sync``, or the limiter name of a per-key limit."""
        return f"{self.name}:{self.subject}" if self.kind in ("queue", "task") else self.name

    def limiter(self, state: State, algorithm: str | None = None) -> Limiter:
        rules: Any = self.config.rules if self.config else _ANY_RULE
        if self.config and self.config.meters:
            rules = self.config.rule_spec  # rules per meter (adaptive limits take none)
        ceiling: tuple[Rule, ...] | None = None
        algo = algorithm or (self.config.algorithm if self.config else "sliding_log")
        if self.config and self.config.adaptive and algo == self.config.algorithm:
            from ..celery.config.factors import limiter_rules  # as workers run it

            rules, ceiling = limiter_rules(rules, self.config.ceiling, algo, True)
        elif self.config and self.config.ceiling:
            rules = self.config.ceiling  # another algorithm's keys: as configured
        cap = self.config.concurrency if self.config else None
        return Limiter(
            state.client,
            rules,
            algorithm=algo,
            name=self.name,
            prefix=state.prefix,
            concurrency=cap,
            lease=self.config.lease if self.config else 30.0,
            ceiling=ceiling,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "subject": self.subject,
            "label": self.label,
            "rules": [r.text for r in self.config.rules] if self.config else None,
            "meters": {m: [r.text for r in rules] for m, rules in self.config.meters}
            if self.config and self.config.meters
            else None,
            "algorithm": self.config.algorithm if self.config else None,
            "concurrency": self.config.concurrency if self.config else None,
            "tasks": list(self.tasks),
            "live": self._live(),
            "adaptive_factor": self.config.factor if self.config and self.config.adaptive else None,
        }

    def _live(self) -> dict[str, Any] | None:
        c = self.config
        if c is None or not c.live:
            return None
        return {"by": c.live_by, "at": c.live_at, "configured": c.configured}
