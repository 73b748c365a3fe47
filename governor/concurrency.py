"""Concurrency caps: at most N holders of a subject at once, across processes and machines.

>>> warehouse = Concurrency(redis.Redis(), 5, name="warehouse")
>>> with warehouse.hold("export") as permit:        # waits for a slot, woken by Redis
...     run_export(fence=permit.fence)
>>> permit = warehouse.acquire("export", timeout=10)  # or by hand (None: timed out)
>>> permit.release()

A slot is a lease held by one holder, not a count: while held, a thread of this process renews
it every third of its ``lease`` (30 s); a holder that dies stops renewing and its slot is
freed when the lease lapses, for the oldest waiter. A waiter does not poll: the script that
frees a slot hands it to the oldest waiter and pushes to that waiter's own list, on which it
blocks (``BLPOP``). A holder whose renewals fail until its lease is over may have lost the slot
to another: :attr:`Permit.lost` turns True (and ``on_lost`` is called), :meth:`Permit.check`
raises :class:`~governor.errors.SlotLost`, and the fencing token :attr:`Permit.fence` lets a
downstream system refuse a stale holder. Redis's clock decides when a lease ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .caps import holder_text, new_token
from .decision import CapUsage, Hold
from .errors import GovernorError, GovernorTimeout, SlotLost, StorageUnavailable
from .keys import Subject, subject_text
from .limiter import Limiter
from .pids import pid

__all__ = ["Concurrency", "Permit", "Renewer", "renewer"]

logger = logging.getLogger("governor")
Handed = tuple[tuple[str, str], ...]
WAIT_CHUNK = 30.0
"""A blocked waiter re-arms its BLPOP at least this often (seconds)."""
LAPSE_MARGIN = 0.02
"""A waiter looks again this long (seconds) after the earliest holder's lease would end."""


class Permit:
    """A concurrency slot held: :meth:`release` it (or leave the ``with`` block)."""

    def __init__(
        self,
        limiter: Any,
        subject: Subject,
        hold: Hold,
        *,
        on_lost: Callable[[Permit], None] | None = None,
    ) -> None:
        self.limiter = limiter
        self.subject = subject_text(subject)
        self.hold = hold
        self.on_lost = on_lost
        self.lost = False
        """True once the slot may have gone to another holder (its renewals failed for a whole
        lease, or Redis said it is no longer held)."""
        self.released = False
        self.ended = False
        """True once the body it was taken for ended and it only lingers for the next task of
        the process (``governor.celery.decisions.carried``): losing it then lets nothing run
        over the cap, so it is logged plainly, without ``on_lost``."""
        self.renewed_at = time.monotonic()
        """Monotonic time of the last renewal (or the acquisition) Redis confirmed."""
        self.retry_at: float | None = None
        """When a renewal that failed is tried again (monotonic), or None."""

    @property
    def holder(self) -> str:
        return self.hold.holder

    @property
    def fence(self) -> int:
        """A fencing token, larger than every one given before for this subject."""
        return self.hold.fence

    @property
    def deadline(self) -> float:
        """Monotonic time the lease ends unless renewed."""
        return self.renewed_at + self.hold.lease

    def check(self) -> None:
        """Raise SlotLost if the slot may have gone to another holder."""
        if self.lost:
            raise SlotLost(
                f"concurrency slot of {self.holder!r} on {self.limiter.name}:{self.subject} "
                "was lost (its lease lapsed without renewal)"
            )

    def mark_lost(self, why: str) -> None:
        if self.lost or self.released:
            return
        self.lost = True
        if self.ended:
            logger.info(
                "governor: the lingering slot of %s on %s:%s (its task ended) is gone: %s",
                self.holder,
                self.limiter.name,
                self.subject,
                why,
            )
            return
        logger.error(
            "governor: concurrency slot of %s on %s:%s lost: %s; another holder may run",
            self.holder,
            self.limiter.name,
            self.subject,
            why,
        )
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:  # a callback must not stop the renewals of others
                logger.exception("governor: on_lost callback failed")

    def renew(self) -> bool:
        """Extend the lease now; False (and :attr:`lost`) if the slot is no longer held."""
        sent = time.monotonic()
        if self.limiter.renew(self.subject, self.hold):
            self.renewed_at, self.retry_at = sent, None
            return True
        self.mark_lost("it is no longer held in Redis")
        return False

    def release(self) -> tuple[bool, Handed]:
        """Give the slot back (once; later calls do nothing): (released, waiters handed it).
        False when it was no longer held."""
        if self.released:
            return False, ()
        self.released = True
        renewer().forget(self)
        released, handed = self.limiter.release(self.subject, self.hold)
        return bool(released), handed

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return f"<Permit {self.holder} on {self.limiter.name}:{self.subject} {state}>"


