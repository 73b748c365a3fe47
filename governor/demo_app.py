"""The Celery app ``governor demo`` runs on its worker nodes (part of the package, so the demo
works after a plain ``pip install -e '.[demo]'``). Configured from the environment:

=========================  ===================================================================
variable                   meaning
=========================  ===================================================================
``BROKER_URL``             the broker (the demo's Redis)
``GOVERNOR_REDIS_URL``     Redis for governor's counters and the demo's records
``GOVERNOR_PREFIX``        key prefix of governor's counters
``GOVERNOR_DEMO_RULES``    the limit on every call of :func:`call` (``20/s, 300/m``)
``GOVERNOR_DEMO_READY``    a Redis set each worker adds its node name to once it consumes
=========================  ===================================================================

Each call does nothing but append when it started to a Redis list named by its first
argument, so the demo can check that no window of any rule ever saw more starts than allowed::

    {"n": 17, "t": 1718000000.123456, "waits": 1, "node": "demo1-ab12cd@host", "pid": 4242}
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import worker_ready

from .celery import Governor

STORE = os.environ.get("GOVERNOR_REDIS_URL", "redis://localhost:6379/1")
RULES = os.environ.get("GOVERNOR_DEMO_RULES", "20/s, 300/m")

app = Celery("governor-demo", broker=os.environ.get("BROKER_URL", "redis://localhost:6379/0"))
app.conf.update(
    governor_redis_url=STORE,
    governor_prefix=os.environ.get("GOVERNOR_PREFIX", "governor"),
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)
governor = Governor(app)
_client: redis.Redis | None = None


def recorder() -> redis.Redis:
    """The Redis client records go to (made on first use; redis-py reconnects after a fork)."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(STORE)
    return _client


@governor.task(RULES, name="governor.demo.call", bind=True, shared=False)
def call(self: Task, record: str, n: int) -> None:
    """A no-op call: appends its start to the Redis list ``record``."""
    started = time.time()
    waits = ((self.request.headers or {}).get("governor") or {}).get("waits", 0)
    entry = {"n": n, "t": started, "waits": waits, "node": self.request.hostname}
    recorder().rpush(record, json.dumps({**entry, "pid": os.getpid()}))


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(sender: Any = None, **_: Any) -> None:
    ready = os.environ.get("GOVERNOR_DEMO_READY")
    if ready and sender is not None and getattr(sender, "app", None) is app:
        recorder().sadd(ready, str(sender.hostname))
