"""Which limits govern a task: its queue's quota, its task rules, its per-key rule.

==========  ==========================  =========================  ==========================
kind        configured by               limiter name               subject
==========  ==========================  =========================  ==========================
queue       ``governor_queues``         ``queue``                  the queue consumed from
task        ``governor_tasks`` or a     ``task``                   the task name
            task's ``governor_limit``
            / ``governor_concurrency``
key         the same attributes with    ``governor_name`` or the   ``governor_key(*args,
            ``governor_key``            task name                  **kwargs)``
==========  ==========================  =========================  ==========================

Each of them may hold rules, a concurrency cap, or both (one Redis call decides both).

So ``governor inspect queue emails`` and ``governor inspect proj.call_partner customer-42``
name what a worker counts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import ConfigError, GovernorError
from ...keys import check_name, subject_text
from ..types import LimitConfig, LimitSpec
from .limit_config import limit_config
from .settings import Settings

__all__ = [
    "call_with_arguments",
    "consumed_queue",
    "key_config",
    "key_spec",
    "option",
    "task_limit_config",
    "validate_task",
]


def option(task: Any, name: str, default: Any = None) -> Any:
    """A task's ``governor_*`` attribute as given: a function set on the task class stays a
    plain function (plain ``getattr`` would bind it to the task as a method)."""
    value = inspect.getattr_static(task, name, default)
    if isinstance(value, (staticmethod, classmethod)):
        return value.__get__(None, type(task))
    return value


def _own_config(task: Any, settings: Settings) -> LimitConfig | None:
    """The limit a task's own attributes set: ``governor_limit`` and/or
    ``governor_concurrency`` (with ``governor_algorithm``)."""
    rules = getattr(task, "governor_limit", None)
    concurrency = getattr(task, "governor_concurrency", None)
    if rules is None and concurrency is None:
        return None
    value: dict[str, Any] = {
        "algorithm": getattr(task, "governor_algorithm", None) or settings.algorithm
    }
    if rules is not None:
        value["rules"] = rules
    if concurrency is not None:
        value["concurrency"] = concurrency
    transit = getattr(task, "governor_transit", None)
    if transit is not None and rules is not None:
        value["transit"] = transit
    fair_by = option(task, "governor_fair_by")
    if fair_by is not None:
        value["fair_by"] = fair_by
        value["weights"] = option(task, "governor_weights") or {}
    what = "governor_limit" if concurrency is None else "governor_limit/governor_concurrency"
    return limit_config(
        value, settings.algorithm, f"task {task.name!r} {what}", settings.concurrency_lease
    )


def task_limit_config(task: Any, settings: Settings) -> LimitConfig | None:
    """The whole-task limit: ``governor_tasks[name]`` wins over a key-less ``governor_limit``
    (and ``governor_concurrency``)."""
    if task.name in settings.tasks:
        return settings.tasks[task.name]
    if option(task, "governor_key") is None:
        return _own_config(task, settings)
    return None


def key_config(task: Any, settings: Settings) -> LimitConfig | None:
    """The per-key limit: ``governor_limit`` and/or ``governor_concurrency`` with a key."""
    if option(task, "governor_key") is None:
        return None
    return _own_config(task, settings)


def call_with_arguments(
    task: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """Call ``fn`` with the task's arguments by name, so ``lambda customer_id, **_: customer_id``
    works however the task was called (positionally or by keyword)."""
    try:
        shape = _shape(task.run)
    except TypeError:  # not hashable: worked out for this call
        shape = _Shape(task.run)
    named = shape.named(args, kwargs)
    return fn(*args, **kwargs) if named is None else fn(**named)


class _Shape:
    """How a task's arguments get their names: ``inspect.signature``'s binding, worked out
    once per function (a key function or a fair limit names them for every call)."""

    __slots__ = ("defaults", "names", "signature", "simple", "var_keyword", "words")

    def __init__(self, run: Callable[..., Any]) -> None:
        try:
            self.signature: inspect.Signature | None = inspect.signature(run)
        except (TypeError, ValueError):
            self.signature = None
            self.simple = False
            return
        kinds = inspect.Parameter
        params = list(self.signature.parameters.values())
        self.names = [p.name for p in params if p.kind is kinds.POSITIONAL_OR_KEYWORD]
        self.words = {
            p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        }
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}
        self.var_keyword = next((p.name for p in params if p.kind is kinds.VAR_KEYWORD), None)
        # the usual signature (no positional-only parameters, no *args) is bound here; any
        # other by inspect's Signature.bind
        self.simple = not any(
            p.kind in (kinds.POSITIONAL_ONLY, kinds.VAR_POSITIONAL) for p in params
        )

    def named(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        """The arguments by name, defaults filled in and ``**kwargs`` spread; None when they
        do not bind (as ``Signature.bind`` would raise)."""
        if self.simple:
            names = self.names
            if len(args) > len(names):
                return None
            named = dict(zip(names, args))
            for key, value in kwargs.items():
                if key in named or (key not in self.words and self.var_keyword is None):
                    return None  # given twice, or unexpected
                named[key] = value
            for name in self.words:
                if name not in named:
                    if name not in self.defaults:
                        return None  # missing
                    named[name] = self.defaults[name]
            return named
        if self.signature is None:
            return None
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        named = dict(bound.arguments)
        if self.var_keyword is not None:
            named.update(named.pop(self.var_keyword, {}))
        return named


_shapes: dict[Any, _Shape] = {}


def _shape(run: Callable[..., Any]) -> _Shape:
    shape = _shapes.get(run)
    if shape is None:
        if len(_shapes) >= 1024:
            _shapes.clear()
        shape = _shapes[run] = _Shape(run)
    return shape


def key_spec(
    task: Any,
    config: LimitConfig,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    key: Callable[..., Any] | None = None,
) -> LimitSpec:
    """The per-key limit of one call; the key function's errors name the task. ``key``: the
    task's ``governor_key`` when the caller has it at hand (else it is looked up)."""
    if key is None:
        key = option(task, "governor_key")
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
    if (
        key is not None
        and getattr(task, "governor_limit", None) is None
        and getattr(task, "governor_concurrency", None) is None
    ):
        raise ConfigError(
            f"task {task.name!r}: governor_key needs governor_limit (the rules) or "
            "governor_concurrency (a cap), or both"
        )
    name = getattr(task, "governor_name", None)
    if name is not None:
        check_name(f"task {task.name!r} governor_name", name)
    cost = option(task, "governor_cost", 1)
    if (
        not callable(cost)
        and not isinstance(cost, Mapping)
        and (isinstance(cost, bool) or not isinstance(cost, int) or cost < 1)
    ):
        raise ConfigError(
            f"task {task.name!r}: governor_cost must be a positive integer, units per meter "
            f"or a callable, got {cost!r}"
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
