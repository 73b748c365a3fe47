"""A Redis Cluster master SIGKILLed under a governed backlog, for tests/support/faults.py: which
master (one serving parked tasks, the limit's key, or both), the kill itself, an optional
replication lag before it, and what the promoted replica never received. Right before the
SIGKILL the master pauses writes (``CLIENT PAUSE ... WRITE``) for the few ms it takes to read
its last state: to the workers that is the same as dying then.

The lag is real: the master's replica is stopped (SIGSTOP) and the master is given one value
larger than every socket buffer between them, so whatever it writes after that waits in its
output buffer, and SIGKILL drops it. The replica resumes, reads what had reached its socket and
sees the link close; only then is its copy of the limit's log read (it is still a replica).
The master's log is read an instant before the kill, under ``CLIENT PAUSE ... WRITE``, so it is
the last state the master had: the stamps it holds that the replica lacks are the admissions and
bookings lost in the lag (the limit has a second rule, ``1000/h``, that never binds but keeps
every stamp of the backlog in the log).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

from governor import Limiter
from governor.celery.waiting import parking

from .local_cluster import LocalCluster, command, until

__all__ = ["RULES", "ClusterKill", "Lost", "limit_key", "parking_keys", "pick"]

RULES = "10/s, 1000/h"
"""The backlog's limit: 10/s binds; 1000/h keeps every stamp in the log (see above)."""
WINDOW = 1.0
"""The binding rule's window (seconds)."""
PAUSE_MS = 10_000
"""``CLIENT PAUSE`` on the master before the kill (it dies long before this ends)."""


def limit_key(prefix: str, queue: str) -> str:
    """The key of the queue quota's log (a queue quota is limit ``queue``, the queue as subject)."""
    return Limiter(None, RULES, name="queue", prefix=prefix).keys(queue)[0]


def parking_keys(prefix: str, shards: int) -> list[tuple[str, str]]:
    """The "due" and "lease" keys of every group of parked tasks (one hash slot each)."""
    return [parking.keys(prefix, shard)[::2] for shard in parking.all_shards(shards)]


@dataclass(frozen=True)
class Lost:
    """What a master's SIGKILL took with it, as its promoted replica shows."""

    parked: int
    """Tasks parked on the killed master when it died (entries in its parking groups)."""
    writes: int
    """Stamps (admissions and bookings) of the killed master its replica never received."""
    ahead: int
    """Of those, the stamps no earlier than one window (1 s) before the first start after the
    kill: the only lost ones a window can share with the promoted replica's admissions (a task
    starts at or before its stamp), so the starts over the limit are at most these."""


def pick(
    cluster: LocalCluster, prefix: str, shards: int, parked_here: bool, limit_here: bool
) -> tuple[int, str]:
    """(master, queue): the master to kill and a queue whose limit key lives on it or not, as
    the server says (``CLUSTER KEYSLOT``, ``CLUSTER SLOTS``). ``parked_here``: the master
    serving the most parking groups (4 of 8: their hash tags, ``{parked:K}``, fix their slots),
    so tasks are parked on it; else one serving none of them."""
    node = cluster.nodes[cluster.ports[0]]
    owners = Counter(
        cluster.owner(int(command(node, "CLUSTER", "KEYSLOT", key)))
        for key, _ in parking_keys(prefix, shards)
    )
    if parked_here:
        target = owners.most_common(1)[0][0]
    else:
        target = next(port for port in cluster.ports if port not in owners)
    for _ in range(1000):
        queue = f"ft-{uuid.uuid4().hex[:6]}"
        key = limit_key(prefix, queue)
        slot = int(command(node, "CLUSTER", "KEYSLOT", key))
        assert slot == key_slot(key.encode())  # redis-py agrees
        if (cluster.owner(slot) == target) == limit_here:
            return target, queue
    raise RuntimeError(f"no queue name found whose limit key is where wanted ({target})")


def _log(client: redis.Redis, key: str) -> Counter[int]:
    """The units of a sliding log per stamp (absolute ms): [offset, y, ..., meta, b<base>],
    newest first, an entry's units being y - y_below + 1 (see sliding_log.lua)."""
    raw = [x.decode() for x in client.lrange(key, 0, -1)]
    if len(raw) < 2:
        return Counter()
    base, below = int(raw[-1][1:]), int(raw[-2].rsplit(":", 1)[1])
    out: Counter[int] = Counter()
    for j in range(len(raw) - 4, -1, -2):  # oldest first
        y = int(raw[j + 1])
        out[base + int(raw[j])] = y - below + 1
        below = y
    return out


