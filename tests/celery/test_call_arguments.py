"""call_with_arguments names a task's arguments for key functions, fair limits and callable
costs without inspecting the task's signature on every call: the names must be those
``inspect.Signature.bind`` gives, on every kind of signature, and a call that does not bind
must fall back as before."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pytest

from governor.celery.config.task_limits import call_with_arguments


def reference(task: Any, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What call_with_arguments did before its signatures were kept (inspect every call)."""
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


class Task:
    def __init__(self, run: Any) -> None:
        self.run = run


def everything(x, y=2, *, z=3, **kw): ...


def two(x, y): ...


def positional_only(x, /, y=1): ...


def star(*args, **kw): ...


def star_then_keyword(x, *args, y=1): ...


def nothing(): ...


class Bound:
    def method(self, x, y=5): ...


RUNS = [
    everything,
    two,
    positional_only,
    star,
    star_then_keyword,
    nothing,
    Bound().method,
    functools.wraps(everything)(lambda *a, **k: None),  # as patches.wrap_run leaves it
]
CALLS = [
    ((), {}),
    ((1,), {}),
    ((1, 2), {}),
    ((1, 2, 3), {}),
    ((1,), {"y": 4}),
    ((), {"x": 1}),
    ((1,), {"x": 1}),
    ((1,), {"z": 9, "q": 8}),
    ((1,), {"kw": 7}),
    ((), {"y": 2}),
]


def grab(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


@pytest.mark.parametrize("run", RUNS)
def test_arguments_are_named_as_the_signature_binds_them(run: Any) -> None:
    task = Task(run)
    for args, kwargs in CALLS:
        for _ in range(2):  # worked out, then kept
            assert call_with_arguments(task, grab, args, kwargs) == reference(
                task, grab, args, kwargs
            ), (args, kwargs)
