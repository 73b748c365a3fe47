"""The worker app bench/fairness.py runs on separate worker nodes (configured from the
environment): a no-op task per tenant's call, recording when it started.

GF_BROKER / GF_STORE / GF_RECORD   Redis URLs;  GF_KEY  record key prefix;  GF_QUEUE  the queue
GF_RULES  the queue's rules;  GF_FAIR  "1": fair_by="customer" (with GF_WEIGHTS, JSON), else FIFO
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery, Task

from governor.celery import Governor

app = Celery("fairness_app", broker=os.environ.get("GF_BROKER", "redis://127.0.0.1:6379/0"))
QUEUE = os.environ.get("GF_QUEUE", "celery")
KEY = os.environ.get("GF_KEY", "gf")
limit: dict[str, object] = {"rules": os.environ.get("GF_RULES", "20/s")}
if os.environ.get("GF_FAIR") == "1":
    limit.update(fair_by="customer", weights=json.loads(os.environ.get("GF_WEIGHTS", "{}")))
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=4,
    governor_redis_url=os.environ.get("GF_STORE"),
    governor_prefix=KEY,
    governor_queues={QUEUE: limit},
)
Governor(app)
_record = redis.Redis.from_url(os.environ.get("GF_RECORD", "redis://127.0.0.1:6379/3"))


@app.task(bind=True, name="fairness_app.report")
def report(self: Task, customer: str, n: int, sent: float) -> None:
    _record.rpush(f"{KEY}:runs", json.dumps([time.time(), customer, n, sent]))
