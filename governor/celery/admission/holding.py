"""Concurrency slots held by running tasks: from the start of the body to its end.

The gate takes a task's slots in the pool process with its admission (one Redis call per limit,
rules and cap together) and hands them here; they are renewed every third of
``governor_concurrency_lease`` by this process's renewer thread (:mod:`governor.concurrency`)
and released in the same process when the body ends, whatever the end (success, failure,
retry, ``Ignore``/``Reject``, soft time limit: Celery's ``task_postrun``), exactly once. A pool
process that dies (SIGKILL, OOM, a hard time limit, ``revoke(terminate=True)``) cannot release:
the worker's main process does it for it as soon as it learns of the death
(:meth:`Holding.release_for`, from the request's ``on_failure``/``on_timeout``), and a whole
worker that dies leaves its slots to lapse after the lease.

A slot whose renewals fail for a whole lease (Redis away longer than that) may have gone to
another task: the holder is told by an ERROR log and the ``slot_lost`` signal, its permit reads
``lost``, and the body goes on (interrupting a body midway is worse than a cap exceeded for
the rest of one task). When Redis returns, the release finds the slot gone or its own, and
never frees another holder's: releases are checked against the holder's token.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import signals as celery_signals
from redis.exceptions import RedisError

from ...concurrency import Permit, renewer
from ...errors import GovernorError
from .. import signals
from ..config.store import Store
from ..decisions.carried import Carried, roomy
from ..patches import receive_late
from ..types import Call, Held, Outcome, handed_by
from ..waiting.handover import Handover
from .calls import Calls

__all__ = ["Holding", "current_permits"]

logger = logging.getLogger("governor.celery")
_local = threading.local()


def current_permits() -> list[Permit]:
    """The concurrency slots the task running in this thread holds (``permit.lost``,
    ``permit.fence``), for a body that wants to check them."""
    return list(getattr(_local, "permits", ()))


class Holding:
    """The slots the tasks of one process hold, by task id."""

    def __init__(
        self, calls: Calls, store: Store, handover: Handover, carried: Carried | None = None
    ) -> None:
        self.calls = calls
        self.store = store
        self.handover = handover
        self.carried = carried
        """Where a slot of a roomy cap lingers for the process's next task (None: never)."""
        self._lock = threading.Lock()
        self._held: dict[str, tuple[float, list[tuple[str, Permit, bool]]]] = {}
        self._listening = False

    def take(self, call: Call, outcome: Outcome) -> None:
        """Keep the slots an admission took until the body ends."""
        self.hold(call.task, call.request, call.state.woken, outcome.held)

    def hold(self, task: Any, request: Any, woken: float | None, held: Held) -> None:
        """Keep the slots of ``held`` (decisions of an admission) until the body of
        ``request`` ends; ``woken``: when a hand-over woke it (None: it was not waiting)."""
        permits = [
            (
                spec.label,
                Permit(lim, spec.subject, d.hold, on_lost=_lost(spec.label)),
                roomy(lim, d.remaining),
            )
            for lim, spec, d in held
            if d.hold is not None
        ]
        if not permits:
            return
        self._listen()
        with self._lock:
            self._held[request.id] = (time.monotonic(), permits)
        for _, permit, _ in permits:
            renewer().add(permit)
        _local.permits = [p for _, p, _ in permits]
        signals.slot_acquired.send(
            sender=task,
            request=request,
            limits=[label for label, _, _ in permits],
            handover=None if woken is None else max(0.0, time.time() - woken),
        )

    def _listen(self) -> None:
        """Release at the end of every body from the first slot this process holds on.

        Celery's tracer sends ``task_postrun`` only while something receives it, and a
        receiver costs every task a signal dispatch: so governor connects one only in a process
        that took a slot (before the body that holds it ends)."""
        if not self._listening:
            self._listening = True
            receive_late(
                celery_signals.task_postrun, self._task_done, f"governor.holding.{id(self)}"
            )

    def _task_done(self, sender: Any = None, task_id: str | None = None, **_: Any) -> None:
        self.release(sender, task_id)

    def release(self, task: Any, task_id: str | None) -> None:
        """The body of ``task_id`` ended: give its slots back (the oldest waiters get them)."""
        with self._lock:
            entry = self._held.pop(task_id or "", None)
        if entry is None:
            return
        started, permits = entry
        _local.permits = []
        carried = self.carried
        if carried is not None:  # a roomy cap's slot waits for this process's next task
            permits = [
                (label, permit, lingers)
                for label, permit, lingers in permits
                if not (lingers and not permit.lost and carried.keep(permit))
            ]
        self._give_back(permits)
        signals.slot_released.send(
            sender=task,
            request=getattr(task, "request", None),
            limits=[label for label, _, _ in entry[1]],
            held=time.monotonic() - started,
        )

    def release_all(self) -> None:
        """This process is leaving: give back what its tasks still hold, and what lingers."""
        with self._lock:
            entries, self._held = list(self._held.values()), {}
        for _, permits in entries:
            self._give_back(permits)
        if self.carried is not None:
            self.carried.release_all()

    def _give_back(self, permits: list[tuple[str, Permit, bool]]) -> None:
        for label, permit, _ in permits:
            try:
                released, handed = permit.release()
            except (GovernorError, RedisError) as exc:  # it lapses after the lease instead
                logger.warning("governor: could not release a slot of %s: %r", label, exc)
                continue
            if not released and not permit.lost:
                logger.warning(
                    "governor: the slot of %s held by %s had lapsed before its release",
                    label,
                    permit.holder,
                )
            self.handover.publish(handed_by(permit.limiter, permit.subject, handed))

    def release_for(self, task: Any, request: Any) -> None:
        """In the worker's main process: the pool process running ``request`` died; release the
        slots it took (those its info names: that node and process), never a later holder's."""
        retries = (getattr(request, "request_dict", None) or {}).get("retries") or 0
        holder = f"{request.id}:{retries}"
        info = f"{request.hostname} {request.worker_pid}"
        try:
            args, kwargs = tuple(request.args), dict(request.kwargs)
            specs = self.calls.specs(task, request, args, kwargs)
        except Exception as exc:  # its key could not be worked out: the lease lapses
            logger.warning(
                "governor: slots of dead %s[%s] left to lapse: %r", task.name, holder, exc
            )
            return
        for spec in specs:
            if spec.config.concurrency is None:
                continue
            lim = self.store.limiter(spec.name, spec.config)
            try:
                released, handed = lim.release(spec.subject, holder, info=info)
            except (GovernorError, RedisError) as exc:
                logger.warning("governor: slot of %s left to lapse: %r", spec.label, exc)
                continue
            if released:
                logger.warning(
                    "governor: released the slot of %s held by %s, whose process died",
                    spec.label,
                    holder,
                )
            self.handover.publish(handed_by(lim, spec.subject, handed))


def holder_info(request: Any) -> str:
    """What a holder says about itself: the worker node and the pool process."""
    return f"{getattr(request, 'hostname', None) or '-'} {os.getpid()}"


def _lost(label: str) -> Any:
    def on_lost(permit: Permit) -> None:
        signals.slot_lost.send(sender=None, limit=label, holder=permit.holder)

    return on_lost
