"""The worker bootstep: starts governor's threads in the worker's main process.

- the releaser (:mod:`.waiting.releaser`): re-publishes parked tasks when nearly due, and
  sweeps concurrency caps whose holders may have died while tasks wait in line;
- the fair dispatcher (:mod:`.fair.dispatcher`), where fair limits are configured.

:class:`governor.celery.Governor` adds it to ``app.steps["worker"]``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker.consumer import Consumer

from ..deployment import OK, green_connections
from . import registry
from .fair.dispatcher import FairDispatcher
from .waiting.cap_line import CapSweeper
from .waiting.releaser import Releaser

__all__ = ["ReleaserStep", "check_green_pool"]

logger = logging.getLogger("governor.celery")


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
        check_green_pool(worker)
        settings = governor.settings
        gate = governor.gate
        if governor.uses_fairness:
            self.dispatcher = FairDispatcher(worker.app, gate.store, settings)
            self.dispatcher.start()
        sweeper = None
        if governor.uses_caps:
            sweeper = CapSweeper(gate.store, gate.handover, settings.prefix)
        if settings.park_after is None and sweeper is None:
            return
        self.releaser = Releaser(
            worker.app,
            lambda: gate.client,
            settings.prefix,
            settings.park_after,
            interval=settings.release_interval,
            pickup=settings.release_lease,
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


def check_green_pool(worker: Any) -> None:
    """One WARNING when a green pool's tasks can exhaust the Redis broker's connections, which
    loses messages (see :func:`governor.deployment.green_connections`). Never fails start-up."""
    try:
        module = getattr(worker.pool_cls, "__module__", "") or ""
        pool = module.rsplit(".", 1)[-1]
        conf = worker.app.conf
        check = green_connections(
            conf.broker_url or conf.broker_read_url,
            conf.broker_transport_options,
            pool,
            int(worker.concurrency or 0),
            hasattr(Consumer, "call_soon_ack"),
        )
    except Exception as exc:  # a worker built differently: nothing to say
        logger.debug("governor: could not check the green pool: %r", exc)
        return
    if check is not None and check.status != OK:
        logger.warning("governor: %s", check.detail)
