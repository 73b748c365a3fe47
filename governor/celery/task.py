"""Governed tasks: a base class, and the mixin the worker adds to every other task.

>>> @app.task(base=GovernedTask, governor_limit="5/s, 200/h",
...           governor_key=lambda customer_id, **_: customer_id)
... def call_partner(customer_id, payload): ...

Task attributes (all optional):

``governor_limit``      rules; with ``governor_key`` they apply per key, without it per task
``governor_key``        callable -> subject (str or int) for per-key limits; it gets the task's
                        arguments by name: ``lambda customer_id, **_: customer_id``
``governor_name``       limiter name for per-key limits (default: the task name); tasks that
                        share a name share the per-key limit
``governor_algorithm``  algorithm for these rules (default: ``governor_algorithm``)
``governor_concurrency`` at most this many calls run at once (per key with ``governor_key``):
                        a slot is held from the start of the body to its end
``governor_cost``       units a call costs: int, or a callable like ``governor_key`` (1); caps
                        count calls, not cost
``governor_max_wait``   give up with GovernorTimeout after waiting this long in total (seconds)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from celery import Task

from . import registry
from .backoff import Backoff

__all__ = ["GovernedMixin", "GovernedTask", "watch_backoff"]


class GovernedMixin:
    """Runs governor's gate before the task body (from ``before_start``, where Celery's trace
    handles the :class:`~celery.exceptions.Ignore` a deferral raises; signal receivers could not
    stop the task)."""

    app: Any

    def before_start(self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        deferred = registry.of(self.app).gate.admit(self, tuple(args), kwargs)
        if deferred is not None:
            raise deferred  # here, so the traceback Celery records for it stays short
        super().before_start(task_id, args, kwargs)  # type: ignore[misc]


class GovernedTask(GovernedMixin, Task):  # type: ignore[misc]
    """Base class for tasks with their own limits (see the module docstring)."""

    governor_limit: Any = None
    governor_key: Callable[..., Any] | None = None
    governor_name: str | None = None
    governor_algorithm: str | None = None
    governor_concurrency: int | None = None
    governor_cost: int | Callable[..., int] = 1
    governor_max_wait: float | None = None


def watch_backoff(task: Any) -> None:
    """Have ``task``'s body hand a :class:`Backoff` it raises to the gate (which pauses the
    limit and re-publishes the task; see :mod:`governor.celery.pausing`). Wraps the instance's
    ``run``, which the worker's tracer calls; a direct or eager call raises it unchanged."""
    run = task.run
    if getattr(run, "_governor_backoff", False):
        return

    @functools.wraps(run)  # the signature stays: governor_key maps arguments to names with it
    def governed_run(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except Backoff as exc:
            request = task.request
            if getattr(request, "is_eager", False) or getattr(request, "called_directly", True):
                raise
            deferred = registry.of(task.app).gate.back_off(task, args, kwargs, exc)
        raise deferred  # outside the except block: the traceback Celery records stays short

    governed_run._governor_backoff = True  # type: ignore[attr-defined]
    task.run = governed_run
