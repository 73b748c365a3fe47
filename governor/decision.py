"""What a limiter answers: :class:`Decision` for one request, :class:`Usage` for a subject."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .rules import Rule

__all__ = ["CapUsage", "Decision", "Hold", "Holder", "RuleUsage", "Settled", "Slot", "Usage"]

_US = 1_000_000


def seconds(us: int) -> float:
    """Microseconds from a script to seconds; -1 means never."""
    return math.inf if us < 0 else us / _US


@dataclass(frozen=True, slots=True)
class Slot:
    """The moment an admission counts at, or the window a booking may start in.

    For a booking, the holder may start at any moment in ``[start, end]`` (``end - start`` is the
    late tolerance). Both are Unix microseconds on the limiter's clock. Pass a slot back to
    :meth:`~governor.Limiter.claim` or :meth:`~governor.Limiter.refund`.
    """

    start_us: int
    end_us: int

    @property
    def start(self) -> float:
        return self.start_us / _US

    @property
    def end(self) -> float:
        return self.end_us / _US


@dataclass(frozen=True, slots=True)
class Pause:
    """A subject paused after its upstream pushed back (:meth:`~governor.Limiter.pause`).

    ``until`` and ``now`` are Unix seconds on the limiter's clock; ``level`` counts the
    exponential pauses in a row (0 for a pause of a given length). ``until`` may be later than
    asked: a longer block or pause already in place is kept.
    """

    until: float
    now: float
    level: int

    @property
    def seconds(self) -> float:
        return max(0.0, self.until - self.now)


@dataclass(frozen=True, slots=True)
class Hold:
    """A concurrency slot a decision took: give it back with ``release``, keep it with ``renew``.

    ``fence`` is a fencing token: larger than every one given before for the subject, so a
    downstream system can refuse a holder whose slot was given to another in the meantime.
    """

    holder: str
    token: str
    fence: int
    lease: float
    """Seconds the slot is held without a renewal."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one acquire/peek/reserve/claim.

    ``allowed`` means "go now". A denied reservation that holds a slot has ``slot`` set and
    ``retry_after`` is the wait until the slot opens.
    """

    allowed: bool
    retry_after: float
    """Seconds until every rule admits the request: 0.0 when allowed, ``math.inf`` if never."""
    remaining: int
    """How many more units would be admitted right now (the smallest over the rules)."""
    reset_after: float
    """Seconds until the subject is fully replenished."""
    rule: Rule | None
    """The rule that denied (the one with the longest wait), or None."""
    blocked: str | None
    """The reason of the manual block that denied, or None."""
    now: float
    """The clock (Unix seconds) the decision was taken at: Redis TIME unless ``now`` was given."""
    slot: Slot | None = None
    """The admission or booking this decision holds, for claim and refund."""
    cost: int = 1
    """The units asked for (a refund gives back as many). A limiter with meters: the largest
    of :attr:`units`."""
    capped: str | None = None
    """Why the concurrency cap denied, or None: ``"full"`` (every slot is held or waited for;
    ``retry_after`` is only an estimate, the earliest lease's end), ``"copy"`` (a live copy of
    this holder holds a slot), ``"done"`` (this holder finished while a copy waited)."""
    hold: Hold | None = None
    """The concurrency slot an admission took (limiters with a cap)."""
    handed: tuple[tuple[str, str], ...] = ()
    """(holder, message) of waiters this call handed a freed slot to: the caller publishes
    each message (governor.celery does). Waiting processes are woken by Redis instead."""
    units: tuple[tuple[str, int], ...] = ()
    """A limiter with meters: the units asked for, per meter (``dict(decision.units)``); what
    :meth:`~governor.Limiter.refund` gives back and :meth:`~governor.Limiter.settle` settles.
    Empty for a limiter without meters."""

    @property
    def booked(self) -> bool:
        """True when the request was not admitted now but holds a future slot."""
        return not self.allowed and self.slot is not None


@dataclass(frozen=True, slots=True)
class Settled:
    """What :meth:`~governor.Limiter.settle` did with a reservation.

    ``status`` is ``"settled"``, ``"duplicate"`` (its id was settled before: nothing changed)
    or ``"lapsed"`` (its lease ended: the estimate stands, nothing changed). Per rule (in the
    limiter's order): the units given back to its window, and the units charged now because
    the use passed the estimate.
    """

    status: str
    now: float
    given_back: tuple[int, ...] = ()
    charged: tuple[int, ...] = ()

    @property
    def settled(self) -> bool:
        return self.status == "settled"


@dataclass(frozen=True, slots=True)
class RuleUsage:
    """One rule's view of a subject."""

    rule: Rule
    used: int
    """Units counted in the window now (bookings included)."""
    retry_after: float
    """Seconds until this rule admits one more unit."""
    reset_after: float
    """Seconds until this rule counts nothing."""
    meter: str | None = None
    """The meter the rule counts (a limiter with meters), or None."""

    @property
    def limit(self) -> int:
        return self.rule.limit

    @property
    def remaining(self) -> int:
        return max(0, self.rule.limit - self.used)


@dataclass(frozen=True, slots=True)
class Usage:
    """Everything a limiter knows about one subject."""

    name: str
    subject: str
    now: float
    rules: tuple[RuleUsage, ...]
    blocked: str | None
    """The active manual block's reason ("" if none was given), or None when not blocked."""
    blocked_for: float
    """Seconds the manual block still lasts (0.0 when not blocked)."""
    booked: int = 0
    """Bookings held for the future (sliding_log, gcra), counted in units of cost (with meters:
    of the first meter). The sliding log keeps at most :data:`~governor.algorithms.MAX_LOG`
    entries, so it may count fewer: :attr:`booked_for` tells how far the bookings reach."""
    booked_for: float = 0.0
    """Seconds until the last booking held starts (0.0 when none)."""
    paused: bool = False
    """The block is an upstream pause (:meth:`~governor.Limiter.pause`), not a manual block."""


@dataclass(frozen=True, slots=True)
class Holder:
    """One holder of a concurrency slot."""

    holder: str
    since: float
    """Unix seconds it took the slot (for a handed-over slot: when it was handed)."""
    expires: float
    """Unix seconds its lease ends unless renewed."""
    fence: int
    info: str
    """What the holder said about itself (governor.celery: the worker node and process)."""
    pending: bool
    """Handed over to a waiter that has not started yet."""


@dataclass(frozen=True, slots=True)
class CapUsage:
    """A concurrency cap's holders and waiters for one subject."""

    limit: int
    holders: tuple[Holder, ...]
    waiting: int
    now: float

    @property
    def held(self) -> int:
        return sum(1 for h in self.holders if h.expires > self.now)
