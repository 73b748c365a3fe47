"""The shapes every part of governor's Celery layer shares: what a limit is, what a call is,
what a decision came to, and what a task carries between waits.

Everything in ``governor.celery`` imports these from here, so its subpackages import only
downward (see docs/architecture.md): :mod:`.config` < :mod:`.decisions` < :mod:`.waiting` <
:mod:`.fair` < :mod:`.feedback` < :mod:`.admission` < the modules Celery and users touch.

- :class:`LimitConfig`: one configured limit (rules, cap, shadow, adaptive, fairness);
- :class:`LimitSpec`: one limit as it applies to a call (limiter name, subject, tenant);
- :class:`Call`: one call of a governed task, as the admission steps see it;
- :class:`Who`, :class:`Outcome`: who would hold a cap's slots, and one answer under all limits;
- :class:`WaitState`: the ``governor`` message header a task carries between waits, and
  :class:`Deferred` / :class:`Duplicate`, what the gate raises to stop a task that waits or
  that is a second copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import Ignore
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from ..costs import Cost
from ..decision import Decision
from ..errors import StorageUnavailable
from ..limiter import Limiter
from ..rules import Rule

__all__ = [
    "HEADER",
    "TRANSIENT",
    "Call",
    "Cap",
    "Deferred",
    "Duplicate",
    "Handed",
    "Held",
    "LimitConfig",
    "LimitSpec",
    "Outcome",
    "TaskOptions",
    "WaitState",
    "Who",
    "handed_by",
]

logger = logging.getLogger("governor.celery")

TRANSIENT = (StorageUnavailable, RedisError, BrokerError, OSError)
"""Errors of a publish that may pass (the broker or Redis away): a re-publish that fails with
one keeps the original message; a hand-over or a fair message is parked for the releasers."""


# -- limits -----------------------------------------------------------------------------


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
    it does not (AIMD; see governor.celery.config.factors)."""
    fair_by: Any = None
    """Share the limit fairly between tenants: a task argument's name, or a callable getting the
    task's arguments by name (see governor.celery.fair.sharing); None: first come, first served."""
    weights: Any = ()
    """Tenants' weights (default 1): sorted (tenant, weight) pairs, or a callable
    ``weight(tenant) -> number`` (its errors and out-of-range answers count as 1, logged)."""
    ceiling: tuple[Rule, ...] = ()
    """An adaptive limit scaled by its factor: the configured rules, which ``rules`` are a
    share of (empty: ``rules`` are the configured ones)."""
    transit: float = 0.0
    """Seconds added to each rule's window (the ``transit`` limit key): ``rules`` hold the
    lengthened windows; the upstream's are this much shorter (header sync counts over those)."""
    meters: tuple[tuple[str, tuple[Rule, ...]], ...] = ()
    """Rules per meter (``{"requests": "500/m", "tokens": "30000/m"}``), decided together in
    one call; ``rules`` then holds them all, meter after meter. Empty: the rules count calls
    (or the task's integer cost)."""

    @property
    def rule_spec(self) -> Any:
        """What :class:`~governor.Limiter` takes: the rules, or rules per meter."""
        if self.meters:
            return {meter: rules for meter, rules in self.meters}
        return self.rules or None

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
        if self.meters:
            parts = [f"{m}: {', '.join(r.text for r in rules)}" for m, rules in self.meters]
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        marks = [m for m, on in (("shadow", self.shadow), ("adaptive", self.adaptive)) if on]
        return ", ".join(parts) + (f" ({', '.join(marks)})" if marks else "")


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One limit that applies to a call: which limiter, which subject, what it costs."""

    kind: str
    name: str
    config: LimitConfig
    subject: str
    tenant: str | None = None
    """Under a fair limit (``fair_by``), the tenant this call is for."""

    @property
    def label(self) -> str:
        """How logs, metrics and the CLI call it: ``queue:emails``, ``task:proj.sync``, or
        ``proj.call_partner`` for per-key limits."""
        return self.name if self.kind == "key" else f"{self.name}:{self.subject}"


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """What governs a task, from settings and its ``governor_*`` attributes."""

    task_spec: LimitSpec | None
    key_config: LimitConfig | None
    cost: Any
    max_wait: float | None
    key: Any = None
    """The task's key function (``governor_key``) as given, when it has a per-key limit."""


# -- decisions --------------------------------------------------------------------------

