"""Helpers for tests that drive a pool process's gate in process (no worker): a request as
Celery's tracer pushes it, an admission under it, a count of the calls that take the long way."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery.app.task import Context

from governor.celery.admission.gate import Gate

__all__ = ["LongWay", "admit", "request"]


def request(q: str, headers: dict[str, Any] | None = None, **info: Any) -> Context:
    """A pool process's request for a message from queue ``q``, as Celery's tracer pushes it."""
    task_id = str(uuid.uuid4())
    return Context(
        {
            "id": task_id,
            "delivery_info": {"exchange": "", "routing_key": q, "redelivered": False, **info},
            "headers": headers,
            "hostname": "test@host",
        },
        args=(),
        kwargs={},
        called_directly=False,
    )


def admit(gate: Gate, task: Any, req: Context, **kwargs: Any) -> Any:
    task.request_stack.push(req)
    try:
        return gate.admit(task, (), kwargs)
    finally:
        task.request_stack.pop()


class LongWay:
    """Counts the calls that take the gate's long way (Calls.call)."""

    def __init__(self, gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        call = gate.calls.call

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return call(*args, **kwargs)

        monkeypatch.setattr(gate.calls, "call", counting)
