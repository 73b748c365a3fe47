"""Deployment checks of the Redis governor keeps its state in: what a restart, a full memory or
a wrong clock would do to limits and parked tasks. ``governor doctor`` prints them; a worker
warns at start-up when the Redis keeps nothing on disk (:func:`volatile_servers`).

What is at stake, by key (see :mod:`governor.celery.waiting.parking` and
:mod:`governor.celery.waiting.cap_line`):

- parked tasks (``{parked}:due``/``msgs``) and the waiters of full concurrency caps have **no
  TTL** and exist nowhere else: lost with the Redis, the tasks are lost;
- every limit's window, a cap's holders and a released task's claim (``{parked}:seen:ID``)
  **have a TTL**: lost or evicted, a limit admits more than its rules, a cap lets more run at
  once, and a second copy of a released task may run.

So a restart without persistence loses tasks, ``allkeys-*`` eviction can evict any of them, and
``volatile-*`` eviction evicts exactly the keys with a TTL (the windows, holders and claims):
only ``noeviction`` (writes fail when memory is full; governor then follows
``governor_fail_mode``) keeps governor exact.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

from .text import as_text

__all__ = [
    "FAIL",
    "OK",
    "WARN",
    "Check",
    "clock",
    "cluster_coverage",
    "eviction",
    "green_connections",
    "persistence",
    "servers",
    "too_old_servers",
    "version",
    "visibility",
    "volatile_servers",
]

OK, WARN, FAIL = "ok", "warn", "FAIL"
CLOCK_WARN = 1.0
"""Seconds between the Redis clock and this host's above which ``clock`` warns."""
SLOTS = 16384
MIN_VERSION = (6, 2)
"""The oldest Redis governor's scripts run on (``ZADD ... LT``, ``SET ... KEEPTTL``)."""


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    """``ok``, ``warn`` or ``FAIL``."""
    detail: str
    server: str = ""


def servers(client: Any) -> list[tuple[str, redis.Redis]]:
    """``(address, client of that server)`` for each server holding data: a cluster's
    masters, else the one server (a Sentinel master: the master it points at now)."""
    if isinstance(client, RedisCluster):
        primaries = client.get_primaries()  # type: ignore[no-untyped-call]
        return [
            (f"{node.host}:{node.port}", client.get_redis_connection(node)) for node in primaries
        ]
    pool = client.connection_pool
    master = getattr(pool, "get_master_address", None)
    if master is not None:
        host, port = master()
        return [(f"{host}:{port}", client)]
    kwargs = pool.connection_kwargs
    where = kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    return [(str(where), client)]


def version(server: str, info: Mapping[str, Any]) -> Check:
    """Is this server (``INFO server`` as ``info``) new enough for governor's scripts?"""
    text = as_text(info.get("redis_version", "?"))
    parts = [int(p) if p.isdigit() else -1 for p in text.split(".")[:2]]
    need = ".".join(map(str, MIN_VERSION))
    if len(parts) != 2 or -1 in parts:
        return Check(
            "version",
            WARN,
            f"Redis version {text!r} unknown: governor needs {need} or later",
            server,
        )
    if tuple(parts) >= MIN_VERSION:
        return Check("version", OK, f"Redis {text}", server)
    return Check(
        "version",
        FAIL,
        f"Redis {text}: governor needs Redis {need} or later (its scripts use ZADD LT and SET "
        "KEEPTTL); every decision would fail with a syntax error",
        server,
    )


def too_old_servers(client: Any) -> list[Check]:
    """The servers too old for governor's scripts (for the worker's start-up)."""
    return [
        check
        for server, node in servers(client)
        if (check := version(server, node.info("server"))).status == FAIL
    ]


def _config(client: redis.Redis, name: str) -> str | None:
    """A CONFIG GET value, or None where CONFIG is refused (managed Redis often renames it)."""
    try:
        found = client.config_get(name)
    except ResponseError:
        return None
    return None if name not in found else as_text(found[name])


