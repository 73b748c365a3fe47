"""Concurrency slots carried over to the next task of the same process, under a roomy cap.

A capped task gives its slot back when its body ends, and the next one takes a slot in its
decision: two scripts a task. Under a cap with plenty of room, a pool process instead keeps the
slot of a task that ended for up to :data:`LINGER` seconds, and its next task under the same cap
and subject gives it back in its own decision (``Limiter.acquire(give_back=...)``: in
``cap_decide.lua`` the old holder's release, exactly as a release would do it, then the new
holder's verdict, in one script). A busy process pays one script a capped task. A slot no task
took within the linger is given back by this process's carrier thread, which wakes every
:data:`LINGER` while any slot lingers (so a busy process is not woken per task).

What a cap means does not change: a lingering slot is counted (never more than N at once), it is
renewed like any slot until it is given back, the release is the one the body's end would have
made (its token checked; a copy of the task that asked or waits is dropped as done), a slot it
frees goes to the oldest waiter before the new holder is asked (a carried slot never passes the
line), and every task holds its own slot under its own holder id and fencing token. What
changes: a slot freed while no task of the process follows reaches others up to a linger (and
a tick) later, and a process killed in that moment leaves it to lapse after the slot lease (as
a process killed during a body does). Hence only under a cap that had at least a quarter of its
slots (and 4) free after the task's admission: nobody waits for such a cap. Only decisions that
take a slot now (``acquire``, the gate's usual admission from leases) give a slot back; a task
that books takes the long way, and the slot is given back by the carrier thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from ...concurrency import Permit, renewer
from ...errors import GovernorError
from ...limiter import Limiter
from ...pids import pid
from ..types import Handed, handed_by

__all__ = ["LINGER", "Carried", "roomy"]

logger = logging.getLogger("governor.celery")

LINGER = 0.02
"""Seconds a slot of an ended task waits for the process's next task under its cap."""

Key = tuple[Limiter, str]


def roomy(lim: Limiter, free: int) -> bool:
    """Whether a slot admitted with ``free`` slots left (at most: a capped limit with rules
    reports the lesser of its slots and its rules' room) may linger after its task: at least a
    quarter of the cap, and 4, free (so a cap of 4 or fewer never carries)."""
    cap = lim.cap
    return cap is not None and free >= max(4, cap.limit // 4)


class Carried:
    """The lingering slots of one process (threads share them), one per cap and subject."""

    def __init__(self, publish: Callable[[Handed], object], linger: float = LINGER) -> None:
        self.publish = publish
        """Sends the messages of waiters that a release handed a slot."""
        self.linger = linger
        self._pid = -1
        self._mine()

    def _mine(self) -> None:
        if self._pid != pid():  # a forked child does not inherit the parent's slots or thread
            self._pid = pid()
            self._lock = threading.Lock()
            self._wake = threading.Condition(self._lock)
            self._slots: dict[Key, tuple[Permit, float]] = {}
            self._ticking = False
            self._thread: threading.Thread | None = None

    def keep(self, permit: Permit) -> bool:
        """Keep the slot of a task that ended for the next task; False when one of this cap
        and subject lingers already (the caller gives this one back)."""
        if self.linger <= 0:
            return False
        self._mine()
        key = (permit.limiter, permit.subject)
        with self._lock:
            if key in self._slots:
                return False
            permit.ended = True
            self._slots[key] = (permit, time.monotonic() + self.linger)
            if not self._ticking:  # the thread waits for work: tell it (while it ticks, no)
                self._ticking = True
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="governor-slot-carrier", daemon=True
                    )
                    self._thread.start()
                else:
                    self._wake.notify()
        return True

    def holds(self, lim: Limiter, subject: str) -> bool:
        """Whether a slot of ``lim`` and ``subject`` lingers in this process."""
        self._mine()
        return (lim, subject) in self._slots

    def take(self, lim: Limiter, subject: str) -> Permit | None:
        """The slot lingering for ``lim`` and ``subject``, for a decision to give back (it is
        no longer renewed nor released here), or None."""
        self._mine()
        if not self._slots:
            return None
        with self._lock:
            found = self._slots.pop((lim, subject), None)
        if found is None:
            return None
        permit = found[0]
        permit.released = True  # given back by the decision
        renewer().forget(permit)
        return permit

    def failed(self, permit: Permit) -> None:
        """A decision that was to give ``permit`` back failed: give it back on its own (a
        release that finds it gone does nothing)."""
        permit.released = False
        self._give_back([permit])

    def release_all(self) -> None:
        """This process is leaving: give back every lingering slot."""
        self._mine()
        with self._lock:
            permits = [p for p, _ in self._slots.values()]
            self._slots.clear()
        self._give_back(permits)

    def _run(self) -> None:
        lock = self._lock
        while True:
            with lock:
                while not self._slots:
                    self._ticking = False
                    self._wake.wait()
            time.sleep(self.linger)
            now = time.monotonic()
            with lock:
                due = [key for key, (_, until) in self._slots.items() if until <= now]
                permits = [self._slots.pop(key)[0] for key in due]
            self._give_back(permits)

    def _give_back(self, permits: list[Permit]) -> None:
        """Release each slot and publish whom it went to. Never raises: the carrier thread
        must outlive any failure (a slot it stopped giving back would stay held, renewed)."""
        for permit in permits:
            try:
                _, handed = permit.release()
                self.publish(handed_by(permit.limiter, permit.subject, handed))
            except (GovernorError, RedisError) as exc:  # it lapses after the lease instead
                logger.warning(
                    "governor: could not release a slot of %s: %r", permit.limiter.name, exc
                )
            except Exception:
                logger.exception("governor: releasing a slot of %s failed", permit.limiter.name)
