"""Helpers for tests that run real Celery workers against the suite's Redis."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop

from governor.plan import most_in_window

__all__ = [
    "Recorder",
    "first_at_once",
    "most_at_once",
    "most_in_window",
    "new_app",
    "wait_for",
    "worker",
]


def new_app(redis_url: str, queue: str, **conf: Any) -> Celery:
    """A fresh app: broker on db 1, governor state on db 2, no result backend."""
    base = redis_url.rsplit("/", 1)[0]
    app = Celery(f"test-{uuid.uuid4().hex[:8]}", broker=f"{base}/1")
    app.conf.update(
        {
            "task_default_queue": queue,
            "governor_redis_url": f"{base}/2",
            "governor_prefix": f"gt{uuid.uuid4().hex[:8]}",
            "task_ignore_result": True,
            "broker_connection_retry_on_startup": True,
            "worker_hijack_root_logger": False,
            **conf,
        }
    )
    return app


class Recorder:
    """Tasks append what they saw to a Redis list; the test reads it back."""

    def __init__(self, redis_url: str) -> None:
        base = redis_url.rsplit("/", 1)[0]
        self.client = redis.Redis.from_url(f"{base}/3")
        self.key = f"record:{uuid.uuid4().hex}"

    def add(self, **fields: Any) -> None:
        self.client.rpush(self.key, json.dumps({"t": time.time(), **fields}, default=str))

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.client.lrange(self.key, 0, -1)]

    def wait(self, count: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.client.llen(self.key) >= count:
                return self.all()
            time.sleep(0.05)
        return self.all()


@contextmanager
def worker(
    app: Celery, queues: list[str], concurrency: int = 4, pool: str = "threads"
) -> Iterator[None]:
    # a new event loop for each in-process worker: Celery < 5.7 gave every later worker of the
    # process the first one's loop, whose timer is not the later worker's, so its ETA tasks
    # (every governed deferral) never ran
    set_event_loop(None)
    with start_worker(
        app,
        pool=pool,
        concurrency=concurrency,
        perform_ping_check=False,
        queues=queues,
        loglevel="WARNING",
        shutdown_timeout=10,
    ):
        yield


def most_at_once(intervals: list[dict[str, Any]]) -> int:
    """The most intervals ({"start", "end"}) covering one moment (an end before a start at
    the same instant)."""
    events = sorted([(i["start"], 1) for i in intervals] + [(i["end"], -1) for i in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def first_at_once(intervals: list[dict[str, Any]], count: int, after: float) -> float | None:
    """The first moment after ``after`` that ``count`` intervals cover, or None."""
    events = sorted([(i["start"], 1) for i in intervals] + [(i["end"], -1) for i in intervals])
    running = 0
    for t, change in events:
        running += change
        if running >= count and t > after:
            return float(t)
    return None


def config_error(redis_url: str, **conf: Any) -> str:
    """The ``ConfigError`` a governed app with settings ``conf`` raises when it finalizes."""
    import pytest

    from governor import ConfigError
    from governor.celery import Governor

    app = new_app(redis_url, "q", **conf)
    Governor(app)
    with pytest.raises(ConfigError) as info:
        app.finalize()
    return str(info.value)


def wait_for(
    read: Callable[[], Any], done: Callable[[Any], bool], timeout: float, every: float = 0.1
) -> Any:
    """Read until ``done(value)`` or ``timeout`` seconds pass; returns the last value read (the
    caller asserts on it, so a wait that times out fails there and never hangs)."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(every)
        value = read()
    return value


def limits_app(url: str, prefix: str, name: str, module: str) -> Celery:
    """A Celery app with a queue quota (``emails``), a whole-task limit (task ``<name>.sync``)
    and a per-key limit (``partner-api``, task ``<module>.call_partner``): what the CLI and
    dashboard tests show."""
    from governor.celery import Governor

    app = Celery(f"{name}app-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.governor_redis_url = url
    app.conf.governor_prefix = prefix
    app.conf.governor_queues = {"emails": "10/s"}
    governor = Governor(app)

    @governor.task(
        "5/s, 200/h",
        key=lambda customer_id, **_: customer_id,
        limit_name="partner-api",
        name=f"{module}.call_partner",
        shared=False,
    )
    def call_partner(customer_id: str) -> None: ...

    @app.task(name=f"{name}.sync", governor_limit="3/m", shared=False)  # type: ignore[untyped-decorator]
    def sync() -> None: ...

    return app