class Renewer:
    """Renews the permits of one process from a daemon thread, each every third of its lease."""

    def __init__(self) -> None:
        self._pid = pid()
        self._cond = threading.Condition()
        self._permits: set[Permit] = set()
        self._thread: threading.Thread | None = None
        self._wake_at = -math.inf
        """When the thread, waiting, wakes next (monotonic); -inf while it is not waiting."""

    def add(self, permit: Permit) -> None:
        with self._cond:
            self._permits.add(permit)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="governor-renewer", daemon=True
                )
                self._thread.start()
            if self._due(permit) < self._wake_at:  # else it wakes in time anyway: a slot
                self._cond.notify()  # taken per task would wake it per task for nothing

    def forget(self, permit: Permit) -> None:
        with self._cond:
            self._permits.discard(permit)

    def held(self) -> list[Permit]:
        with self._cond:
            return list(self._permits)

    @staticmethod
    def _due(permit: Permit) -> float:
        if permit.retry_at is not None:
            return permit.retry_at
        return permit.renewed_at + permit.hold.lease / 3

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [p for p in self._permits if self._due(p) <= now]
                if not due:
                    nxt = min((self._due(p) for p in self._permits), default=now + 60.0)
                    self._wake_at = max(now + 0.01, nxt)
                    self._cond.wait(timeout=self._wake_at - now)
                    self._wake_at = -math.inf
                    continue
            for permit in due:
                self._renew(permit)

    def _renew(self, permit: Permit) -> None:
        if permit.released:
            return
        try:
            if not permit.renew():
                self.forget(permit)
        except (GovernorError, RedisError) as exc:  # Redis away: try again, but say so once
            if time.monotonic() >= permit.deadline:
                permit.mark_lost(f"its lease ran out while Redis was unreachable ({exc})")
            else:
                logger.warning("governor: renewing %r failed, retrying: %r", permit, exc)
            permit.retry_at = time.monotonic() + min(1.0, permit.hold.lease / 10)


_renewer: Renewer | None = None
_renewer_lock = threading.Lock()


def renewer() -> Renewer:
    """This process's renewer (a forked child gets its own)."""
    global _renewer
    found = _renewer
    if found is not None and found._pid == pid():  # (every slot taken and given back asks)
        return found
    with _renewer_lock:
        if _renewer is None or _renewer._pid != pid():
            _renewer = Renewer()
        return _renewer


