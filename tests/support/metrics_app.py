"""A Celery app for tests/celery/test_metrics.py, run as a separate `celery worker` (prefork).

Configured from the environment:

GM_BROKER   broker URL            GM_STORE    governor Redis URL
GM_RECORD   Redis URL for records GM_KEY      record key prefix
GM_QUEUE    the governed queue    GM_RULES    its quota
GM_PORT     metrics port          GM_PREFIX   governor key prefix

``metrics_app.job`` appends {"n", "waits", "pid"} to ``<GM_KEY>:runs``; failures go to
``<GM_KEY>:failures``. The metrics are installed from ``worker_init`` (as the
``governor_metrics_port`` setting will do once it is wired into ``Governor``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import task_failure, worker_init

from governor.celery import Governor, metrics

QUEUE = os.environ.get("GM_QUEUE", "metrics")
app = Celery("metrics_app", broker=os.environ.get("GM_BROKER", "redis://127.0.0.1:6379/1"))
app.conf.update(
    task_default_queue=QUEUE,
    governor_redis_url=os.environ.get("GM_STORE"),
    governor_prefix=os.environ.get("GM_PREFIX", "governor"),
    governor_queues={QUEUE: os.environ.get("GM_RULES", "4/s")},
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)
Governor(app)
_record = redis.Redis.from_url(os.environ.get("GM_RECORD", "redis://127.0.0.1:6379/3"))
KEY = os.environ.get("GM_KEY", "gm")


@app.task(bind=True, name="metrics_app.job")
def job(self: Task, n: int) -> None:
    gov = (self.request.headers or {}).get("governor") or {}
    _record.rpush(
        f"{KEY}:runs", json.dumps({"n": n, "waits": gov.get("waits", 0), "pid": os.getpid()})
    )


@task_failure.connect
def _failed(task_id: str | None = None, exception: Any = None, **_: Any) -> None:
    _record.rpush(f"{KEY}:failures", json.dumps({"id": task_id, "exc": repr(exception)}))


@worker_init.connect
def _serve_metrics(sender: Any = None, **_: Any) -> None:
    if getattr(sender, "app", None) is app and os.environ.get("GM_PORT"):
        metrics.install(app, int(os.environ["GM_PORT"]), "127.0.0.1", worker=sender)