def persistence(server: str, client: redis.Redis) -> Check:
    """Will parked tasks survive a restart of this server?"""
    replicas = int(client.info("replication").get("connected_slaves", 0))
    aof = _config(client, "appendonly")
    if aof is None:
        aof = "yes" if int(client.info("persistence").get("aof_enabled", 0)) else "no"
    save = _config(client, "save")
    with_replicas = f"; {replicas} replica(s)" if replicas else "; no replica"
    if aof == "yes":
        fsync = _config(client, "appendfsync") or "?"
        if fsync == "no":
            return Check(
                "persistence",
                WARN,
                "AOF on with appendfsync no: a crash loses what the OS had not written yet "
                f"(often ~30 s of parked tasks and counts){with_replicas}",
                server,
            )
        return Check("persistence", OK, f"AOF on (appendfsync {fsync}){with_replicas}", server)
    if save:
        return Check(
            "persistence",
            WARN,
            f"RDB snapshots only (save {save!r}), no AOF: a restart loses what changed since the "
            f"last snapshot (parked tasks, waiters, counts){with_replicas}",
            server,
        )
    if save is None:
        return Check(
            "persistence",
            WARN,
            f"no AOF, and RDB save points cannot be read (CONFIG refused){with_replicas}",
            server,
        )
    if replicas:
        return Check(
            "persistence",
            WARN,
            f"nothing on disk (no AOF, no RDB save points), {replicas} replica(s): a failover "
            "keeps the data, a restart of this server loses it (and empties its replicas if it "
            "comes back as master before a failover)",
            server,
        )
    return Check(
        "persistence",
        FAIL,
        "nothing on disk (no AOF, no RDB save points) and no replica: a restart loses parked "
        "tasks, the waiters of concurrency caps and every limit's counts",
        server,
    )


def eviction(server: str, client: redis.Redis) -> Check:
    """Can this server evict governor's keys when its memory is full?"""
    memory = client.info("memory")
    limit = int(memory.get("maxmemory", 0))
    policy = as_text(memory.get("maxmemory_policy", "?"))
    if policy == "noeviction":
        return Check(
            "eviction",
            OK,
            "maxmemory-policy noeviction: when memory is full, writes fail and governor follows "
            "governor_fail_mode",
            server,
        )
    if limit == 0:
        return Check(
            "eviction",
            OK,
            f"no maxmemory: nothing is evicted (maxmemory-policy {policy} would apply once one "
            "is set; use noeviction)",
            server,
        )
    if policy.startswith("allkeys-"):
        return Check(
            "eviction",
            FAIL,
            f"maxmemory-policy {policy} with maxmemory {limit}: when memory is full any key may "
            "be evicted: parked tasks and waiters (lost), limit windows and cap holders (over-"
            "admitting). Use noeviction",
            server,
        )
    return Check(
        "eviction",
        FAIL,
        f"maxmemory-policy {policy} with maxmemory {limit}: when memory is full keys with a TTL "
        "are evicted, and most of governor's have one: limit windows (a limit admits more than "
        "its rules), cap holders (more run at once), release claims (a parked task may run "
        "twice). Use noeviction",
        server,
    )


def clock(server: str, client: redis.Redis) -> Check:
    """The Redis clock (which decides) against this host's (which reads ETAs)."""
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    offset = seconds + micros / 1e6 - (before + after) / 2
    detail = (
        f"Redis clock {offset:+.3f}s from this host's (round trip {(after - before) * 1000:.1f} "
        "ms); run doctor on the workers' hosts too"
    )
    if abs(offset) > CLOCK_WARN:
        return Check(
            "clock",
            WARN,
            f"{detail}. Decisions use Redis time, but a worker's clock reads the ETAs: sync "
            "the clocks (NTP)",
            server,
        )
    return Check("clock", OK, detail, server)


def cluster_coverage(client: Any) -> list[Check]:
    """Every slot of a cluster served, as each master sees it (none for other clients)."""
    if not isinstance(client, RedisCluster):
        return []
    checks = []
    for server, node in servers(client):
        raw = as_text(node.execute_command("CLUSTER", "INFO"))  # type: ignore[no-untyped-call]
        info = dict(line.split(":", 1) for line in raw.split() if ":" in line)
        state, ok = info.get("cluster_state"), info.get("cluster_slots_ok")
        detail = (
            f"cluster_state {state}, {ok}/{SLOTS} slots ok, "
            f"{info.get('cluster_size', '?')} masters with slots"
        )
        good = state == "ok" and ok == str(SLOTS)
        checks.append(Check("cluster", OK if good else FAIL, detail, server))
    return checks


