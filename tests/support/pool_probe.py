"""What the pool and broker tests add to tests/support/worker_app.py's nodes.

A node imports this module when its app's ``imports`` setting names it (``conf={"imports":
["pool_probe"]}`` in :class:`worker_nodes.Nodes`), after Celery applied its pool's monkey
patches. It records, beside worker_app's ``runs`` and ``ends``:

- ``<GT_KEY>:counted``: every admission as governor's rules counted it, on Redis's clock
  (``task_admitted``'s ``counted_at``): ``{"id", "counted", "queue", "node"}``;
- ``<GT_KEY>:deferred``: every deferral and parking, ``{"id", "t", "node", "parked", "delay",
  "capped"}``;
- ``<GT_KEY>:received``: every message a node's consumer received, ``{"id", "t", "node",
  "args", "eta", "governor"}`` (the governor header it carried);

and adds two tasks:

- ``pool_probe.hold``: the body holds a slot of a plain :class:`governor.Concurrency` cap (1 at
  once), waiting for it in ``BLPOP`` as user code may; then runs as ``worker_app.noop``;
- ``pool_probe.block``: keeps the process busy without yielding for a while (what a watch of
  the hub must see).

Under a green pool (gevent, eventlet) it also watches the hub from a green thread of the worker
process: a loop that sleeps :data:`TICK` seconds and notes its longest gap between wake-ups
(a greenlet that blocks the hub stretches it), with the OS threads of the process (green
threads are not among them; gevent's own thread pool is left out) and the connections of
governor's Redis client. Every :data:`REPORT` seconds it appends ``{"t", "gap", "threads",
"redis"}`` to ``<GT_KEY>:hub`` (the gap since the previous note; ``redis``: the most
connections the client had since then).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from celery import Task
from celery.signals import task_received, worker_ready
from worker_app import KEY, SLEEP, _record, _run, app, governor

from governor import Concurrency
from governor.celery import signals

TICK = 0.01
REPORT = 0.5
_direct: Concurrency | None = None


def _cap() -> Concurrency:
    global _direct
    if _direct is None:
        _direct = Concurrency(governor.gate.client, 1, name=f"{KEY}-direct", lease=10.0)
    return _direct


@app.task(bind=True, name="pool_probe.hold")
def hold(self: Task, n: int) -> None:
    with _cap().hold("all", timeout=120):
        _run(self, n)
        if not SLEEP:
            time.sleep(0.1)


@app.task(bind=True, name="pool_probe.block")
def block(self: Task, seconds: float) -> None:
    """Keep the process busy for ``seconds`` in a loop that never yields."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    _run(self, -1)


@signals.task_admitted.connect
def _counted(
    sender: Any = None, request: Any = None, counted_at: float | None = None, **_: Any
) -> None:
    if request is None or counted_at is None:
        return
    note = {
        "id": request.id,
        "counted": counted_at,
        "queue": (request.delivery_info or {}).get("routing_key"),
        "node": request.hostname,
    }
    _record.rpush(f"{KEY}:counted", json.dumps(note))


@signals.task_deferred.connect
def _deferred(
    sender: Any = None,
    request: Any = None,
    delay: float | None = None,
    capped: str | None = None,
    **_: Any,
) -> None:
    if request is not None:
        note = {
            "id": request.id,
            "t": time.time(),
            "node": request.hostname,
            "parked": False,
            "delay": delay,
            "capped": capped,
        }
        _record.rpush(f"{KEY}:deferred", json.dumps(note))


@signals.task_parked.connect
def _parked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        note = {"id": request.id, "t": time.time(), "node": request.hostname, "parked": True}
        _record.rpush(f"{KEY}:deferred", json.dumps(note))


@task_received.connect
def _received(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        note = {
            "id": request.id,
            "t": time.time(),
            "node": request.hostname,
            "args": list(request.args or ()),
            "eta": str(request.eta) if request.eta else None,
            "governor": (request.request_dict.get("governor") or None),
        }
        _record.rpush(f"{KEY}:received", json.dumps(note, default=str))


def green() -> str | None:
    """Which library made this process's threads green ("gevent", "eventlet"), or None."""
    if "gevent.monkey" in sys.modules:
        from gevent import monkey

        if monkey.is_module_patched("threading"):
            return "gevent"
    if "eventlet.patcher" in sys.modules:
        from eventlet import patcher

        if patcher.is_monkey_patched("thread"):
            return "eventlet"
    return None


def _os_threads() -> int:
    """The OS threads of this process, less those of gevent's own thread pool (its resolver
    and ``gevent.threadpool`` run there)."""
    count = len(os.listdir("/proc/self/task"))
    if green() == "gevent":
        import gevent

        count -= gevent.get_hub().threadpool.size
    return count


def _connections() -> int:
    """The connections governor's Redis client holds in this process (in use or idle)."""
    pool = governor.gate.client.connection_pool
    return len(getattr(pool, "_available_connections", [])) + len(
        getattr(pool, "_in_use_connections", [])
    )


def _watch_hub() -> None:
    gap, connections = 0.0, 0
    last = reported = time.monotonic()
    while True:
        time.sleep(TICK)  # green: the hub wakes this thread, if nothing blocks it
        now = time.monotonic()
        gap, last = max(gap, now - last), now
        connections = max(connections, _connections())
        if now - reported >= REPORT:
            note = {"t": time.time(), "gap": gap, "threads": _os_threads(), "redis": connections}
            _record.rpush(f"{KEY}:hub", json.dumps(note))
            gap, connections = 0.0, 0
            last = reported = time.monotonic()


@worker_ready.connect
def _start_watch(sender: Any = None, **_: Any) -> None:
    if green() is not None:  # threading.Thread makes a green thread now: it runs on the hub
        threading.Thread(target=_watch_hub, name="hub-watch", daemon=True).start()
