"""The worker app bench/concurrency.py runs on separate worker nodes (configured from the
environment). Each task body sleeps, then records when it started and ended.

GC_BROKER / GC_STORE / GC_RECORD   Redis URLs;  GC_KEY   record key prefix
GC_MODE     "governor": a queue cap of GC_CAP (governor_queues); "retry": a hand-written
            semaphore (INCR up to GC_CAP, else ``self.retry(countdown=GC_RETRY)``), what people
            write without governor
GC_CAP      slots;  GC_SLEEP  seconds each body sleeps;  GC_QUEUE  the queue
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, Task

app = Celery("concurrency_app", broker=os.environ.get("GC_BROKER", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True, broker_connection_retry_on_startup=True, worker_prefetch_multiplier=4
)
MODE = os.environ.get("GC_MODE", "governor")
CAP = int(os.environ.get("GC_CAP", "3"))
SLEEP = float(os.environ.get("GC_SLEEP", "0.3"))
QUEUE = os.environ.get("GC_QUEUE", "celery")
KEY = os.environ.get("GC_KEY", "gc")
_record = redis.Redis.from_url(os.environ.get("GC_RECORD", "redis://127.0.0.1:6379/3"))
_store = redis.Redis.from_url(os.environ.get("GC_STORE", "redis://127.0.0.1:6379/2"))

if MODE == "governor":
    from governor.celery import Governor, signals

    app.conf.update(
        governor_redis_url=os.environ["GC_STORE"],
        governor_queues={QUEUE: {"concurrency": CAP}},
        governor_prefix=KEY,
    )
    Governor(app)

    @signals.slot_acquired.connect
    def _handover(sender: Any = None, handover: float | None = None, **_: Any) -> None:
        if handover is not None:
            _record.rpush(f"{KEY}:handover", handover)


@app.task(bind=True, name="concurrency_app.work", max_retries=None)
def work(self: Task, n: int) -> None:
    if MODE == "retry":
        slots = f"{KEY}:slots"
        if _store.incr(slots) > CAP:
            _store.decr(slots)
            raise self.retry(countdown=float(os.environ.get("GC_RETRY", "0.5")))
    start = time.time()
    try:
        time.sleep(SLEEP)
        end = time.time()
    finally:
        if MODE == "retry":
            _store.decr(f"{KEY}:slots")
    _record.rpush(
        f"{KEY}:ends", json.dumps([start, end, n, self.request.retries, self.request.hostname])
    )