def visibility(
    broker_url: Any,
    transport_options: Mapping[str, Any] | None,
    park_after: float | None,
    max_wait: float | None,
) -> Check | None:
    """The broker's visibility timeout against the longest ETA governor gives it (None: the
    broker has none). A message held unacknowledged longer than it is delivered again."""
    url = as_text(broker_url or "")
    scheme = url.split("://", 1)[0]
    if scheme not in ("redis", "rediss", "sentinel", "socket", "unix"):
        return None
    options = transport_options or {}
    timeout = float(options.get("visibility_timeout", 3600))
    where = f"visibility_timeout {timeout:g}s"
    if park_after is None:
        if max_wait is not None and max_wait <= timeout / 2:
            return Check("visibility", OK, f"{where}; no parking, waits end at max_wait")
        return Check(
            "visibility",
            FAIL,
            f"{where}, governor_park_after False: a wait longer than the visibility timeout is "
            "given to the broker as an ETA and delivered again (runs twice). Leave "
            "governor_park_after unset",
        )
    detail = f"{where}, governor_park_after {park_after:g}s"
    if park_after >= timeout:
        return Check(
            "visibility",
            FAIL,
            f"{detail}: ETAs up to park_after outlive the visibility timeout and are delivered "
            "again (run twice). Lower governor_park_after below half of it",
        )
    if park_after > timeout / 2:
        return Check(
            "visibility",
            WARN,
            f"{detail}: little margin for a worker that is slow to run an ETA (acks_late "
            "bodies count too). Keep park_after at most half the timeout",
        )
    return Check("visibility", OK, detail)


GREEN_MARGIN = 10
"""Connections of the Redis broker's pool beyond a green pool's concurrency: the consumer's
own (BRPOP, recording deliveries, restoring) and the worker's other greenlets."""


def green_connections(
    broker_url: Any,
    transport_options: Mapping[str, Any] | None,
    pool: str,
    concurrency: int,
    acks_from_tasks: bool,
) -> Check | None:
    """The Redis broker's connection pool against a green pool's tasks at once (None: not a
    green pool on the Redis broker).

    Celery 5.7 acknowledges each message from the greenlet of its task
    (``Consumer.call_soon_ack``, ``acks_from_tasks``; earlier releases left it to the
    consumer's loop), over the consumer channel's connection pool: kombu's
    ``max_connections``, 10 by default (kombu/transport/redis.py ``Channel``). When the tasks
    ending at once take every connection, the consumer's next message, already popped from
    its list, cannot be recorded as unacknowledged (``QoS.append`` raises
    ``MaxConnectionsError``) and is lost, and the consumer reconnects. Seen in the suite's
    gevent row (100 greenlets a node) on a busy machine: one task of 82 never ran.
    """
    url = as_text(broker_url or "")
    if pool not in ("gevent", "eventlet") or not acks_from_tasks:
        return None
    if url.split("://", 1)[0] not in ("redis", "rediss", "sentinel", "socket", "unix"):
        return None
    have = int((transport_options or {}).get("max_connections", 10))
    need = concurrency + GREEN_MARGIN
    detail = f"broker max_connections {have}, {pool} pool of {concurrency}"
    if have >= need:
        return Check("green pool", OK, detail)
    return Check(
        "green pool",
        FAIL,
        f"{detail}: tasks acknowledging at once exhaust the broker's connections, and the "
        "message the consumer has just taken is lost (kombu cannot record it as "
        f"unacknowledged). Set broker_transport_options = {{'max_connections': {need}}} "
        "(the concurrency and 10)",
    )


def volatile_servers(client: Any) -> list[Check]:
    """The servers that keep nothing on disk and have no replica (for the worker's warning)."""
    return [
        check
        for server, node in servers(client)
        if (check := persistence(server, node)).status == FAIL
    ]
