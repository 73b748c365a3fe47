"""Admissions a pool process takes a few at a time, under limits with plenty of room.

Under a generous limit (a queue quota far above what the workers run), every task would still
pay one Redis round trip before its body. Instead, once a limit has shown plenty of room, the
pool process asks for a few units more than the task needs (:meth:`Limiter.lease`): they are
counted at once, as a booking whose slot is now and that may start up to
``governor_lease_span`` seconds later, and the next tasks of this process under the same limits
take them without asking Redis. The rules hold on actual start times, as they do for bookings;
the local deadline is taken before the request is sent, so it ends no later than the span
Redis counted.

How many: 2 at first, then twice what the previous lease held when it was used up in time, or
what it used when it was not; never more than 64, nor more than a sixteenth of the room the
limit reported, so with less than 32 units of room no lease is taken and every task asks Redis.
Units left when a lease is dropped are given back (the sliding log removes exactly those; gcra
keeps them counted, which only makes it stricter for a moment).

Only limits whose algorithm books (sliding_log, gcra), only for tasks that hold no bookings, and
only when every limit of the task holds a lease; otherwise the task asks Redis as usual.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from ..decision import Decision
from ..errors import GovernorError
from ..limiter import Limiter
from .decide import Held, Outcome
from .limits import LimitSpec

__all__ = ["Leases"]

logger = logging.getLogger("governor.celery")

FIRST = 2
MOST = 64
SHARE = 16
"""A lease takes at most 1/SHARE of the room the limit last reported."""
MARGIN = 0.005
"""The local deadline ends this long (seconds) before the span Redis counted."""
MEMORY = 10_000
"""Limits (limiter, subject) a process remembers the room of; past that it starts afresh."""


@dataclass(slots=True)
class _Lease:
    decision: Decision
    left: int
    until: float  # monotonic
    size: int  # units taken beyond the first task's


class Leases:
    """The leases of one process (threads share them)."""

    def __init__(self, span: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.span = span
        self.clock = clock
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # keyed by (limiter, subject): a limiter hashes by identity (quick), and the keys keep
        # it alive, so its identity is never reused by another
        self._held: dict[tuple[Limiter, str], _Lease] = {}
        self._room: dict[tuple[Limiter, str], int] = {}
        self._next: dict[tuple[Limiter, str], int] = {}
        self._swept = 0.0

    def _mine(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's leases are the parent's
            self._held, self._room, self._next = {}, {}, {}
            self._pid = os.getpid()

    def take(self, limiters: list[tuple[Limiter, LimitSpec]], cost: int) -> Outcome | None:
        """Admit from leases this process holds for every limit, or None."""
        if self.span <= 0:
            return None
        now = self.clock()
        with self._lock:
            self._mine()
            leases = []
            for lim, spec in limiters:
                lease = self._held.get((lim, spec.subject))
                if lease is None or lease.left < cost or now >= lease.until:
                    return None
                leases.append(lease)
            for lease in leases:
                lease.left -= cost
        held: Held = [(lim, spec, x.decision) for x, (lim, spec) in zip(leases, limiters)]
        return Outcome(True, held=held)

    def grant(self, limiters: list[tuple[Limiter, LimitSpec]], cost: int) -> Outcome | None:
        """Admit this task with a new lease from every limit (one call per limit), or None
        when a limit has too little room (the caller then decides as usual)."""
        if self.span <= 0 or not all(lim.algorithm.books for lim, _ in limiters):
            return None
        now = self.clock()
        with self._lock:
            self._mine()
            keys = [(lim, spec.subject) for lim, spec in limiters]
            dropped = [(key, self._drop(key)) for key in keys]  # spent, expired or partial
            if now >= self._swept + self.span:  # and every other expired one
                self._swept = now
                expired = [key for key, lease in self._held.items() if lease.until <= now]
                dropped += [(key, self._drop(key)) for key in expired]
            sizes = [
                min(self._next.get(key, FIRST), MOST, self._room.get(key, 0) // SHARE)
                for key in keys
            ]
        for (lim, subject), lease in dropped:
            if lease is not None:
                _give_back(lim, subject, lease.decision, lease.left)
        if min(sizes) < FIRST:
            return None
        taken: list[tuple[Limiter, LimitSpec, Decision, float]] = []
        try:
            for (lim, spec), size in zip(limiters, sizes):
                sent = self.clock()
                d = lim.lease(spec.subject, cost + size, span=self.span)
                self._note_room((lim, spec.subject), d.remaining)
                if not d.allowed:
                    break
                taken.append((lim, spec, d, sent))
        finally:
            if len(taken) < len(limiters):  # denied, or Redis failed: all of it, none was used
                for lim, spec, d, _ in taken:
                    _give_back(lim, spec.subject, d, d.cost)
        if len(taken) < len(limiters):
            return None
        replaced = []
        with self._lock:
            for (lim, spec, d, sent), size in zip(taken, sizes):
                old = self._held.get((lim, spec.subject))
                if old is not None:  # another thread's, granted meanwhile
                    replaced.append((lim, spec.subject, old))
                self._held[lim, spec.subject] = _Lease(d, size, sent + self.span - MARGIN, size)
        for lim, subject, old in replaced:
            _give_back(lim, subject, old.decision, old.left)
        return Outcome(True, now=taken[-1][2].now, held=[(lim, s, d) for lim, s, d, _ in taken])

    def _drop(self, key: tuple[Limiter, str]) -> _Lease | None:
        """Forget a spent or expired lease and size the next one after it (lock held)."""
        lease = self._held.pop(key, None)
        if lease is not None:
            used = lease.size - lease.left
            self._next[key] = min(MOST, 2 * lease.size) if lease.left == 0 else max(FIRST, used)
        return lease

    def observe(self, held: Held) -> None:
        """Remember the room the limits reported (after a decision made without a lease)."""
        if self.span > 0:
            for lim, spec, d in held:
                self._note_room((lim, spec.subject), d.remaining)

    def _note_room(self, key: tuple[Limiter, str], room: int) -> None:
        # Only room enough to lease from is kept: per-key limits may see endless subjects.
        if room < FIRST * SHARE:
            self._room.pop(key, None)
            return
        if len(self._room) >= MEMORY:
            self._room.clear()
            self._next.clear()
        self._room[key] = room

    def release(self) -> None:
        """Give back what the leases of this process still hold (worker shutdown)."""
        with self._lock:
            self._mine()
            held, self._held = self._held, {}
        for (lim, subject), lease in held.items():
            _give_back(lim, subject, lease.decision, lease.left)


def _give_back(lim: Limiter, subject: str, lease: Decision, units: int) -> None:
    """Refund units of a lease that will not be used. The sliding log takes back any of them,
    gcra only a whole lease that is still its newest; what is not taken back stays counted,
    which only makes the limit stricter for a moment, so a failure is no reason to fail a task.
    """
    if units <= 0 or (lim.algorithm.name != "sliding_log" and units != lease.cost):
        return
    try:
        lim.refund(subject, lease, units)
    except (GovernorError, RedisError) as exc:
        logger.debug("governor: leased units of %s not given back: %r", subject, exc)
