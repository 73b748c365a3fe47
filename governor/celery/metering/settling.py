"""Reservations of running tasks under limits with meters, and their settling.

An admitted call counted its estimate under each limit (its :func:`~.costs.share`); the pool
process keeps what each limit counted until the body ends (:class:`Reservations`, by task id).
A body that calls :func:`governor.celery.settle` settles them: per limit with meters, one
:meth:`~governor.Limiter.settle` of the units the limit counted, by the reservation's slot and
estimate (what was not used goes back to its window, use beyond the estimate is charged now).

- Once: a reservation is named ``<task id>:<retries>:<waits>``, so a second settle of the same
  admission (twice in a body, or a redelivered copy of the message) changes nothing, while a
  retry or a run after a governance wait, which reserved afresh, settles its own.
- A lease: after ``governor_settle_within`` seconds the estimate stands; never settled, it
  stands too (the limiter's lease; see docs/token-quotas.md).
- After a :class:`~governor.celery.Backoff` the upstream refused the call: its reservation is
  settled as unused, before the upstream's counters are folded in (:mod:`.sync`).

Totals per limit and meter (reserved, settled, refunded, overrun) and the uses of learned
estimates are written by one script call after the settles (:mod:`.learned`), or at the end of
a body that never settled (what it reserved).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery import signals as celery_signals
from redis.exceptions import RedisError

from ...costs import Cost
from ...decision import Decision, Settled
from ...errors import CostError, GovernorError
from ...limiter import Limiter
from .. import signals
from ..patches import receive_late
from ..types import Call, Held, LimitSpec
from .costs import share
from .learned import Learning, use_ppm

__all__ = ["Reservation", "Reservations", "meter_units"]

logger = logging.getLogger("governor.celery")

MEMORY = 10_000
"""Running tasks' reservations a process keeps at most (a body ends and drops its own)."""


@dataclass(slots=True)
class Reservation:
    """What one admitted call reserved under its limits with meters."""

    task: Any
    request: Any
    id: str
    """``<task id>:<retries>:<waits>``: one admission."""
    cost: Cost
    learned: Mapping[str, int]
    """Meters whose units were learned: their default (uses are learned against it)."""
    held: list[tuple[Limiter, LimitSpec, Decision]]
    settled: bool = False
    results: dict[str, Settled] = field(default_factory=dict)


def meter_units(lim: Limiter, cost: Cost) -> dict[str, int]:
    """Units per meter ``lim`` counted for a call of ``cost``."""
    part = share(lim, cost)
    if isinstance(part, int):
        return {m: part for m in lim.meters}
    return {m: int(part.get(m, 0)) for m in lim.meters}


def _per_meter(lim: Limiter, spec: LimitSpec, numbers: tuple[int, ...]) -> dict[str, int]:
    """Per-rule numbers of a settle, per meter: the largest over the meter's rules."""
    out: dict[str, int] = {}
    index = 0
    for meter, rules in spec.config.meters:
        out[meter] = max(numbers[index : index + len(rules)], default=0)
        index += len(rules)
    return out


