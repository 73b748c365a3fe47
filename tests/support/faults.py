"""Fault scenarios on real processes, shared by tests/nodes/test_faults.py and bench/faults.py.

Each runs a governed backlog (``TASKS`` no-op tasks under ``RULE``, long waits parked in Redis)
on two `celery worker` nodes (prefork, 2 processes each) and injects one fault into the
governor's Redis while tasks wait, then records: tasks lost, tasks run twice, the most starts
in any second against the limit, and the longest gap between starts after the fault (how long
decisions stopped). The broker is the suite's Redis, untouched by the faults. Redis Cluster
faults (a master SIGKILLed, its replica lagging or not) are set up in
tests/support/cluster_faults.py.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from governor.embedded import EmbeddedRedis, find_redis_server

from .cluster_faults import RULES, ClusterKill, Lost, limit_key, parking_keys, pick
from .local_cluster import LocalCluster
from .sentinels import LocalSentinel
from .worker_nodes import Nodes

TASKS = 40
RULE = 10
"""Per second: the backlog takes about TASKS / RULE seconds."""
JITTER = 0.05
"""How much later than its admission a body may start (see ``run``)."""
FAULT_AT = 1.5
"""Seconds after publishing that the fault is injected (tasks are parked by then)."""


@dataclass
class Outcome:
    name: str
    done: int
    lost: int
    twice: int
    most: int
    gap: float
    took: float
    note: str = ""
    """What else was measured (shown after the name)."""
    failover: Lost | None = None
    """A killed cluster master: what its promoted replica never received."""
    starts: list[float] = field(default_factory=list, repr=False)
    """Every start (Unix seconds), in order."""

    def row(self) -> list[Any]:
        name = f"{self.name}: {self.note}" if self.note else self.name
        return [
            name, f"{self.done}/{TASKS}", self.lost, self.twice, f"{self.most} / {RULE}",
            f"{self.gap:.1f} s", f"{self.took:.1f} s",
        ]  # fmt: skip


HEADER = ["fault", "done", "lost", "run twice", "most in 0.95 s / limit", "longest gap", "took"]


def _conf(prefix: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "governor_prefix": prefix,
        "governor_park_after": 1.0,
        "governor_release_interval": 0.2,
        "governor_socket_timeout": 1.0,
        "governor_outage_retry": 0.5,
        "governor_fail_mode": "closed",
        **extra,
    }


def run(
    name: str,
    broker: str,
    record: str,
    store: str,
    inject: Callable[[], None],
    conf: dict[str, Any] | None = None,
    timeout: float = 90.0,
    queue: str | None = None,
    rules: str = f"{RULE}/s",
    fault_at: float = FAULT_AT,
) -> Outcome:
    queue = queue or f"ft-{uuid.uuid4().hex[:6]}"
    nodes = Nodes(
        broker,
        store,
        record,
        {queue: rules},
        conf=_conf(f"gt{uuid.uuid4().hex[:8]}", conf or {}),
    )
    try:
        nodes.start(2, concurrency=2, queues=[queue])
        started = time.time()
        nodes.publish(queue, TASKS)
        time.sleep(max(0.0, fault_at - (time.time() - started)))
        fault = time.time()
        inject()
        deadline = time.monotonic() + timeout
        runs = nodes.runs()
        while len({r["n"] for r in runs}) < TASKS and time.monotonic() < deadline:
            time.sleep(0.2)
            runs = nodes.runs()
    finally:
        nodes.stop()
    return measure(name, runs, started, fault)


def measure(name: str, runs: list[dict[str, Any]], started: float, fault: float) -> Outcome:
    """The measures of a run: ``runs`` as the nodes recorded them, ``started`` when the backlog
    was published, ``fault`` when the fault was injected (Unix seconds)."""
    starts = sorted(r["t"] for r in runs)
    # admissions are counted on Redis's clock; a body starts some ms after its admission, and
    # after an outage many start at once, so starts are counted in windows 50 ms short
    window = 1.0 - JITTER
    most = max(
        (sum(1 for t in starts[i:] if t < s + window) for i, s in enumerate(starts)), default=0
    )
    after = [fault, *[t for t in starts if t >= fault]]
    gap = max((b - a for a, b in itertools.pairwise(after)), default=0.0)
    unique = len({r["n"] for r in runs})
    took = (starts[-1] - started) if starts else 0.0
    return Outcome(name, unique, TASKS - unique, len(runs) - unique, most, gap, took, starts=starts)


def hang(broker: str, record: str) -> Outcome:
    """The governor's Redis stops answering (SIGSTOP) for 3 s, longer than the socket timeout."""
    with EmbeddedRedis(appendonly=True) as store:
        pid = store.process.pid if store.process else 0

        def inject() -> None:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(3.0)
            os.kill(pid, signal.SIGCONT)

        return run("Redis hangs 3 s (SIGSTOP)", broker, record, store.url(2), inject)


