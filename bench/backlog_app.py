"""The worker app bench/backlog.py runs on separate worker nodes (configured from the
environment). Each task records when its body started, its governance waits and its retries.

GB_BROKER / GB_STORE / GB_RECORD   Redis URLs;  GB_KEY   record key
GB_QUEUES    JSON {queue: rules} for governor (empty: governor not installed)
GB_RATE      Celery's own rate_limit for the task (e.g. "20/s"), or empty
GB_PARK      governor_park_after (seconds)
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery, Task

app = Celery("backlog_app", broker=os.environ.get("GB_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True, broker_connection_retry_on_startup=True, worker_prefetch_multiplier=4
)
queues = json.loads(os.environ.get("GB_QUEUES", "{}"))
if queues:
    from governor.celery import Governor

    app.conf.update(
        governor_redis_url=os.environ["GB_STORE"],
        governor_queues=queues,
        governor_park_after=float(os.environ.get("GB_PARK", "10")),
    )
    Governor(app)
_record = redis.Redis.from_url(os.environ.get("GB_RECORD", "redis://127.0.0.1:6379/3"))
KEY = os.environ.get("GB_KEY", "gb")


@app.task(bind=True, name="backlog_app.call", rate_limit=os.environ.get("GB_RATE") or None)
def call(self: Task, n: int) -> None:
    gov = (self.request.headers or {}).get("governor") or {}
    _record.rpush(KEY, json.dumps([time.time(), n, gov.get("waits", 0), self.request.retries]))
