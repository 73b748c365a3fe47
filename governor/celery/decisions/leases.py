"""Admissions a pool process takes a few at a time, under limits with plenty of room.

Under a generous limit (a queue quota far above what the workers run), every task would still
pay one Redis round trip before its body. Instead, once a limit has shown plenty of room, the
pool process asks for a few units more than the task needs (:meth:`Limiter.lease`): they are
counted at once, as a booking whose slot is now and that may start up to a span later, and the
next tasks of this process under the same limit take them without asking Redis. The rules hold
on actual start times, as they do for bookings; the local deadline is taken before the request
is sent, so it ends no later than the span Redis counted.

The span is ``governor_lease_span`` (0.2 s), at most a sixteenth of the limit's shortest window
(a lease counts a little ahead of now, so it weighs on a window for a little longer); a limit
whose shortest window would give less than 20 ms is not leased from.

How many: room for 2 more tasks at first, then twice as many while a lease is used up in time,
or what was used when it was not; never more than 64 tasks' worth, nor more than a sixteenth of
the room the limit last reported (gcra: counting what the span itself takes), so with little
room every task asks Redis and a limit that fills up stops leasing by itself.

Units not used are given back when their lease is dropped: at the next lease of this process
and, for a process gone idle, by a sweeper thread a span after the lease ends (it looks at most
every ``SWEEP_EVERY``, 0.25 s); also at worker shutdown.
The sliding log takes back exactly those units; gcra only a whole lease that is still its
newest, otherwise they stay counted until its schedule catches up.

Only limits whose algorithm books (sliding_log, gcra), and only for tasks that hold no bookings;
a per-key limit leases per subject, a fair limit only while the process has not seen its fair
queue in use (the gate sends its calls there first; a lease is counted now and starts within its
span, so it books nothing ahead).
A call that also has concurrency caps (caps alone, no rates of their own) takes its rates from
leases and asks Redis only for the caps' slots (a slot cannot be leased); when a cap is full,
the units go back to the leases (:meth:`AdmissionLeases.untake`).
A task whose limits do not all hold a lease with room for it leases the missing ones (keeping
those it holds), or, when a limit has too little room, asks Redis as usual.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from redis.exceptions import RedisError

from ...decision import Decision
from ...errors import GovernorError
from ...limiter import Limiter
from ...pids import pid
from ..types import Held, LimitSpec, Outcome

__all__ = ["AdmissionLeases"]

logger = logging.getLogger("governor.celery")

FIRST = 2
"""A first lease has room for this many more tasks."""
MOST = 64
"""A lease has room for at most this many more tasks."""
SHARE = 16
"""A lease takes at most 1/SHARE of the room the limit last reported, and its span is at most
1/SHARE of the limit's shortest window."""
SHORTEST = 0.02
"""Spans shorter than this (seconds) are not worth a lease."""
MARGIN = 0.005
"""The local deadline ends this long (seconds) before the span Redis counted."""
SWEEP_EVERY = 0.25
"""The sweeper looks for expired leases at most this often (seconds)."""
MEMORY = 10_000
"""Limits (limiter, subject) a process remembers the room of; past that it starts afresh."""

Key = tuple[Limiter, str]


@dataclass(slots=True)
class _Lease:
    decision: Decision  # the lease itself: what giving back refers to (never refund it whole)
    left: int
    until: float  # monotonic
    size: int  # units taken beyond the first task's


def _usable(lease: _Lease | None, cost: int, now: float) -> TypeGuard[_Lease]:
    """Whether a lease can admit a task of ``cost`` at ``now`` (monotonic)."""
    return lease is not None and lease.left >= cost and now < lease.until