class Reservations:
    """The reservations of the tasks running in one process."""

    def __init__(self, learning: Learning) -> None:
        self.learning = learning
        self._lock = threading.Lock()
        self._by_task: dict[str, Reservation] = {}
        self._listening = False

    def _listen(self) -> None:
        """Forget each body's reservation when it ends, from the first one this process keeps
        on (a ``task_postrun`` receiver costs every task a dispatch: only where meters are)."""
        if not self._listening:
            self._listening = True
            receive_late(
                celery_signals.task_postrun, self._task_done, f"governor.settling.{id(self)}"
            )

    def _task_done(self, sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        self.done(task_id)

    def keep(self, call: Call, held: Held) -> None:
        """An admitted call: keep what its limits with meters counted."""
        for lim, _, _ in held:
            if lim.meters:
                break
        else:
            return  # the usual call: no meters, nothing to keep
        metered = [(lim, spec, d) for lim, spec, d in held if lim.meters and d.slot is not None]
        if not metered:
            return
        request = call.request
        retries = getattr(request, "retries", 0) or 0
        reservation = Reservation(
            call.task,
            request,
            f"{request.id}:{retries}:{call.state.waits}",
            call.cost,
            call.learned or {},
            metered,
        )
        self._listen()
        with self._lock:
            if len(self._by_task) >= MEMORY:
                self._by_task.pop(next(iter(self._by_task)))
            self._by_task[request.id] = reservation
        signals.units_reserved.send(
            sender=call.task,
            request=request,
            reserved={spec.label: meter_units(lim, call.cost) for lim, spec, _ in metered},
        )

    def of(self, task_id: str | None) -> Reservation | None:
        with self._lock:
            return self._by_task.get(task_id or "")

    def settle(self, task_id: str | None, used: Mapping[str, Any]) -> dict[str, Settled]:
        """Settle the reservation of the running task ``task_id`` with ``used`` (units per meter;
        a meter left out, or None, was used as estimated). Per limit label, what settling did;
        empty when the task reserved nothing under meters (or settled already). Redis away: the
        estimates stand (a warning). Bad units raise :class:`CostError`."""
        reservation = self.of(task_id)
        if reservation is None:
            return {}
        used = {m: v for m, v in used.items() if v is not None}
        for meter, units in used.items():
            if isinstance(units, bool) or not isinstance(units, int) or units < 0:
                raise CostError(f"settle: {meter}={units!r} is not a count of units")
        with self._lock:
            if reservation.settled:
                return dict(reservation.results)
            reservation.settled = True
        totals: dict[str, int] = {}
        out: dict[str, Settled] = {}
        reported: dict[str, int] = {}
        for lim, spec, d in reservation.held:
            estimate = meter_units(lim, reservation.cost)
            mine = {m: u for m, u in used.items() if m in estimate}
            if not mine:
                continue  # nothing said of this limit's meters: its estimate stands
            assert d.slot is not None  # kept only with one (see keep)
            try:
                result = lim.settle(
                    spec.subject, d.slot, mine, estimate=estimate, id=reservation.id
                )
            except (GovernorError, RedisError) as exc:
                if isinstance(exc, CostError):
                    raise
                logger.warning("governor: %s not settled, its estimate stands: %r", spec.label, exc)
                continue
            out[spec.label] = result
            reported.update(mine)
            if result.status != "settled":
                continue
            back = _per_meter(lim, spec, result.given_back)
            over = _per_meter(lim, spec, result.charged)
            for meter, est in estimate.items():
                got = mine.get(meter, est)
                add = {
                    "reserved": est,
                    "settled": got,
                    "refunded": back[meter],
                    "overrun": over[meter],
                    "calls": 1,
                }
                for what, units in add.items():
                    field_ = f"{meter}|{what}|{spec.label}"
                    totals[field_] = totals.get(field_, 0) + units
            signals.task_settled.send(
                sender=reservation.task,
                request=reservation.request,
                limit=spec.label,
                reserved=estimate,
                settled={m: mine.get(m, e) for m, e in estimate.items()},
                refunded=back,
                overrun=over,
            )
        reservation.results = out
        uses: dict[tuple[str, str], int | None] = {}
        for meter, default in reservation.learned.items():
            if meter in reported:
                uses[(reservation.task.name, meter)] = use_ppm(reported[meter], default)
        self._record(totals, {k: v for k, v in uses.items() if v is not None})
        return out

    def done(self, task_id: str | None) -> None:
        """The body of ``task_id`` ended: forget its reservation; one it never settled is
        counted as reserved and unsettled in the totals."""
        if not self._by_task:  # the usual case: nothing kept (a read of a dict is atomic)
            return
        with self._lock:
            reservation = self._by_task.pop(task_id or "", None)
        if reservation is None or reservation.settled:
            return
        totals: dict[str, int] = {}
        for lim, spec, _ in reservation.held:
            for meter, est in meter_units(lim, reservation.cost).items():
                totals[f"{meter}|reserved|{spec.label}"] = est
                totals[f"{meter}|unsettled|{spec.label}"] = 1
        self._record(totals, {})

    def _record(self, totals: dict[str, int], uses: dict[tuple[str, str], int | None]) -> None:
        if not totals and not uses:
            return
        try:
            self.learning.record(totals, uses)
        except (GovernorError, RedisError) as exc:
            logger.debug("governor: metering totals not written: %r", exc)
