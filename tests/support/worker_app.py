"""A Celery app for tests that run separate `celery worker` processes.

Configured from the environment so one module serves every scenario:

GT_BROKER      broker URL              GT_STORE       governor Redis URL
GT_RECORD      Redis URL for records   GT_KEY         record key prefix
GT_QUEUES      JSON {queue: rules}     GT_CONF        JSON of extra app.conf settings
GT_SLEEP       seconds each task body sleeps (default 0)
GT_UPSTREAM    URL the ``worker_app.upstream`` task calls (HTTP 429/503: it raises Backoff)
GT_KILL_ON     "deferred": SIGKILL this worker right after a deferral is re-published (before
               the original is acknowledged); "publish": right before it is re-published;
               "release-before" / "release-after": right before / after its releaser publishes
               a parked task (before the parked entry is removed)

Each task body appends {"id", "t", "c", "n", "waits", "retries", "pid", "node"} to ``<GT_KEY>:runs``
when it starts (``t``: the body's start; ``c``: when the rules counted its admission, on Redis's
clock: ``task_admitted``'s ``counted_at``, what the rules hold on) and, with GT_SLEEP, {"id",
"start", "end", "pid", "node"} to ``<GT_KEY>:ends`` when it ends; failures go to
``<GT_KEY>:failures``; ``worker_ready`` adds the node to ``<GT_KEY>:ready``. Concurrency slots:
hand-over latencies go to ``<GT_KEY>:handover``, lost slots to ``<GT_KEY>:lost``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import (
    after_task_publish,
    before_task_publish,
    task_failure,
    worker_ready,
)

from governor.celery import Backoff, Governor, signals

app = Celery("worker_app", broker=os.environ.get("GT_BROKER", "redis://127.0.0.1:6379/1"))
app.conf.update(
    governor_redis_url=os.environ.get("GT_STORE"),
    governor_queues=json.loads(os.environ.get("GT_QUEUES", "{}")),
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=4,
    **json.loads(os.environ.get("GT_CONF", "{}")),
)
governor = Governor(app)
_record = redis.Redis.from_url(os.environ.get("GT_RECORD", "redis://127.0.0.1:6379/3"))
KEY = os.environ.get("GT_KEY", "gt")
SLEEP = float(os.environ.get("GT_SLEEP", "0"))


@app.task(bind=True, name="worker_app.noop")
def noop(self: Task, n: int) -> None:
    _run(self, n)


@app.task(bind=True, name="worker_app.upstream", max_retries=0)
def upstream(self: Task, n: int) -> None:
    """Call the HTTP upstream at GT_UPSTREAM; a 429 or 503 raises Backoff from its headers."""
    try:
        urllib.request.urlopen(os.environ["GT_UPSTREAM"], timeout=5).close()
    except urllib.error.HTTPError as exc:
        if exc.code in (429, 503):
            raise Backoff.from_response(exc) from None
        raise
    _run(self, n)


@app.task(bind=True, name="worker_app.report")
def report(self: Task, customer: str, n: int) -> None:
    """A tenant's call (fair limits: ``fair_by="customer"``)."""
    _run(self, n, customer=customer)


_counted: dict[str, float | None] = {}
"""``counted_at`` of this process's admissions whose body has not started yet, by task id."""


def _run(task: Task, n: int, **extra: Any) -> None:
    started = time.time()
    counted = _counted.pop(task.request.id, None)
    gov = (task.request.headers or {}).get("governor") or {}
    _record.rpush(
        f"{KEY}:runs",
        json.dumps(
            {
                "id": task.request.id,
                "t": started,
                "c": counted,
                "n": n,
                "waits": gov.get("waits", 0),
                "retries": task.request.retries,
                "pid": os.getpid(),
                "node": task.request.hostname,
                **extra,
            }
        ),
    )
    if SLEEP:
        time.sleep(SLEEP)
        _record.rpush(
            f"{KEY}:ends",
            json.dumps(
                {
                    "id": task.request.id,
                    "start": started,
                    "end": time.time(),
                    "pid": os.getpid(),
                    "node": task.request.hostname,
                }
            ),
        )


@task_failure.connect
def _failed(
    sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any
) -> None:
    _record.rpush(f"{KEY}:failures", json.dumps({"id": task_id, "exc": repr(exception)}))


@signals.task_admitted.connect
def _admitted(
    sender: Any = None,
    request: Any = None,
    lateness: float | None = None,
    counted_at: float | None = None,
    **_: Any,
) -> None:
    if request is not None:
        _counted[request.id] = counted_at  # the body picks it up (see _run)
    if lateness is not None:
        _record.rpush(f"{KEY}:lateness", lateness)


@signals.task_deferred.connect
def _deferred(sender: Any = None, delay: float = 0.0, **_: Any) -> None:
    _record.rpush(f"{KEY}:deferrals", json.dumps([time.time(), delay]))


@signals.slot_acquired.connect
def _slot(sender: Any = None, handover: float | None = None, **_: Any) -> None:
    if handover is not None:
        _record.rpush(f"{KEY}:handover", handover)


@signals.slot_lost.connect
def _slot_lost(limit: str = "", holder: str = "", **_: Any) -> None:
    _record.rpush(f"{KEY}:lost", json.dumps([time.time(), limit, holder, os.getpid()]))


KILL_ON = os.environ.get("GT_KILL_ON", "")


@signals.task_deferred.connect
def _die_after_publish(**_: Any) -> None:
    if KILL_ON == "deferred":
        os.kill(os.getpid(), signal.SIGKILL)


def _released(headers: dict[str, Any] | None) -> bool:
    gov = (headers or {}).get("governor") or {}
    return bool(gov.get("parked"))


@before_task_publish.connect
def _die_before_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if KILL_ON == "publish" and headers and headers.get("governor") and not _released(headers):
        os.kill(os.getpid(), signal.SIGKILL)
    if KILL_ON == "release-before" and _released(headers):
        os.kill(os.getpid(), signal.SIGKILL)


@after_task_publish.connect
def _die_after_release(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if KILL_ON == "release-after" and _released(headers):
        os.kill(os.getpid(), signal.SIGKILL)


@worker_ready.connect
def _ready(sender: Any = None, **_: Any) -> None:
    _record.sadd(f"{KEY}:ready", f"{socket.gethostname()}:{os.getpid()}:{sender.hostname}")
