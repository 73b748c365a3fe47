"""The releaser: a thread in every worker's main process that re-publishes parked tasks when
they are nearly due (see :mod:`.parking` for what is parked and why), and sweeps concurrency
caps whose holders may have died while tasks wait in line (see :mod:`.waiting`). Its bootstep
also runs the fair dispatcher where fair limits are configured (:mod:`.fair_dispatch`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import bootsteps

from . import fork_guard, parking, registry, signals
from .fair_dispatch import FairDispatcher
from .waiting import Sweeper

__all__ = ["Releaser", "ReleaserStep"]

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
        lease: float = 5.0,
        batch: int = 200,
        lead: float = 0.0,
        sweeper: Sweeper | None = None,
        shards: int = 1,
    ) -> None:
        self.app = app
        self.client_factory = client_factory
        self.prefix = prefix
        self.horizon = horizon
        self.interval = interval
        self.lease = lease
        self.batch = batch
        self.lead = lead
        """Publish this long before the due time: a booked task arrives early (Settings.lead)."""
        self.sweeper = sweeper
        self.shards = shards
        """Parking shards to take from (``governor_parking_shards``)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._round = threading.Lock()
        """Held through each round: a fork of the process waits for it (see .fork_guard)."""

    def release_once(self) -> int:
        """Take and publish what is due within the horizon; returns how many were published."""
        if self.horizon is None:
            return 0
        client = self.client_factory()
        now, taken = parking.take_due(
            client, self.prefix, self.horizon, self.lease, self.batch, self.shards
        )
        taken_at = time.monotonic()
        published = 0
        for parking_id, text in taken:
            try:
                sig, due, _env = parking.open_envelope(self.app, text)
            except Exception as exc:  # unreadable: keep it leased and visible in the logs
                logger.error("governor: cannot read parked task %s: %r", parking_id, exc)
                continue
            parking.stamp_release(sig)
            # the Redis clock now: publishing a large batch takes a while
            elapsed = time.monotonic() - taken_at
            sig.apply_async(countdown=max(0.0, due - now - elapsed - self.lead))
            parking.forget_released(client, self.prefix, parking_id)
            published += 1
        if published:
            signals.task_released.send(sender=self, count=published, queue=None)
            logger.debug("governor: released %d parked tasks", published)
        return published

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._round:
                try:
                    while self.release_once() >= self.batch and not self._stop.is_set():
                        pass
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


class ReleaserStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep: run a :class:`Releaser` in the worker's main process."""

    label = "governor releaser"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.releaser: Releaser | None = None
        self.dispatcher: FairDispatcher | None = None

    def start(self, worker: Any) -> None:
        governor = registry.find(worker.app)
        if governor is None:
            return
        settings = governor.settings
        gate = governor.gate
        if governor.uses_fairness:
            self.dispatcher = FairDispatcher(worker.app, gate.store, settings)
            self.dispatcher.start()
        sweeper = None
        if governor.uses_caps:
            sweeper = Sweeper(gate.store, gate.handover, settings.prefix)
        if settings.park_after is None and sweeper is None:
            return
        self.releaser = Releaser(
            worker.app,
            lambda: gate.client,
            settings.prefix,
            settings.park_after,
            interval=settings.release_interval,
            lease=settings.release_lease,
            lead=settings.lead,
            sweeper=sweeper,
            shards=settings.parking_shards,
        )
        self.releaser.start()

    def stop(self, worker: Any) -> None:
        if self.releaser is not None:
            self.releaser.stop()
            self.releaser = None
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.dispatcher = None

    def terminate(self, worker: Any) -> None:
        # StartStopStep.terminate only stops ``self.obj``; a cold shutdown must stop it too.
        self.stop(worker)
