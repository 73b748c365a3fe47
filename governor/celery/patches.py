"""Every place governor patches or swaps Celery's own objects, in one module.

Celery has no hook for what these do (a veto before the body, an acknowledgement held until a
task's fate is known, a message deferred before the pool), so governor wraps a few of its
objects. Each patch below names what it relies on and the Celery versions it was checked
against; on a Celery upgrade, this module is what to check (the compatibility matrix,
``nox -s compat``, runs a test of each). Checked against Celery 5.3.6 to 5.7.0.

What governor only *reads* of Celery's internals, without patching, is listed at the end.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from celery.exceptions import TaskRevokedError

__all__ = [
    "hide_deferral_logs",
    "mix_into_task",
    "receive_late",
    "skip_pool",
    "wrap_ack",
    "wrap_finalize",
    "wrap_request_subclass",
    "wrap_run",
]

CHECKED = ("5.3.6", "5.7.0")
"""The oldest and newest Celery releases these patches were checked against."""


def wrap_finalize(app: Any, after: Callable[[], None]) -> None:
    """Call ``after`` once the app finalizes (in producers and workers alike).

    ``app.finalize`` is replaced on the instance: Celery's ``on_after_finalize`` is a signal,
    and a signal receiver cannot make finalize fail (a bad rule must fail at start-up).
    Relies on: ``Celery.finalize(auto=False)`` and ``Celery.finalized`` (celery/app/base.py).
    """
    finalize = app.finalize

    def finalize_and_validate(auto: bool = False) -> None:
        was_finalized = app.finalized
        finalize(auto=auto)
        if app.finalized and not was_finalized:
            after()

    app.finalize = finalize_and_validate


def mix_into_task(task: Any, mixin: type) -> None:
    """Give a registered task instance ``mixin`` (the gate's ``before_start``) by swapping its
    class for a subclass, keeping its name and module (pickling and logs unchanged).

    Relies on: Celery calling ``task.before_start`` from its tracer (celery/app/trace.py,
    since 5.2), on the one task instance registered in ``app.tasks``.
    """
    cls = type(task)
    if not issubclass(cls, mixin):
        task.__class__ = type(
            cls.__name__,
            (mixin, cls),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )


def wrap_run(
    task: Any, on_raise: type[BaseException], handle: Callable[..., BaseException]
) -> None:
    """Have the body's ``on_raise`` exceptions go to ``handle(args, kwargs, exc)``, which
    returns what to raise instead (a :class:`~governor.celery.Deferred` after a Backoff).

    Wraps the instance's ``run``, which the worker's tracer calls (celery/app/trace.py calls
    ``fun = task if task_has_custom(task, "__call__") else task.run``); a direct or eager call
    raises ``on_raise`` unchanged. The signature stays (``functools.wraps``): ``governor_key``
    maps arguments to names with it.
    """
    run = task.run
    if getattr(run, "_governor_wrapped", False):
        return

    @functools.wraps(run)
    def governed_run(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except on_raise as exc:
            request = task.request
            if getattr(request, "is_eager", False) or getattr(request, "called_directly", True):
                raise
            instead = handle(args, kwargs, exc)
        raise instead  # outside the except block: the traceback Celery records stays short

    governed_run._governor_wrapped = True  # type: ignore[attr-defined]
    task.run = governed_run


def wrap_request_subclass(cls: type) -> None:
    """Celery builds a request subclass per task (``create_request_cls`` in
    celery/worker/request.py) that redefines ``execute_using_pool`` and ``on_success`` without
    calling the base class's: wrap them, so a known denial is deferred before it reaches the
    pool and a held acknowledgement is released after success. Called from the governed
    request mixin's ``__init_subclass__``; ``cls`` has ``_governor_defer_early`` and
    ``_governor_release``.
    """
    dispatch = cls.__dict__.get("execute_using_pool")
    if dispatch is not None and not getattr(dispatch, "_governor_wrapped", False):

        def execute_using_pool(self: Any, pool: Any, **kw: Any) -> Any:
            if self._governor_defer_early():
                skip_pool(self)
            return dispatch(self, pool, **kw)

        execute_using_pool._governor_wrapped = True  # type: ignore[attr-defined]
        cls.execute_using_pool = execute_using_pool  # type: ignore[attr-defined]
    own = cls.__dict__.get("on_success")
    if own is not None and not getattr(own, "_governor_wrapped", False):

        def on_success(self: Any, failed__retval__runtime: Any, **kw: Any) -> None:
            try:
                own(self, failed__retval__runtime, **kw)
            finally:
                self._governor_release()

        on_success._governor_wrapped = True  # type: ignore[attr-defined]
        cls.on_success = on_success  # type: ignore[attr-defined]


def skip_pool(request: Any) -> None:
    """Leave the worker's dispatch for a request that was deferred without the pool.

    With the prefork pool the worker takes a pool semaphore slot before dispatching and only
    the job's completion gives it back; a request that never reaches the pool would keep it
    forever. ``TaskRevokedError`` is how Celery itself leaves that path: WorkController
    ``_process_task`` (celery/worker/worker.py) catches it and releases the slot (Celery
    issue 877).
    """
    raise TaskRevokedError(request.id)


def wrap_ack(message: Any, unacked: Callable[[], None]) -> None:
    """Call ``unacked`` when the acknowledgement of ``message`` (a kombu message) fails.

    Celery acknowledges a moment after ``Request.acknowledge`` returns, on its event loop
    (``message.ack`` through ``task_message_handler``'s callbacks), so a failure is only seen
    by wrapping the message's own ``ack`` (kombu/message.py ``Message.ack``).
    """
    ack = message.ack

    def marking_ack(*args: Any, **kwargs: Any) -> None:
        try:
            ack(*args, **kwargs)
        except Exception:
            unacked()
            raise
        finally:
            # once used, off the message: it refers to the message and to its request, a
            # cycle that would keep both (and the body) until the garbage collector ran
            mine = vars(message).get("ack")
            if getattr(mine, "_governor_marking", False):
                del vars(message)["ack"]

    marking_ack._governor_marking = True  # type: ignore[attr-defined]
    message.ack = marking_ack


class _HideDeferrals(logging.Filter):
    """Celery logs every ``Ignore`` at INFO ("Task x ignored"); a deferral is normal operation
    (governor logs a summary instead), so those lines are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        return not (isinstance(data, dict) and str(data.get("exc", "")).startswith("Deferred("))


def hide_deferral_logs() -> None:
    """Drop Celery's "Task ... ignored" lines for deferrals. Relies on celery/app/trace.py
    logging an ``Ignore`` with ``extra={"data": {..., "exc": str(reason)}}``."""
    logging.getLogger("celery.app.trace").addFilter(_HideDeferrals())


_late_lock = threading.Lock()


def receive_late(signal: Any, receiver: Callable[..., Any], uid: str) -> None:
    """Connect ``receiver`` (strongly, as ``uid``) to a signal whose receivers Celery's tracer
    already holds (``task_postrun``): for a receiver only some processes need, connected when
    first needed. Two traps of Celery before 5.7 (celery/utils/dispatch/signal.py) are avoided:

    - a bound method is keyed by its function alone (``_make_id``), so the same method of a
      second instance is taken for the first's and dropped: ``uid`` keys it instead (one per
      instance: ``Governor._uid`` does the same);
    - the tracer (``build_tracer`` in celery/app/trace.py) reads ``signal.receivers`` once,
      when it is built, and sends only while that list is not empty, but clearing dead weak
      receivers (``_clear_dead_receivers``, run by every ``connect``) *replaces* the list, so a
      receiver connected later could land in a list the tracer never reads. Here the signal
      clears in place, as 5.7 does (``self.receivers[:] = ...``), and a list replaced by this
      very connect is put back.
    """
    with _late_lock:
        held = signal.receivers
        if "_clear_dead_receivers" not in vars(signal):
            signal._clear_dead_receivers = functools.partial(_clear_in_place, signal)
        signal.connect(receiver, weak=False, dispatch_uid=uid)
        if signal.receivers is not held:
            held[:] = signal.receivers
            signal.receivers = held


def _clear_in_place(signal: Any) -> None:
    """``Signal._clear_dead_receivers`` as Celery 5.7 has it (the caller holds the lock)."""
    if signal._dead_receivers:
        signal._dead_receivers = False
        signal.receivers[:] = [
            r
            for r in signal.receivers
            if not (isinstance(r[1], weakref.ReferenceType) and r[1]() is None)
        ]


# What governor reads of Celery's internals without patching them (check these too):
# - admission/early.py: a worker Request's ``_request_dict``, ``_context``, ``revoked()``,
#   ``delivery_info``, ``args``/``kwargs``, and ``celery.worker.state.task_ready``;
# - request.py overrides ``Request.on_accepted``/``on_failure``/``on_retry``/``on_timeout``/
#   ``on_success``/``acknowledge``/``execute_using_pool``/``revoked`` (Celery drops revoked and
#   expired messages in ``revoked()``, before the pool) and reads ``_message``, ``worker_pid``;
# - admission/holding.py: a Request's ``request_dict``, ``hostname``, ``worker_pid``;
# - metrics/processes.py: the pool class's name (single-process pools);
# - task.signature_from_request (waiting/republish.py): a public method, but what it copies
#   changed between releases (headers, ``retries``).
