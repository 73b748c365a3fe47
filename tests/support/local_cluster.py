"""A Redis Cluster on loopback for tests: three masters covering every slot, optionally with
replicas (``replicas=1``: one each, AOF on, a short ``cluster-node-timeout`` so a killed master
fails over within seconds), each a real redis-server process, all stopped by ``close()``.

Uses the redis-server of :func:`governor.embedded.find_redis_server` (Redis 7 adds its slots
with ``CLUSTER ADDSLOTSRANGE``, Redis 6.2 with ``CLUSTER ADDSLOTS``; no ``redis-cli`` is
needed). Every wait is a condition polled under a deadline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio.cluster as aiocluster
from redis.cluster import RedisCluster

from governor.embedded import free_port, server_command

__all__ = ["MASTERS", "SLOTS", "LocalCluster", "cluster_info", "command", "until"]

SLOTS = 16384
MASTERS = 3


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _cluster_port(taken: set[int]) -> int:
    """A free port whose cluster bus port (port + 10000, fixed in Redis 6.2) is free too."""
    for _ in range(500):
        port = free_port()
        if port not in taken and port + 10000 <= 65535 and _port_is_free(port + 10000):
            return port
    raise RuntimeError("no free pair of loopback ports (port, port + 10000) for a cluster node")


def command(client: redis.Redis, *args: str | int) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def cluster_info(client: redis.Redis) -> dict[str, str]:
    raw = command(client, "CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` (Redis and socket errors count as "not yet") until true or ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


class LocalCluster:
    """``MASTERS`` cluster-enabled redis-server processes on loopback, joined and covering all
    slots, and ``replicas`` replicas of each.

    ``nodes`` and ``ports`` are the masters as started, ``replicas`` maps a replica's port to
    its client and ``master_of`` to its master's port. With replicas the nodes keep an
    append-only file and use ``node_timeout`` ms as ``cluster-node-timeout``."""

    def __init__(self, executable: str, replicas: int = 0, node_timeout: int = 1500) -> None:
        self.executable = executable
        self.want_replicas = replicas
        self.node_timeout = node_timeout
        self.dir = tempfile.mkdtemp(prefix="governor-cluster-")
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.nodes: dict[int, redis.Redis] = {}  # port -> a plain client of that master
        self.replicas: dict[int, redis.Redis] = {}  # port -> a plain client of that replica
        self.master_of: dict[int, int] = {}  # replica port -> its master's port (at start)
        self.version = ""

    @property
    def ports(self) -> list[int]:
        return list(self.nodes)

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        replicated = self.want_replicas > 0
        args = server_command(self.executable, port, self.dir, f"redis-{port}.log", replicated)
        args += ["--cluster-enabled", "yes"]
        args += ["--cluster-config-file", os.path.join(self.dir, f"nodes-{port}.conf")]
        if replicated:
            args += ["--appendfilename", f"appendonly-{port}.aof"]
            args += ["--dbfilename", f"dump-{port}.rdb"]  # a full sync writes one
            args += ["--cluster-node-timeout", str(self.node_timeout)]
            args += ["--cluster-replica-validity-factor", "0"]  # a lagging replica may win
        return subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def _start_node(self, deadline: float) -> tuple[int, redis.Redis]:
        """Start one node; a port taken meanwhile by someone else means another try."""
        for _ in range(5):
            port = _cluster_port(set(self.processes))
            process = self._spawn(port)
            self.processes[port] = process
            client = redis.Redis(port=port, socket_timeout=5)
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    client.ping()
                except redis.ConnectionError:
                    time.sleep(0.02)
                    continue
                return port, client
            client.close()
            if process.poll() is None:
                raise RuntimeError(f"redis-server on port {port} did not answer in time")
            del self.processes[port]
        raise RuntimeError(f"redis-server keeps exiting at start: see the logs in {self.dir}")

    def start(self, timeout: float | None = None) -> LocalCluster:
        timeout = timeout or (30.0 if self.want_replicas else 15.0)
        deadline = time.monotonic() + timeout
        for _ in range(MASTERS):
            port, client = self._start_node(deadline)
            self.nodes[port] = client
        masters = list(self.nodes.values())
        self.version = str(masters[0].info("server")["redis_version"])
        bounds = [SLOTS * i // MASTERS for i in range(MASTERS + 1)]
        for i, client in enumerate(masters):
            command(client, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)  # no epoch collisions
            first, last = bounds[i], bounds[i + 1] - 1
            if int(self.version.split(".")[0]) >= 7:
                command(client, "CLUSTER", "ADDSLOTSRANGE", first, last)
            else:
                for start in range(first, last + 1, 1000):
                    chunk = range(start, min(start + 1000, last + 1))
                    command(client, "CLUSTER", "ADDSLOTS", *chunk)
        for master in self.ports:
            for _ in range(self.want_replicas):
                port, client = self._start_node(deadline)
                self.replicas[port] = client
                self.master_of[port] = master
        everyone = {**self.nodes, **self.replicas}
        for mine, client in everyone.items():  # every pair meets: gossip would take seconds
            for port in everyone:
                if port != mine:
                    command(client, "CLUSTER", "MEET", "127.0.0.1", port)
        left = max(0.1, deadline - time.monotonic())
        if self.replicas:
            until(
                lambda: all(
                    cluster_info(c).get("cluster_known_nodes") == str(len(everyone))
                    for c in everyone.values()
                ),
                left,
                "every node to know every other",
            )
            for port, client in self.replicas.items():
                master_id = command(self.nodes[self.master_of[port]], "CLUSTER", "MYID")
                until(
                    lambda c=client, m=master_id: bool(command(c, "CLUSTER", "REPLICATE", m)),
                    max(0.1, deadline - time.monotonic()),
                    f"node {port} to become a replica",
                )
            for port in self.replicas:
                self.wait_synced(port, max(0.1, deadline - time.monotonic()))
        try:  # masters only turn "ok" a little after they start (about two seconds)
            self.wait_ok(max(0.1, deadline - time.monotonic()))
        except RuntimeError as exc:
            raise RuntimeError(f"the cluster did not become ok in {timeout}s: {exc}") from None
        return self

    def wait_ok(self, timeout: float) -> None:
        """Until every live node sees the cluster ok, every slot ok, every node known."""
        ports = self.alive()
        want_known = str(len(self.nodes) + len(self.replicas))
        states: list[dict[str, str]] = []

        def ok() -> bool:
            states[:] = [cluster_info(self.client_of(port)) for port in ports]
            return all(
                s.get("cluster_state") == "ok"
                and s.get("cluster_slots_ok") == str(SLOTS)
                and s.get("cluster_known_nodes") == want_known
                for s in states
            )

        try:
            until(ok, timeout, "cluster_state:ok with every slot ok")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {states}") from None

    def wait_synced(self, replica: int, timeout: float) -> None:
        """Until ``replica``'s link to its master is up and its master lists it online."""
        client = self.replicas[replica]
        master = self.nodes[self.master_of[replica]]

        def synced() -> bool:
            if client.info("replication").get("master_link_status") != "up":
                return False
            info = master.info("replication")
            return any(
                isinstance(v, dict) and v.get("port") == replica and v.get("state") == "online"
                for k, v in info.items()
                if k.startswith("slave")
            )

        until(synced, timeout, f"replica {replica} to sync")

    def client_of(self, port: int) -> redis.Redis:
        return self.nodes.get(port) or self.replicas[port]

    def alive(self) -> list[int]:
        return [port for port, p in self.processes.items() if p.poll() is None]

    def url(self) -> str:
        """Every master as a startup node, for ``governor_redis_url`` (with cluster=True)."""
        return "redis://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def _slots(self, ask: int | None) -> list[tuple[int, int, int]]:
        """(first, last, master port) of every slot range, as node ``ask`` (a live one) sees."""
        via = self.client_of(ask if ask is not None else self.alive()[0])
        reply = command(via, "CLUSTER", "SLOTS")
        return sorted((int(first), int(last), int(master[1])) for first, last, master, *_ in reply)

    def owner(self, slot: int, ask: int | None = None) -> int:
        """The port of the master serving ``slot``, as node ``ask`` (a live one) sees it."""
        for first, last, port in self._slots(ask):
            if first <= slot <= last:
                return port
        raise RuntimeError(f"no node serves slot {slot}")

    def slots_of(self, master: int, ask: int | None = None) -> list[tuple[int, int]]:
        """The slot ranges ``master`` serves, as node ``ask`` sees them."""
        return [(first, last) for first, last, port in self._slots(ask) if port == master]

    def replica_for(self, master: int) -> int:
        return next(port for port, of in self.master_of.items() if of == master)

    def kill(self, port: int) -> None:
        """SIGKILL one node (no shutdown: what it had not written or replicated is gone)."""
        process = self.processes[port]
        process.kill()
        process.wait(5)

    def wait_promoted(self, replica: int, timeout: float) -> None:
        """Until ``replica`` is a master and every live node sees the cluster ok again."""
        client = self.replicas[replica]
        until(
            lambda: client.info("replication").get("role") == "master",
            timeout,
            f"replica {replica} to take over",
        )
        self.wait_ok(timeout)

    def client(self, **kwargs: object) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)  # type: ignore[arg-type]

    def async_client(self) -> aiocluster.RedisCluster:
        return aiocluster.RedisCluster(host="127.0.0.1", port=self.ports[0])

    def keys_by_node(self, pattern: str) -> dict[int, set[str]]:
        """Each master's keys matching ``pattern``, read from the node itself (not the router)."""
        return {
            port: {key.decode() for key in client.scan_iter(match=pattern, count=1000)}
            for port, client in self.nodes.items()
        }

    def close(self) -> None:
        for client in [*self.nodes.values(), *self.replicas.values()]:
            client.close()
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()
