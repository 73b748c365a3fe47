"""The worker app bench/upstream.py runs on separate worker nodes (configured from the
environment). Each task calls the HTTP upstream at GU_URL once and records the outcome.

GU_BROKER / GU_STORE / GU_RECORD   Redis URLs;  GU_KEY  record key prefix;  GU_QUEUE  the queue
GU_MODE   "retry": on a 429, ``self.retry(countdown=GU_COUNTDOWN)`` (a guess, what people
          write without feedback); "backoff": ``raise Backoff.from_response``; "adaptive": the
          same under an adaptive limit
GU_RULES  the queue's rules (the app's guess at the upstream's quota)
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import redis
from celery import Celery, Task

from governor.celery import Backoff, Governor

app = Celery("upstream_app", broker=os.environ.get("GU_BROKER", "redis://127.0.0.1:6379/0"))
MODE = os.environ.get("GU_MODE", "backoff")
QUEUE = os.environ.get("GU_QUEUE", "celery")
KEY = os.environ.get("GU_KEY", "gu")
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=4,
    governor_redis_url=os.environ.get("GU_STORE"),
    governor_prefix=KEY,
    governor_queues={
        QUEUE: {"rules": os.environ.get("GU_RULES", "40/s"), "adaptive": MODE == "adaptive"}
    },
)
Governor(app)
_record = redis.Redis.from_url(os.environ.get("GU_RECORD", "redis://127.0.0.1:6379/3"))


@app.task(bind=True, name="upstream_app.call", max_retries=None)
def call(self: Task, n: int) -> None:
    try:
        urllib.request.urlopen(os.environ["GU_URL"], timeout=5).close()
    except urllib.error.HTTPError as exc:
        if exc.code != 429:
            raise
        if MODE == "retry":
            raise self.retry(countdown=float(os.environ.get("GU_COUNTDOWN", "1"))) from None
        raise Backoff.from_response(exc) from None
    _record.rpush(f"{KEY}:done", json.dumps([time.time(), n, self.request.retries]))
