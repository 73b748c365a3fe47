"""Faults of worker nodes and of the broker connection (tests/nodes/test_faults_nodes.py,
bench/faults.py), measured as in tests/support/faults.py on its backlog (``TASKS`` tasks under
``RULE``, long waits parked in the governor's Redis, which stays up, 2 nodes x 2 processes);
unacknowledged messages come back after a short visibility timeout (``BROKER``).

- ``node-kill``: a node is SIGKILLed (main and pool processes) 1.5 s in, when none of its
  tasks ran or was deferred without being acknowledged (that one would run again: at least
  once); the other node carries on (``-replace``: and a new one starts);
- ``releaser-kill``: a node dies as its releaser, holding a release lease, publishes a parked
  task (after or ``-before``; GT_KILL_ON); it consumes only the side queue, so the lease is
  all it holds; the other releaser takes the entries when the lease ends;
- ``broker-drop``: the broker connection drops for 3 s (``Proxy``; the broker keeps running),
  from 1.5 s in, as a worker acknowledges a task (``-ack``) or re-publishes one (``-publish``).

Each waits until every task ran and none is left on the broker or parked.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from governor.embedded import EmbeddedRedis, free_port

from .faults import FAULT_AT, RULE, TASKS, Outcome, _conf, measure
from .worker_nodes import Nodes

BROKER = {"visibility_timeout": 5, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
"""5 s: well above how long a live worker holds a message (an ETA: 1 s at most)."""
DROP = 3.0
SETTLE = 0.3
DROP_VISIBILITY = 12
"""Above how long a worker cannot acknowledge in ``broker-drop`` (the drop, then Celery's
reconnect backoff: 2 s, 4 s); with 5 s what ran during the drop ran twice."""
EVENTS = {
    "could not re-publish": "re-publish failed",
    "Couldn't ack": "ack lost",
    "delivered again after it ran": "redelivery dropped",
    "releasing parked tasks failed": "release failed",
    "second copy of a released": "second copy dropped",
}
"""What the nodes' logs tell (in the row's note)."""


def run_nodes(
    name: str,
    broker: str,
    record: str,
    inject: Callable[[Nodes, Watch, float], float],
    kill_on: str = "",
    watch: str | None = None,
    visibility: float = 5,
    conf: dict[str, Any] | None = None,
    extras: int = 0,
) -> Outcome:
    """faults.run with the nodes at hand: ``inject(nodes, watch, published)`` returns when the
    fault began; ``kill_on``: the first node's GT_KILL_ON (it takes only the side queue);
    ``watch``: the broker's own URL; ``extras``: tasks sent to the side queue."""
    queue, prefix = f"fn-{uuid.uuid4().hex[:6]}", f"gt{uuid.uuid4().hex[:8]}"
    queues = {queue: f"{RULE}/s", f"{queue}-x": "1/600ms"}
    options = {**BROKER, "visibility_timeout": visibility}
    settings = _conf(prefix, {"broker_transport_options": options, **(conf or {})})
    with EmbeddedRedis() as store:
        nodes = Nodes(broker, store.url(2), record, queues, conf=settings)
        check = Watch(watch or broker, store.url(2), prefix, queue)
        try:
            nodes.env["GT_KILL_ON"] = kill_on
            nodes.start(1, concurrency=2, queues=list(queues)[1 if kill_on else 0 :])
            nodes.env["GT_KILL_ON"] = ""
            nodes.start(1, concurrency=2, queues=list(queues))
            started = time.time()
            nodes.publish(queue, TASKS)
            fault = inject(nodes, check, started)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                if len({r["n"] for r in nodes.runs()}) >= TASKS + extras and check.left() == 0:
                    break
                time.sleep(0.2)
            runs = nodes.runs()
        finally:
            nodes.stop()
            check.close()
    out = measure(name, [r for r in runs if r["n"] < TASKS], started, fault)
    side = [r["n"] for r in runs if r["n"] >= TASKS]  # counted as lost or twice too
    out.lost, out.twice = out.lost + extras - len(set(side)), out.twice + len(side) - len(set(side))
    log = nodes.log_text()
    events = [f"{log.count(k)} {v}" for k, v in EVENTS.items() if k in log]
    out.note = ", ".join(check.notes + events)
    return out