def crash(broker: str, record: str, appendonly: bool = True) -> Outcome:
    """The governor's Redis is SIGKILLed and restarted (with its append-only file, or none)."""
    with EmbeddedRedis(appendonly=appendonly) as store:

        def inject() -> None:
            assert store.process is not None
            store.process.kill()
            store.process.wait(5)
            store.process = None
            time.sleep(0.5)
            store.start()

        what = "AOF" if appendonly else "no persistence"
        return run(f"Redis SIGKILL + restart ({what})", broker, record, store.url(2), inject)


def failover(broker: str, record: str, kill: bool = False, replicas: int = 1) -> Outcome:
    """``SENTINEL FAILOVER`` (or SIGKILL of the master) while tasks are parked (and parked only
    once a replica has them)."""
    with LocalSentinel(sentinels=3, replicas=1) as setup:
        master = redis.Redis(port=setup.master_port)
        deadline = time.monotonic() + 20
        while master.info("replication").get("slave0", {}).get("state") != "online":
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync")
            time.sleep(0.05)
        master.close()
        sentinel = redis.Redis(port=setup.sentinel_ports[0])

        def inject() -> None:
            if kill and setup.master.process is not None:
                setup.master.process.kill()  # the sentinels notice after 1 s and fail over
            else:
                sentinel.execute_command("SENTINEL", "FAILOVER", setup.master_name)

        conf = {
            "governor_redis_transport_options": {"master_name": setup.master_name},
            "governor_park_replicas": replicas,
            "governor_park_replica_timeout": 0.5,
        }
        try:
            name = "Sentinel: master SIGKILLed" if kill else "Sentinel failover"
            name += "" if replicas else " (no WAIT)"
            return run(name, broker, record, setup.url(2), inject, conf)
        finally:
            sentinel.close()


LAG = 0.8
"""The longest a cluster replica lags before its master is killed (it stays stopped that long:
keep it below the cluster's node timeout, 1.5 s)."""


def cluster_kill(broker: str, record: str, limit: bool = False, lag: bool = False) -> Outcome:
    """A Redis Cluster master SIGKILLed while tasks are parked on its slots (``parking_shards``
    8, ``park_replicas`` 1; ``limit``: the queue's limit lives on it too); its replica takes
    over when the cluster sees it fail. ``lag``: the master holds the limit, the replica lags
    from the moment the backlog is published until every task is admitted or booked (at most
    ``LAG`` s; see tests/support/cluster_faults.py), and parked tasks live on other masters:
    what the lag lost, and the starts over the limit it allowed."""
    with LocalCluster(find_redis_server(), replicas=1) as cluster:
        prefix, shards = f"gt{uuid.uuid4().hex[:8]}", 1 if lag else 8
        here = limit or lag
        target, queue = pick(cluster, prefix, shards, parked_here=not lag, limit_here=here)
        key, parked = limit_key(prefix, queue) if here else None, parking_keys(prefix, shards)
        fault = ClusterKill(cluster, target, key, parked, LAG * lag, writes=TASKS)
        conf = {
            "governor_prefix": prefix,
            "governor_redis_cluster": True,
            "governor_parking_shards": shards,
            "governor_park_replicas": 1,
            "governor_park_replica_timeout": 0.5,
        }
        name = "Cluster: master SIGKILLed" + (
            ", replica lagging" if lag else " (with the limit)" if limit else " (parked tasks)"
        )
        out = run(
            name, broker, record, cluster.url(), fault.inject, conf, queue=queue, rules=RULES,
            fault_at=0.0 if lag else FAULT_AT,
        )  # fmt: skip
        resumed = min((t for t in out.starts if t >= fault.killed_at), default=None)
        lost = out.failover = fault.outcome(resumed)
        over = max(0, out.most - RULE)
        out.note = f"{lost.parked} parked on it"
        if limit:
            out.note += f", {lost.writes} writes lost, {over} over the limit"
        if lag:
            out.note = (
                f"overshoot measured: {over} start(s) over the limit; writes lost in the lag: "
                f"{lost.writes} ({lost.ahead} within a window of the failover or later)"
            )
        return out


SCENARIOS: dict[str, Callable[[str, str], Outcome]] = {
    "hang": hang,
    "crash": crash,
    "crash-volatile": lambda b, r: crash(b, r, appendonly=False),
    "failover": failover,
    "failover-kill": lambda b, r: failover(b, r, kill=True),
    "failover-kill-nowait": lambda b, r: failover(b, r, kill=True, replicas=0),
    "cluster-kill": cluster_kill,
    "cluster-kill-limit": lambda b, r: cluster_kill(b, r, limit=True),
    "cluster-kill-lag": lambda b, r: cluster_kill(b, r, lag=True),
}