class Concurrency:
    """At most ``limit`` holders of each subject at once, shared through Redis.

    ``client`` is any redis-py client (``Redis``, ``RedisCluster``, a Sentinel master);
    ``lease`` is how long a slot outlives its holder's last renewal (seconds). ``on_lost`` is
    called with a permit whose slot may have gone to another holder.
    """

    def __init__(
        self,
        client: Any,
        limit: int,
        *,
        name: str,
        prefix: str = "governor",
        lease: float = 30.0,
        on_lost: Callable[[Permit], None] | None = None,
    ) -> None:
        self.limiter = Limiter(
            client, None, concurrency=limit, lease=lease, name=name, prefix=prefix
        )
        self.on_lost = on_lost

    @property
    def name(self) -> str:
        return self.limiter.name

    @property
    def limit(self) -> int:
        assert self.limiter.cap is not None
        return self.limiter.cap.limit

    def __repr__(self) -> str:
        return f"<Concurrency {self.name!r} {self.limit}>"

    def acquire(
        self,
        subject: Subject,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        holder: str | None = None,
        info: str = "",
    ) -> Permit | None:
        """Take a slot, waiting in line for one if ``blocking`` (at most ``timeout`` seconds).
        None when none was free (not blocking), the wait timed out, or another caller with the
        same ``holder`` id held the slot while this one waited and has finished (the work that
        id names is done)."""
        holder = holder_text(holder) if holder is not None else f"p-{new_token()}"
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        queued = False
        try:
            while True:
                d = self.limiter.acquire(subject, holder=holder, info=info)
                self._passed_on(d.handed)
                if d.allowed and d.hold is not None:
                    queued = False
                    return self._permit(subject, d.hold)
                if not blocking or d.capped == "done":
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                if d.capped is None:  # a manual block: it ends at a known moment
                    time.sleep(min(d.retry_after, left if left is not None else d.retry_after))
                    continue
                # in line (again: a place lost to a lapse is taken anew), or behind a running
                # holder with the same id: woken by Redis when a slot is handed to it
                w = self.limiter.wait(subject, holder)
                self._passed_on(w.handed)
                queued = w.status == "queued"
                if w.status == "done":
                    return None
                if queued:  # a holder that died frees its slot when its lease ends: look then
                    self._block(subject, holder, left, d.retry_after)
        finally:
            if queued:  # timed out, or interrupted: leave the line (a slot handed over goes on)
                with contextlib.suppress(GovernorError, RedisError):
                    self._passed_on(self.limiter.cancel(subject, holder)[1])

    @contextlib.contextmanager
    def hold(
        self,
        subject: Subject,
        *,
        timeout: float | None = None,
        holder: str | None = None,
        info: str = "",
    ) -> Iterator[Permit]:
        """``with cap.hold(subject) as permit:`` a slot for the block (GovernorTimeout if none
        came within ``timeout``)."""
        permit = self.acquire(subject, timeout=timeout, holder=holder, info=info)
        if permit is None:
            raise GovernorTimeout(
                f"no concurrency slot of {self.name}:{subject_text(subject)} within {timeout}s"
            )
        try:
            yield permit
        finally:
            permit.release()

    def holders(self, subject: Subject) -> CapUsage:
        """Who holds the subject's slots, and how many wait."""
        return self.limiter.holders(subject)

    def _permit(self, subject: Subject, hold: Hold) -> Permit:
        permit = Permit(self.limiter, subject, hold, on_lost=self.on_lost)
        renewer().add(permit)
        return permit

    def _block(self, subject: Subject, holder: str, left: float | None, lapse: float) -> None:
        """Wait on this waiter's own list until a slot is handed to it (or ``left`` passes)."""
        chunk = min(WAIT_CHUNK, lapse + LAPSE_MARGIN, WAIT_CHUNK if left is None else left)
        chunk = max(0.01, chunk)  # (0 would block for ever)
        timeout = _socket_timeout(self.limiter.client)
        if timeout is not None:
            chunk = min(chunk, max(0.05, timeout - 0.25))
        try:
            self.limiter.client.blpop([self.limiter.wake_key(subject, holder)], timeout=chunk)
        except RedisTimeoutError:
            pass  # the socket timed out first: look again
        except RedisError as exc:
            raise StorageUnavailable(
                f"Redis did not answer a waiter on {self.name}: {exc}"
            ) from exc

    def _passed_on(self, handed: Handed) -> None:
        if handed:  # Celery tasks waiting on the same cap: the worker's sweeper re-publishes
            logger.debug("governor: slots of %s handed to queued tasks %s", self.name, handed)


def _socket_timeout(client: Any) -> float | None:
    pool = getattr(client, "connection_pool", None)
    value = getattr(pool, "connection_kwargs", {}).get("socket_timeout") if pool else None
    return float(value) if value else None
