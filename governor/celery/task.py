"""Governed tasks: a base class, and the mixin the worker adds to every other task.

>>> @app.task(base=GovernedTask, governor_limit="5/s, 200/h",
...           governor_key=lambda customer_id, **_: customer_id)
... def call_partner(customer_id, payload): ...

Task attributes (all optional) are listed in :class:`GovernedTask`'s docstring, made from
:data:`.config.defaults.TASK_OPTIONS` (where each is declared, once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Task

from . import registry
from .config.defaults import TASK_OPTIONS
from .feedback.backoff import Backoff
from .patches import wrap_run

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
    governor_transit: float | None = None
    governor_concurrency: int | None = None
    governor_cost: Any = 1
    governor_max_wait: float | None = None
    governor_fair_by: Any = None
    governor_weights: Any = None


def _options_doc() -> str:
    lines = [f"``{o.name}``\n    {o.doc.replace('`', '``')}" for o in TASK_OPTIONS]
    return "Base class for tasks with their own limits. Attributes (all optional):\n\n" + "\n".join(
        lines
    )


GovernedTask.__doc__ = _options_doc()


def watch_backoff(task: Any) -> None:
    """Have ``task``'s body hand a :class:`Backoff` it raises to the gate (which pauses the
    limit and re-publishes the task; see :mod:`.feedback.pausing`); a direct or eager call
    raises it unchanged (:func:`.patches.wrap_run`)."""

    def back_off(args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException) -> Any:
        assert isinstance(exc, Backoff)
        return registry.of(task.app).gate.back_off(task, args, kwargs, exc)

    wrap_run(task, Backoff, back_off)