class Watch:
    """A scenario's task ids on the broker (kombu's Redis transport: queue lists, ``unacked``
    hash), its parked envelopes."""

    def __init__(self, broker: str, store: str, prefix: str, queue: str) -> None:
        self.broker = redis.Redis.from_url(broker, socket_timeout=5)
        self.store = redis.Redis.from_url(store, socket_timeout=5)
        self.parked = f"{prefix}:{{parked}}:"
        self.queue = queue
        self.notes: list[str] = []

    def messages(self) -> tuple[list[str], list[str], str]:
        unacked = [json.loads(v) for v in self.broker.hvals("unacked")]
        ours = [m for m, _, key in unacked if key.startswith(self.queue)]
        queued = [
            json.loads(m)
            for key in self.broker.scan_iter(match=f"{self.queue}*", _type="list")
            for m in self.broker.lrange(key, 0, -1)
        ]
        parked = b" ".join(self.store.hvals(self.parked + "msgs")).decode()
        return [m["headers"]["id"] for m in ours], [m["headers"]["id"] for m in queued], parked

    def left(self) -> int:
        """How many may still run (-1: unknown)."""
        try:
            unacked, queued, _ = self.messages()
            parked = sum(int(self.store.zcard(self.parked + k)) for k in ("due", "lease"))
        except redis.RedisError:
            return -1
        return len(unacked) + len(queued) + parked

    def at_risk(self, ran: set[str]) -> bool:
        """An unacknowledged message ran, or has another copy (it would run again)."""
        unacked, queued, parked = self.messages()
        copies = unacked + queued
        return any(i in ran or copies.count(i) > 1 or i in parked for i in unacked)

    def close(self) -> None:
        self.broker.close()
        self.store.close()