Held = list[tuple[Limiter, LimitSpec, Decision]]
Cap = tuple[Limiter, str]
"""A concurrency cap: its limiter and subject."""
Handed = list[tuple[str, str, Cap]]
"""Waiters a decision or a refund handed a freed slot: (holder, message, the cap whose slot it
is), for the caller to publish. The cap goes with them: a message that cannot go out leaves
that cap's line at once (:mod:`.waiting.handover`)."""


def handed_by(lim: Limiter, subject: str, pairs: Iterable[tuple[str, str]]) -> Handed:
    """The (holder, message) pairs a call on ``lim``'s cap over ``subject`` returned, as
    :data:`Handed`."""
    return [(holder, message, (lim, subject)) for holder, message in pairs]


@dataclass(frozen=True, slots=True)
class Who:
    """Who would hold the concurrency slots a decision takes: a Celery task's holder id is
    ``<task id>:<retries>``; the token is new for each attempt; info names node and process."""

    holder: str
    token: str
    info: str


@dataclass(slots=True)
class Outcome:
    allowed: bool
    delay: float = 0.0
    """Seconds to wait (from ``at``, a monotonic time)."""
    at: float = field(default_factory=time.monotonic)
    now: float | None = None
    """Server time of the decision."""
    slots: dict[str, list[int]] | None = None
    spec: LimitSpec | None = None
    decision: Decision | None = None
    held: Held = field(default_factory=list)


# -- calls and what they carry ----------------------------------------------------------

HEADER = "governor"
"""The message header a governed task carries between waits."""


class Duplicate(Ignore):  # type: ignore[misc]
    """A second copy of a released parked task: dropped (the first copy runs)."""


class Deferred(Ignore):  # type: ignore[misc]
    """Raised after a governed task was re-published to run later (Celery acks the original)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"Deferred({self.message!r})"


@dataclass(slots=True)
class WaitState:
    """What a task carries between governance waits (the ``governor`` message header)."""

    waits: int = 0
    since: float | None = None
    """Server time of the first deferral."""
    slots: dict[str, list[int]] | None = None
    """Bookings by state key: [start_us, end_us]."""
    booked: float | None = None
    """Server time the bookings were made (an adaptive limit paces those made before its
    rate went down: see ``decisions.pacing``)."""
    outages: int = 0
    parked: str | None = None
    """The parking id a released message carries until a consumer claims it."""
    release: str | None = None
    """The token of the release that published this copy (see ``parking.stamp_release``)."""
    woken: float | None = None
    """When a concurrency slot was handed to this waiting copy (Unix seconds), until it starts."""
    fair: str | None = None
    """The fair-queue entry a copy sent on from a fair queue claims on arrival."""
    tag: float | None = None
    """Its place in the fair queue (kept if it must wait again)."""
    fair_waited: bool = field(default=False, compare=False)
    """This copy already waited in the pool for its room (not carried in the header)."""

    @classmethod
    def from_request(cls, request: Any) -> WaitState:
        raw = (getattr(request, "headers", None) or {}).get(HEADER)
        if raw is None or not isinstance(raw, Mapping):  # (None first: a quick test)
            return cls()
        slots = raw.get("slots")
        return cls(
            waits=int(raw.get("waits") or 0),
            since=raw.get("since"),
            slots=dict(slots) if isinstance(slots, Mapping) else None,
            booked=raw.get("booked"),
            outages=int(raw.get("outages") or 0),
            parked=raw.get("parked"),
            release=raw.get("release"),
            woken=raw.get("woken"),
            fair=raw.get("fair"),
            tag=raw.get("tag"),
        )

    def header(self) -> dict[str, Any]:
        return {
            "waits": self.waits,
            "since": self.since,
            "slots": self.slots,
            "booked": self.booked,
            "outages": self.outages,
            "parked": self.parked,
            "release": self.release,
            "woken": self.woken,
            "fair": self.fair,
            "tag": self.tag,
        }


@dataclass(slots=True)
class Call:
    """One call of a governed task, as the admission steps see it."""

    task: Any
    request: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    specs: list[LimitSpec]
    """Every limit that governs it, queue first."""
    cost: Cost
    """Units of every rule (an int), or units per meter (see governor.celery.metering)."""
    state: WaitState
    """What it carries between waits (the ``governor`` header)."""
    shadows: list[LimitSpec] = field(default_factory=list)
    """Limits in shadow mode: observed when the call is admitted, never deferring it."""
    learned: dict[str, int] | None = None
    """Meters of the cost that were learned estimates: their defaults."""

    @property
    def name(self) -> str:
        """``task[id]``, for logs and messages."""
        return f"{self.task.name}[{self.request.id}]"
