"""Which limits govern a task: its queue's quota, its task rules, its per-key rule.

==========  ==========================  =========================  ==========================
kind        configured by               limiter name               subject
==========  ==========================  =========================  ==========================
queue       ``governor_queues``         ``queue``                  the queue consumed from
task        ``governor_tasks`` or a     ``task``                   the task name
            task's ``governor_limit``
key         ``governor_limit`` with     ``governor_name`` or the   ``governor_key(*args,
            ``governor_key``            task name                  **kwargs)``
==========  ==========================  =========================  ==========================

So ``governor inspect queue emails`` and ``governor inspect proj.call_partner customer-42``
name what a worker counts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, GovernorError
from ..keys import check_name, subject_text
from .settings import LimitConfig, Settings, limit_config

__all__ = ["LimitSpec", "consumed_queue", "key_spec", "option", "task_limit_config"]


def option(task: Any, name: str, default: Any = None) -> Any:
    """A task's ``governor_*`` attribute as given: a function set on the task class stays a
    plain function (plain ``getattr`` would bind it to the task as a method)."""
    value = inspect.getattr_static(task, name, default)
    if isinstance(value, (staticmethod, classmethod)):
        return value.__get__(None, type(task))
    return value


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One limit that applies to a call: which limiter, which subject, what it costs."""

    kind: str
    name: str
    config: LimitConfig
    subject: str

    @property
    def label(self) -> str:
        """How logs, metrics and the CLI call it: ``queue:emails``, ``task:proj.sync``, or
        ``proj.call_partner`` for per-key limits."""
        return self.name if self.kind == "key" else f"{self.name}:{self.subject}"


def task_limit_config(task: Any, settings: Settings) -> LimitConfig | None:
    """The whole-task limit: ``governor_tasks[name]`` wins over a key-less ``governor_limit``."""
    if task.name in settings.tasks:
        return settings.tasks[task.name]
    rules = getattr(task, "governor_limit", None)
    if rules is not None and option(task, "governor_key") is None:
        algorithm = getattr(task, "governor_algorithm", None) or settings.algorithm
        return limit_config(
            {"rules": rules, "algorithm": algorithm},
            settings.algorithm,
            f"task {task.name!r} governor_limit",
        )
    return None


def key_config(task: Any, settings: Settings) -> LimitConfig | None:
    rules = getattr(task, "governor_limit", None)
    if rules is None or option(task, "governor_key") is None:
        return None
    algorithm = getattr(task, "governor_algorithm", None) or settings.algorithm
    return limit_config(
        {"rules": rules, "algorithm": algorithm},
        settings.algorithm,
        f"task {task.name!r} governor_limit",
    )


def call_with_arguments(
    task: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """Call ``fn`` with the task's arguments by name, so ``lambda customer_id, **_: customer_id``
    works however the task was called (positionally or by keyword)."""
    try:
        signature = inspect.signature(task.run)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            named.update(named.pop(param.name, {}))
    return fn(**named)


def key_spec(
    task: Any, config: LimitConfig, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> LimitSpec:
    """The per-key limit of one call; the key function's errors name the task."""
    key: Callable[..., Any] = option(task, "governor_key")
    try:
        subject = subject_text(call_with_arguments(task, key, args, kwargs))
    except GovernorError as exc:
        raise ConfigError(f"task {task.name!r}: governor_key gave a bad subject: {exc}") from None
    name = getattr(task, "governor_name", None) or task.name
    return LimitSpec("key", name, config, subject)


def validate_task(task: Any, settings: Settings) -> None:
    """Fail fast on a task's governor_* attributes (called when the app finalizes)."""
    task_limit_config(task, settings)
    key_config(task, settings)
    key = option(task, "governor_key")
    if key is not None and not callable(key):
        raise ConfigError(f"task {task.name!r}: governor_key must be callable, got {key!r}")
    if key is not None and getattr(task, "governor_limit", None) is None:
        raise ConfigError(f"task {task.name!r}: governor_key needs governor_limit (the rules)")
    name = getattr(task, "governor_name", None)
    if name is not None:
        check_name(f"task {task.name!r} governor_name", name)
    cost = option(task, "governor_cost", 1)
    if not callable(cost) and (isinstance(cost, bool) or not isinstance(cost, int) or cost < 1):
        raise ConfigError(
            f"task {task.name!r}: governor_cost must be a positive integer or a callable, "
            f"got {cost!r}"
        )
    wait = getattr(task, "governor_max_wait", None)
    if wait is not None and (
        isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait <= 0
    ):
        raise ConfigError(
            f"task {task.name!r}: governor_max_wait must be positive seconds, got {wait!r}"
        )


def consumed_queue(app: Any, delivery_info: Mapping[str, Any] | None) -> str | None:
    """The queue a message was consumed from, from its delivery info.

    A direct binding (exchange, routing key) declared in the app's queues wins; with the default
    exchange (the Redis transport) or no match, the routing key is the queue name.
    """
    if not delivery_info:
        return None
    routing_key = delivery_info.get("routing_key")
    exchange = delivery_info.get("exchange") or ""
    queue = delivery_info.get("queue")
    if queue:
        return str(queue)
    if exchange:
        for q in app.amqp.queues.values():
            if (
                q.routing_key == routing_key
                and q.exchange is not None
                and (q.exchange.name == exchange)
            ):
                return str(q.name)
    return None if routing_key is None else str(routing_key)