def _junk_size() -> int:
    """More than the kernel can buffer between two loopback sockets (send + receive maxima)."""
    total = 8 << 20
    for path, column in (("/proc/sys/net/ipv4/tcp_wmem", 2), ("/proc/sys/net/ipv4/tcp_rmem", 2)):
        try:
            with open(path) as text:
                total += int(text.read().split()[column])
        except (OSError, ValueError, IndexError):
            total += 32 << 20
    return total


@dataclass
class ClusterKill:
    """SIGKILL master ``target`` (its replica lagging ``lag`` seconds at most, or not at all)."""

    cluster: LocalCluster
    target: int
    key: str | None
    """The limit's log, if it lives on the target (read before and after the kill)."""
    parked_keys: list[tuple[str, str]]
    lag: float = 0.0
    writes: int = 10
    """The lag ends when the master's log holds this many stamps (or after ``lag`` s)."""
    replica: int = 0
    master_log: Counter[int] = field(default_factory=Counter)
    replica_log: Counter[int] = field(default_factory=Counter)
    parked: int = 0
    """Tasks parked on the killed master when it died."""
    killed_at: float = 0.0
    slots: list[tuple[int, int]] = field(default_factory=list)
    """The slot ranges the killed master served."""

    def __post_init__(self) -> None:
        self.replica = self.cluster.replica_for(self.target)

    def inject(self) -> None:
        """The fault: (lag,) SIGKILL, then read what reached the replica before it takes over."""
        master = self.cluster.nodes[self.target]
        if self.lag > 0:
            stopped = self.cluster.processes[self.replica].pid
            os.kill(stopped, signal.SIGSTOP)
            try:
                self._fall_behind(master)
            finally:
                self._kill(master)
                os.kill(stopped, signal.SIGCONT)
        else:
            self._kill(master)
        replica = redis.Redis(port=self.replica, single_connection_client=True, socket_timeout=5)
        try:
            until(
                lambda: replica.info("replication").get("master_link_status") == "down",
                10,
                "the replica to see its master gone",
            )
            command(replica, "READONLY")
            self.replica_log = _log(replica, self.key) if self.key else Counter()
            role = replica.info("replication").get("role")
            if role != "slave":
                raise RuntimeError(f"the replica was promoted before its log was read: {role}")
        finally:
            replica.close()

    def _fall_behind(self, master: redis.Redis) -> None:
        """With the replica stopped: one value larger than the socket buffers, then whatever
        the master writes stays in its output buffer (no limit on it), until its log holds
        ``writes`` stamps or ``lag`` seconds passed."""
        command(master, "CONFIG", "SET", "client-output-buffer-limit", "replica 0 0 0")
        mine = (f"junk{i}" for i in range(10_000))
        junk = next(k for k in mine if self.cluster.owner(key_slot(k.encode())) == self.target)
        master.set(junk, b"x" * _junk_size())
        deadline = time.monotonic() + self.lag
        while self._written(master) < self.writes and time.monotonic() < deadline:
            time.sleep(0.02)

    def _written(self, master: redis.Redis) -> int:
        """Units in the master's log."""
        return sum(_log(master, self.key).values()) if self.key else 0

    def _kill(self, master: redis.Redis) -> None:
        command(master, "CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        self.master_log = _log(master, self.key) if self.key else Counter()
        self.parked = sum(
            int(master.zcard(due)) + int(master.zcard(lease))
            for due, lease in self.parked_keys
            if self.cluster.owner(key_slot(due.encode())) == self.target
        )
        self.slots = self.cluster.slots_of(self.target, ask=self.target)
        self.killed_at = time.time()
        self.cluster.kill(self.target)

    def outcome(self, resumed: float | None, timeout: float = 20.0) -> Lost:
        """Once the backlog ran: the replica took over the killed master's slots (an automatic
        failover, checked) and what it never received; ``resumed``: the first start after the
        kill (Unix seconds)."""
        self.cluster.wait_promoted(self.replica, timeout)
        taken = self.cluster.slots_of(self.replica, ask=self.replica)
        if taken != self.slots:
            raise RuntimeError(f"the promoted replica serves {taken}, its master {self.slots}")
        lost = self.master_log - self.replica_log
        since = float("inf") if resumed is None else (resumed - WINDOW) * 1000
        ahead = sum(n for stamp, n in lost.items() if stamp >= since)
        return Lost(self.parked, sum(lost.values()), ahead)
