"""The releaser: a thread in every worker's main process that re-publishes parked tasks when
they are nearly due (see :mod:`.parking` for what is parked and why), and sweeps concurrency
caps whose holders may have died while tasks wait in line (see :mod:`.cap_line`). The worker
starts it from :mod:`governor.celery.bootstep`.

A releaser *picks up* due entries: a pickup lapses after ``governor_release_lease`` seconds,
after which another releaser may pick them up again (see ``take_due.lua``). An entry it cannot
read, or that the broker refuses for good, goes to the dead letters (:mod:`.dead_letters`): kept
and counted, never taken again in a loop (a batch of them would hold up every other entry)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from .. import fork_guard, signals
from ..types import TRANSIENT
from . import dead_letters, parking
from .cap_line import CapSweeper
from .envelope import open_envelope

__all__ = ["Releaser"]

logger = logging.getLogger("governor.celery")


class Releaser:
    """Re-publishes parked tasks that are nearly due. One per worker (main process)."""

    def __init__(
        self,
        app: Any,
        client_factory: Callable[[], redis.Redis],
        prefix: str,
        horizon: float | None,
        interval: float = 1.0,
        pickup: float = 5.0,
        batch: int = 200,
        lead: float = 0.0,
        sweeper: CapSweeper | None = None,
        shards: int = 1,
    ) -> None:
        self.app = app
        self.client_factory = client_factory
        self.prefix = prefix
        self.horizon = horizon
        self.interval = interval
        self.pickup = pickup
        """Seconds a pickup of due tasks lasts (``governor_release_lease``)."""
        self.batch = batch
        self.lead = lead
        """Publish this long before the due time: a booked task arrives early (Settings.lead)."""
        self.sweeper = sweeper
        self.shards = shards
        """Parking shards to take from (``governor_parking_shards``)."""
        self.taken = 0
        """Entries the last :meth:`release_once` took (published or dead-lettered)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._round = threading.Lock()
        """Held through each round: a fork of the process waits for it (see .fork_guard)."""

    def release_once(self, now: float | None = None) -> int:
        """Take and publish what is due within the horizon; returns how many were published.
        ``now``: Unix seconds for tests (None: Redis's clock)."""
        if self.horizon is None:
            return 0
        client = self.client_factory()
        now, taken = parking.take_due(
            client, self.prefix, self.horizon, self.pickup, self.batch, self.shards, now
        )
        taken_at = time.monotonic()
        self.taken = len(taken)
        published = 0
        for parking_id, text in taken:
            try:
                sig, due, _env = open_envelope(self.app, text)
            except Exception as exc:  # unreadable: no use taking it again and again
                self._dead(client, parking_id, text, f"unreadable: {exc!r}")
                continue
            parking.stamp_release(sig, parking_id)
            # the Redis clock now: publishing a large batch takes a while
            elapsed = time.monotonic() - taken_at
            try:
                sig.apply_async(countdown=max(0.0, due - now - elapsed - self.lead))
            except TRANSIENT:
                raise  # the broker is away: what is left stays picked up, taken again later
            except Exception as exc:  # refused for good (say, an unknown serializer)
                self._dead(client, parking_id, text, f"cannot publish: {exc!r}")
                continue
            parking.forget_released(client, self.prefix, parking_id)
            published += 1
        if published:
            signals.task_released.send(sender=self, count=published, queue=None)
            logger.debug("governor: released %d parked tasks", published)
        return published

    def _dead(self, client: redis.Redis, parking_id: str, text: bytes | str, reason: str) -> None:
        """Move a parked entry that cannot go out to the dead letters (kept, counted; see
        :mod:`.dead_letters`), then forget it here."""
        dead_letters.put(client, self.prefix, "parked", parking_id, text, reason)
        parking.forget_released(client, self.prefix, parking_id)

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._round:
                try:
                    self.release_once()
                    while self.taken >= self.batch and not self._stop.is_set():
                        self.release_once()  # a full batch: more may be due
                except Exception as exc:  # Redis or broker trouble: try again next round
                    logger.warning("governor: releasing parked tasks failed: %r", exc)
                if self.sweeper is not None:
                    try:
                        self.sweeper.sweep_once()
                    except Exception as exc:
                        logger.warning("governor: sweeping concurrency caps failed: %r", exc)

    def start(self) -> None:
        fork_guard.guard(self._round)
        self._thread = threading.Thread(target=self.run, name="governor-releaser", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        fork_guard.forget(self._round)
