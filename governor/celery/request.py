"""The worker-side request class: a governed message is acknowledged once its fate is known.

Celery acknowledges a task's message when a pool process starts it (unless ``acks_late``); the
governor gate runs after that, in the pool process. So for governed messages this request holds
that early acknowledgement until the pool process reports back: after a deferral (the new
message is out by then), a success, a failure or a retry. A worker that dies in between leaves
the message unacknowledged, and the broker delivers it again: nothing is lost, at the price of
running a governed task twice if the whole worker dies during its body (as with acks_late).
An acknowledgement that fails (the broker connection is down) is marked in the governor's
Redis, so the message delivered again is dropped, not run or deferred twice (.redelivery).
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.utils.imports import symbol_by_name

from . import registry
from .config.settings import mark_life
from .patches import skip_pool, wrap_ack, wrap_request_subclass
from .waiting import redelivery

__all__ = ["GovernedRequestMixin", "governed_request_class"]

logger = logging.getLogger("governor.celery")
PROCESS_DIED = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)
"""How a request learns that its pool process died (killed, out of memory, terminated by a
revoke, or by a hard time limit; billiard >= 4.3 may report the exit itself first)."""


class GovernedRequestMixin:
    """Holds the early acknowledgement of governed messages until the outcome is known."""

    _governor_hold = False
    _governor_dropped = False
    _governor_governed: bool | None = None
    _governor_found: Any = None
    _governor_route: Any = None
    id: str
    task: Any
    delivery_info: Any
    worker_pid: int | None

    def _governed_message(self) -> bool:
        """Whether governor governs this message (worked out once per message: the dispatch
        asks, then its acceptance; the governor and the message's route are kept for the
        dispatch's early deferral)."""
        governed = self._governor_governed
        if governed is None:
            task = self.task
            governor = registry.find(task.app)
            governed = False
            if governor is not None:
                calls = governor.gate.calls
                route = calls.route(task, self.delivery_info)
                governed = calls.governs(task, route)
                self._governor_found = governor
                self._governor_route = route
            self._governor_governed = governed
        return governed

    def acknowledge(self) -> None:
        if not self._governor_hold:
            self._governor_ack()

    def _governor_release(self) -> None:
        if self._governor_hold:
            self._governor_hold = False
            self._governor_ack()

    def _governor_ack(self) -> None:
        message = getattr(self, "_message", None)
        if message is not None and not getattr(self, "acknowledged", False):
            # Celery acknowledges a moment later, on its event loop: see if that fails then
            wrap_ack(message, self._governor_unacked)
        super().acknowledge()  # type: ignore[misc]

    def _governor_unacked(self) -> None:
        """The acknowledgement failed (the broker connection is down) after the task ran or
        was deferred: mark it, so that the broker delivering it again does not run it."""
        governor = registry.find(self.task.app)
        if governor is None or not self._governed_message():
            return
        info: Any = getattr(self, "_request_dict", None) or {}
        retries, waits = int(info.get("retries") or 0), redelivery.waits_of(info)
        try:
            conf = self.task.app.conf
            life = mark_life(conf.get("broker_url"), conf.get("broker_transport_options"))
            redelivery.mark(
                governor.gate.client, governor.settings.prefix, self.id, retries, waits, life
            )
        except Exception as exc:
            logger.error("governor: %s not acknowledged, nor marked: %r", self.id, exc)

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        if not self.task.acks_late and self._governed_message():
            self._governor_hold = True
        super().on_accepted(pid, time_accepted)  # type: ignore[misc]

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        parent: Any = super()
        try:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback wraps it
            if isinstance(exc, PROCESS_DIED):
                self._governor_process_died()
            parent.on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        finally:
            self._governor_release()

    def _governor_process_died(self) -> None:
        """The pool process running this task died: release its concurrency slots now, not
        after their lease (it cannot; see governor.celery.admission.holding)."""
        governor = registry.find(self.task.app)
        if governor is not None and self.worker_pid is not None:
            try:
                governor.gate.holding.release_for(self.task, self)
            except Exception:  # never break the worker's bookkeeping: the lease lapses
                logger.exception("governor: releasing the slots of a dead process failed")

    def on_retry(self, exc_info: Any) -> None:
        try:
            super().on_retry(exc_info)  # type: ignore[misc]
        finally:
            self._governor_release()

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)  # type: ignore[misc]
        if not soft:
            self._governor_process_died()  # a hard time limit kills the pool process
            self._governor_release()

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> None:
        try:
            super().on_success(failed__retval__runtime, **kwargs)  # type: ignore[misc]
        finally:
            self._governor_release()

    def revoked(self) -> bool:
        """Celery's check before a message goes to the pool: revoked or expired messages are
        dropped here, before the gate. A governed one also leaves the caps' lines it is in (a
        slot handed to it passes on at once: it will never start)."""
        gone: bool = super().revoked()  # type: ignore[misc]
        if gone and not self._governor_dropped:
            self._governor_dropped = True
            governor = registry.find(self.task.app)
            if governor is not None and self._governed_message():
                governor.gate.dropped(self.task, self)
        return gone

    def _governor_defer_early(self) -> bool:
        if not self._governed_message():
            return False
        return bool(self._governor_found.gate.early.defer(self, self._governor_route))

    def execute_using_pool(self, pool: Any, **kwargs: Any) -> Any:
        if self._governor_defer_early():
            skip_pool(self)
        return super().execute_using_pool(pool, **kwargs)  # type: ignore[misc]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        wrap_request_subclass(cls)  # Celery's per-task subclass skips our methods otherwise


_classes: dict[type, type] = {}


def governed_request_class(base: Any) -> type:
    """A request class holding governed acknowledgements, derived from ``base`` (a class or
    its dotted name, as in ``Task.Request``)."""
    base_cls: type = symbol_by_name(base) if isinstance(base, str) else base
    if issubclass(base_cls, GovernedRequestMixin):
        return base_cls
    if base_cls not in _classes:
        _classes[base_cls] = type(
            f"Governed{base_cls.__name__}", (GovernedRequestMixin, base_cls), {}
        )
    return _classes[base_cls]
