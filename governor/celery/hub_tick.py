"""A tick for the worker's event loop on kombu < 5.7 with the threads pool.

Celery acknowledges a message on the worker's event loop (kombu's hub): a pool thread that
acknowledges one only queues the ack there (``hub.call_soon``). Before kombu 5.7 nothing wakes
the loop for it, so while the prefetch window is full the loop sleeps until its next timer, up
to 10 s, and takes no message meanwhile. Plain Celery on the threads pool stalls so too (ten
50 ms tasks, prefetch 4: five ran, then nothing for 10 s, Celery 5.3.6 and kombu 5.3.7); a
governed message's acknowledgement is held until its body ends (see .request), so every one
of them ends with such an ack and a backlog stalls at once. kombu 5.7 wakes the loop itself
(its hub has a waker); on older ones this step gives the loop a timer every ``TICK`` seconds.
Other pools need none: prefork reports to the loop through pipes it watches, solo runs tasks
on the loop, gevent and eventlet have no hub.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps
from kombu.asynchronous.hub import Hub

__all__ = ["TICK", "HubTickStep", "needs_tick"]

TICK = 0.05
"""Seconds between the loop's wake-ups: how long a queued ack waits at most."""


def needs_tick(pool_cls: Any, hub_cls: type = Hub) -> bool:
    """Whether a worker with this pool needs the tick: a threads pool on a hub without a
    waker (kombu < 5.7)."""
    threads = getattr(pool_cls, "__module__", None) == "celery.concurrency.thread"
    return threads and not hasattr(hub_cls, "_create_waker")


class HubTickStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep: a no-op timer every ``TICK`` s on the hub, where :func:`needs_tick`."""

    label = "governor hub tick"
    requires = ("celery.worker.components:Hub",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.entry: Any = None

    def start(self, worker: Any) -> None:
        hub = getattr(worker, "hub", None)
        if hub is not None and needs_tick(worker.pool_cls, type(hub)):
            self.entry = hub.call_repeatedly(TICK, _tick)

    def stop(self, worker: Any) -> None:
        if self.entry is not None:
            self.entry.cancel()
            self.entry = None


def _tick() -> None:
    """Nothing: the timer's only work is to end the loop's sleep."""
