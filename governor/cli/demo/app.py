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
argument: ``t``, when its body started (this machine's clock), and ``counted``, when governor's
rules counted its admission (Redis's clock, from the ``task_admitted`` signal's
``counted_at``), so the demo can check that no window of any rule ever counted more admissions
than allowed (the bodies start a varying moment later: their own windows are only shown)::

    {"n": 17, "t": 1718000000.1235, "counted": 1718000000.1229, "waits": 1,
     "node": "demo1-ab12cd@host", "pid": 4242}
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import worker_ready

from ...celery import Governor, signals
from .processes import TASK

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
_counted: dict[str, float | None] = {}
"""``counted_at`` of the admissions of this process whose body has not started yet, by task id."""


def recorder() -> redis.Redis:
    """The Redis client records go to (made on first use; redis-py reconnects after a fork)."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(STORE)
    return _client


@signals.task_admitted.connect  # type: ignore[untyped-decorator]
def _admitted(
    sender: Any = None, request: Any = None, counted_at: float | None = None, **_: Any
) -> None:
    """Sent by the gate in the pool process right before the body, which picks it up."""
    if getattr(sender, "name", None) == TASK and request is not None:
        if len(_counted) > 1000:  # admitted bodies that never ran (none expected)
            _counted.clear()
        _counted[str(request.id)] = counted_at


@governor.task(RULES, name=TASK, bind=True, shared=False)
def call(self: Task, record: str, n: int) -> None:
    """A no-op call: appends its start to the Redis list ``record``."""
    started = time.time()
    counted = _counted.pop(str(self.request.id), None)
    waits = ((self.request.headers or {}).get("governor") or {}).get("waits", 0)
    node, pid = self.request.hostname, os.getpid()
    entry = {"n": n, "t": started, "counted": counted, "waits": waits, "node": node, "pid": pid}
    recorder().rpush(record, json.dumps(entry))


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(sender: Any = None, **_: Any) -> None:
    ready = os.environ.get("GOVERNOR_DEMO_READY")
    if ready and sender is not None and getattr(sender, "app", None) is app:
        recorder().sadd(ready, str(sender.hostname))