def _killpg(nodes: Nodes, index: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(nodes.procs[index].pid, signal.SIGKILL)
    nodes.procs[index].wait(10)


def node_kill(broker: str, record: str, replace: bool = False) -> Outcome:
    """SIGKILL a node 1.5 s in, stopped (SIGSTOP) with nothing at risk."""

    def inject(nodes: Nodes, check: Watch, published: float) -> float:
        time.sleep(max(0.0, published + FAULT_AT - time.time()))
        deadline = time.monotonic() + 10
        nodes.pause(0)
        while time.monotonic() < deadline and check.at_risk({r["id"] for r in nodes.runs()}):
            nodes.resume(0)
            time.sleep(0.02)
            nodes.pause(0)
        fault = time.time()
        _killpg(nodes, 0)
        if replace:
            nodes.start(1, concurrency=2, queues=[check.queue, f"{check.queue}-x"])
        return fault

    what = ", a new node starts" if replace else ""
    return run_nodes(f"worker node SIGKILLed mid-backlog{what}", broker, record, inject)


def releaser_kill(broker: str, record: str, moment: str = "release-after") -> Outcome:
    """A node dies as its releaser publishes a parked task (its pool next)."""

    def inject(nodes: Nodes, check: Watch, published: float) -> float:
        nodes.procs[0].wait(30)  # TimeoutExpired: its releaser released nothing
        fault = time.time()
        _killpg(nodes, 0)
        check.notes.append(f"{check.store.zcard(check.parked + 'lease')} leased")
        return fault

    name = f"worker node killed holding a release lease ({moment[8:]} publishing)"
    conf = {"governor_release_lease": 2.0}
    return run_nodes(name, broker, record, inject, kill_on=moment, conf=conf)


class Proxy:
    """A TCP proxy to a local port. ``drop()``: requests stop reaching the server, ``SETTLE`` s
    later every connection closes and new ones are refused for ``DROP`` s; the server keeps
    running. With ``match`` set, a request it accepts starts a drop. ``delay(by, window)``:
    what the server sends in the next ``window`` s reaches the clients ``by`` s late."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.up = self.closed = self.holding = False
        self.match: Callable[[bytes], bool] | None = None
        self.dropped = 0.0
        self.delayed = (0.0, 0.0, 0.0)
        """(from, until, by): replies the server sends between from and until (Unix seconds)
        reach the clients ``by`` s late."""
        self._listen()

    def delay(self, by: float, window: float) -> tuple[float, float]:
        """From now, for ``window`` s, every reply and message the server sends reaches its
        client ``by`` s late, in order (what follows it queues behind it); connections stay
        open and requests go through at once. Returns the window (Unix seconds)."""
        start = time.time()
        self.delayed = (start, start + window, by)
        return start, start + window

    def _listen(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.settimeout(0.1)
        self.up = True
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        with listener:
            while self.up:
                try:
                    client, _ = listener.accept()
                    server = socket.create_connection(("127.0.0.1", self.target), 5)
                except OSError:
                    continue
                with self.lock:
                    self.conns += [client, server]
                    if not self.up:
                        self._cut()
                        continue
                late: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
                threading.Thread(target=self._late, args=(late, client), daemon=True).start()
                for src, dst in ((client, server), (server, client)):
                    src.settimeout(None)
                    args = (src, dst, src is client, late)
                    threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        upstream: bool,
        late: queue.SimpleQueue[tuple[float, bytes] | None],
    ) -> None:
        try:
            while data := src.recv(65536):
                if not upstream:
                    late.put((time.time(), data))  # sent by _late, when its delay is over
                elif not self._held(data):
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            if not upstream:
                late.put(None)
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            src.close()

    def _late(
        self, late: queue.SimpleQueue[tuple[float, bytes] | None], client: socket.socket
    ) -> None:
        """Send what the server sent to ``client``, in order, each piece ``by`` s after it came
        when it came within a delay's window (see :meth:`delay`)."""
        while (item := late.get()) is not None:
            came, data = item
            start, until, by = self.delayed
            if start <= came < until:
                time.sleep(max(0.0, came + by - time.time()))
            try:
                client.sendall(data)
            except OSError:
                return

    def _held(self, data: bytes) -> bool:
        """Keep a request from the server: one that starts a drop, and while it settles all but
        kombu recording a message it took (BRPOP, then ZADD: a drop between loses it)."""
        if self.holding:
            return b"ZADD" not in data or b"unacked_index" not in data
        with self.lock:
            if self.match is None or not self.match(data):
                return False
            self.match, self.holding = None, True
        threading.Thread(target=self.drop, daemon=True).start()
        return True

    def _cut(self) -> None:
        """Refuse new connections (the listener closes in 0.1 s), close open ones."""
        self.up, conns, self.conns = False, self.conns, []
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        self.dropped, self.holding = time.time(), True
        time.sleep(SETTLE)
        with self.lock:
            self._cut()
        time.sleep(DROP)
        self.holding = False
        if not self.closed:
            self._listen()

    def close(self) -> None:
        self.closed, self.match = True, None
        with self.lock:
            self._cut()


TRIGGERS: dict[str, Callable[[bytes], bool]] = {
    "ack": lambda data: b"ZREM" in data and b"unacked_index" in data and b"PUSH" not in data,
    "publish": lambda data: b"LPUSH" in data[:40] and b'"parked": null' in data,
}
"""kombu's Redis ack; a deferred copy published (a released one carries its parking id)."""


def broker_drop(broker: str, record: str, on: str) -> Outcome:
    """The broker connection drops, from 1.5 s in, at the next ack (``on="ack"``) or as a
    worker re-publishes a deferred task (``on="publish"``: two tasks sent to the side queue,
    1/600ms; the second waits under 1 s, a short ETA through the broker)."""
    with EmbeddedRedis() as server:
        proxy = Proxy(server.port)

        def inject(nodes: Nodes, check: Watch, published: float) -> float:
            time.sleep(max(0.0, published + FAULT_AT - time.time()))
            proxy.match = TRIGGERS[on]
            if on == "publish":
                nodes.send(f"{check.queue}-x", "worker_app.noop", [(TASKS,), (TASKS + 1,)])
            deadline = time.monotonic() + 20
            while not proxy.dropped:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no {on} in 20 s")
                time.sleep(0.005)
            return proxy.dropped

        what = {"ack": "a task is acknowledged", "publish": "a deferral is re-published"}[on]
        name = f"broker connection drops {DROP:g} s as {what}"
        url, watch = f"redis://127.0.0.1:{proxy.port}/1", server.url(1)
        extras = 2 if on == "publish" else 0
        try:
            return run_nodes(
                name, url, record, inject, watch=watch, visibility=DROP_VISIBILITY, extras=extras
            )
        finally:
            proxy.close()


SCENARIOS: dict[str, Callable[[str, str], Outcome]] = {
    "node-kill": node_kill,
    "node-kill-replace": lambda b, r: node_kill(b, r, replace=True),
    "releaser-kill": releaser_kill,
    "releaser-kill-before": lambda b, r: releaser_kill(b, r, moment="release-before"),
    "broker-drop-ack": lambda b, r: broker_drop(b, r, on="ack"),
    "broker-drop-publish": lambda b, r: broker_drop(b, r, on="publish"),
}