class AdmissionLeases:
    """The leases of one process (threads share them)."""

    def __init__(self, span: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.span = span
        self.clock = clock
        self._pid = -1
        self._mine()

    def _mine(self) -> None:
        """Fresh state in a new process (a forked child does not inherit the parent's)."""
        if self._pid != pid():
            self._pid = pid()
            self._lock = threading.Lock()
            # keyed by (limiter, subject): a limiter hashes by identity (quick), and the keys
            # keep it alive, so its identity is never reused by another
            self._held: dict[Key, _Lease] = {}
            self._room: dict[Key, int] = {}
            self._next: dict[Key, int] = {}
            self._wake = threading.Condition(self._lock)
            self._due: float | None = None  # when the sweeper looks next (clock time)
            self._sweeper: threading.Thread | None = None

    def span_of(self, lim: Limiter) -> float:
        """The span of a lease from ``lim``; 0 when it takes no leases."""
        span = min(self.span, min(r.period_us for r in lim.rules) / 1e6 / SHARE)
        return span if span >= SHORTEST and lim.algorithm.books and lim.cap is None else 0.0

    def use(self, limiters: list[tuple[Limiter, LimitSpec]], cost: int) -> bool:
        """Admit from leases this process holds for every limit: :meth:`take` for a caller
        that needs no :class:`Outcome` (the gate's usual admission)."""
        return self._use(limiters, cost) is not None

    def take(self, limiters: list[tuple[Limiter, LimitSpec]], cost: int) -> Outcome | None:
        """Admit from leases this process holds for every limit, or None."""
        leases = self._use(limiters, cost)
        if leases is None:
            return None
        # the decisions are the leases' own: they are never refunded for this task (the units
        # it took are used; what a lease has left goes back when it is dropped)
        held: Held = [(lim, spec, x.decision) for x, (lim, spec) in zip(leases, limiters)]
        return Outcome(True, held=held)

    def _use(self, limiters: list[tuple[Limiter, LimitSpec]], cost: int) -> list[_Lease] | None:
        if self.span <= 0:
            return None
        self._mine()
        with self._lock:
            now = self.clock()
            if len(limiters) == 1:  # the usual lane: one limit (a queue's or a task's quota)
                lim, spec = limiters[0]
                lease = self._held.get((lim, spec.subject))
                if not _usable(lease, cost, now):
                    return None
                lease.left -= cost
                return [lease]
            leases = []
            for lim, spec in limiters:
                lease = self._held.get((lim, spec.subject))
                if not _usable(lease, cost, now):
                    return None
                leases.append(lease)
            for lease in leases:
                lease.left -= cost
        return leases

    def untake(self, limiters: list[tuple[Limiter, LimitSpec]], cost: int) -> None:
        """Give the units :meth:`take` or :meth:`grant` just gave a task back to the leases it
        took them from: the task did not start (a full concurrency cap turned it away). A
        lease replaced meanwhile gets them back only up to what its own decision counted; one
        given back meanwhile keeps them counted (stricter, never looser)."""
        self._mine()
        with self._lock:
            for lim, spec in limiters:
                lease = self._held.get((lim, spec.subject))
                if lease is not None:
                    lease.left = min(lease.left + cost, lease.decision.cost)

    def grant(self, limiters: list[tuple[Limiter, LimitSpec]], cost: int) -> Outcome | None:
        """Admit this task from the leases it holds and new leases for the limits it holds
        none for (one call per new lease), or None when a limit has too little room (the
        caller then decides as usual)."""
        if self.span <= 0:
            return None
        self._mine()
        spans = [self.span_of(lim) for lim, _ in limiters]
        if min(spans) <= 0:
            return None
        keys = [(lim, spec.subject) for lim, spec in limiters]
        with self._lock:
            now = self.clock()
            kept: dict[Key, _Lease] = {}
            dropped = []
            for key in keys:
                lease = self._held.get(key)
                if _usable(lease, cost, now):
                    kept[key] = lease
                else:
                    dropped.append((key, self._drop(key)))
            sizes = {key: self._size(key, cost) for key in keys if key not in kept}
            roomy = all(sizes.values())  # else no lease at all; the kept ones stay as they are
            if roomy:
                for lease in kept.values():
                    lease.left -= cost
        self._give_back(dropped)
        if not roomy:
            return None
        decisions: dict[Key, Decision] = {key: lease.decision for key, lease in kept.items()}
        new: list[tuple[Key, Decision, float, float]] = []
        try:
            for (lim, spec), key, span in zip(limiters, keys, spans):
                if key in kept:
                    continue
                sent = self.clock()
                d = lim.lease(spec.subject, cost + sizes[key], span=span)
                if not d.allowed:
                    self._room.pop(key, None)  # ask Redis again before the next lease
                    break
                self._note_room(key, d.remaining)
                new.append((key, d, sent, span))
                decisions[key] = d
        finally:
            if len(decisions) < len(keys):  # denied, or Redis failed: all of it, none was used
                self._give_back([(key, _Lease(d, d.cost, 0.0, 0)) for key, d, _, _ in new])
                with self._lock:
                    for lease in kept.values():
                        lease.left += cost
        if len(decisions) < len(keys):
            return None
        replaced = []
        with self._lock:
            for key, d, sent, span in new:
                old = self._held.get(key)
                if old is not None:  # another thread's, granted meanwhile
                    replaced.append((key, old))
                self._held[key] = _Lease(d, sizes[key], sent + span - MARGIN, sizes[key])
            self._arm()
        self._give_back(replaced)
        held: Held = [(lim, spec, decisions[key]) for (lim, spec), key in zip(limiters, keys)]
        return Outcome(True, now=new[-1][1].now if new else None, held=held)

    def _size(self, key: Key, cost: int) -> int:
        """Units a new lease takes beyond the task's, whole tasks' worth; 0: no lease (lock
        held)."""
        lim = key[0]
        room = self._room.get(key, 0)
        if lim.algorithm.name == "gcra":  # a gcra lease also spends what its span covers
            room -= round(self.span_of(lim) * max(r.limit / r.period_us for r in lim.rules) * 1e6)
        tasks = min(max(self._next.get(key, 0) // cost, FIRST), MOST, room // SHARE // cost)
        return tasks * cost if tasks >= FIRST else 0

    def _drop(self, key: Key) -> _Lease | None:
        """Forget a lease and size the next one after it (lock held)."""
        lease = self._held.pop(key, None)
        if lease is not None:
            used = max(0, lease.size - lease.left)  # (untake may leave more than its size)
            self._next[key] = 2 * lease.size if lease.left == 0 else used
        return lease

    def _note_room(self, key: Key, room: int) -> None:
        # Only room enough to lease from is kept: per-key limits may see endless subjects.
        if room < FIRST * SHARE:
            self._room.pop(key, None)
            return
        if len(self._room) >= MEMORY:
            self._room.clear()
            self._next.clear()
        self._room[key] = room

    def roomy(self, lim: Limiter, subject: str) -> bool:
        """Whether ``lim`` last reported plenty of room for ``subject`` (enough to lease
        from: see :meth:`observe`)."""
        return (lim, subject) in self._room

    def observe(self, held: Held) -> None:
        """Remember the room the limits reported (after a decision made without a lease)."""
        if self.span > 0:
            for lim, spec, d in held:
                self._note_room((lim, spec.subject), d.remaining)

    # -- giving back --------------------------------------------------------------------------

    def _arm(self, not_before: float = 0.0) -> None:
        """Have expired leases given back a span after the first ends, should this process go
        idle (lock held). One sweeper thread per process waits for that moment (a thread
        started for each lease would cost more CPU than the tasks it leases for), and looks at
        most every :data:`SWEEP_EVERY` seconds: while the process is busy its leases are
        replaced, and given back, by the next grants."""
        if not self._held or self._due is not None:
            return
        self._due = max(min(x.until for x in self._held.values()) + self.span, not_before)
        self._wake.notify()
        if self._sweeper is None:
            self._sweeper = threading.Thread(
                target=self._sweeping, name="governor-lease-sweeper", daemon=True
            )
            self._sweeper.start()

    def _sweeping(self) -> None:
        lock, wake = self._lock, self._wake  # this process's (a fork makes new ones)
        while True:
            with lock:
                while self._due is None or self._due > self.clock():
                    wake.wait(None if self._due is None else self._due - self.clock())
            self.sweep()

    def sweep(self) -> None:
        """Give back what expired leases did not use."""
        self._mine()
        with self._lock:
            self._due = None
            now = self.clock()
            expired = [key for key, lease in self._held.items() if lease.until <= now]
            dropped = [(key, self._drop(key)) for key in expired]
            self._arm(now + SWEEP_EVERY)
        self._give_back(dropped)

    def release(self) -> None:
        """Give back what the leases of this process still hold (worker shutdown)."""
        self._mine()
        with self._lock:
            held, self._held = list(self._held.items()), {}
            self._due = None  # the sweeper waits until the next lease
        self._give_back(held)

    @staticmethod
    def _give_back(leases: Sequence[tuple[Key, _Lease | None]]) -> None:
        """Refund what leases did not use. The sliding log takes back any of it, gcra only a
        whole lease that is still its newest; what is not taken back stays counted, which
        only makes the limit stricter, so a failure never fails a task (and the rest are not
        tried: Redis is away)."""
        for (lim, subject), lease in leases:
            if lease is None or lease.left <= 0:
                continue
            if lim.algorithm.name != "sliding_log" and lease.left != lease.decision.cost:
                continue
            try:
                lim.refund(subject, lease.decision, lease.left)
            except (GovernorError, RedisError) as exc:
                logger.debug("governor: leased units of %s not given back: %r", subject, exc)
                return
