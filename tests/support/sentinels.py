"""A Redis Sentinel setup on loopback for tests: a master, optional replicas, one or more
sentinels, each a real process on a free port, all stopped by ``close()``.

Waits are bounded by deadlines (never fixed sleeps). Uses the redis-server of
:func:`governor.embedded.find_redis_server` (``redis-server --sentinel`` needs no
``redis-sentinel`` binary).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable

import redis

from governor.embedded import EmbeddedRedis, find_redis_server, free_port, server_command

__all__ = ["LocalSentinel"]


def _until(check: Callable[[], bool], deadline: float, what: str) -> None:
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


class LocalSentinel:
    """``master_name`` monitored by ``sentinels`` sentinels, with ``replicas`` replicas."""

    def __init__(self, sentinels: int = 1, replicas: int = 0, master_name: str = "governor"):
        self.executable = find_redis_server()
        self.master_name = master_name
        self.want_sentinels, self.want_replicas = sentinels, replicas
        self.dir = tempfile.mkdtemp(prefix="governor-sentinel-")
        self.master = EmbeddedRedis(self.executable)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.replica_ports: list[int] = []
        self.sentinel_ports: list[int] = []

    @property
    def master_port(self) -> int:
        return self.master.port

    def url(self, db: int = 0, password: str | None = None) -> str:
        """``sentinel://127.0.0.1:P1;sentinel://127.0.0.1:P2/db`` (as Celery spells it)."""
        auth = f":{password}@" if password else ""
        parts = [f"sentinel://{auth}127.0.0.1:{port}" for port in self.sentinel_ports]
        return ";".join(parts) + f"/{db}"

    def _spawn(self, args: list[str], port: int, deadline: float) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.processes.append(process)
        client = redis.Redis(port=port, socket_timeout=2)
        try:
            _until(lambda: process.poll() is not None or bool(client.ping()), deadline, f"{port}")
        finally:
            client.close()
        if process.poll() is not None:
            raise RuntimeError(f"a redis process on port {port} exited at start: see {self.dir}")
        return process

    def _start_replica(self, deadline: float) -> None:
        port = free_port()
        args = server_command(self.executable, port, self.dir, f"replica-{port}.log")
        args += ["--replicaof", "127.0.0.1", str(self.master_port)]
        args += ["--repl-diskless-sync-delay", "0"]
        self._spawn(args, port, deadline)
        self.replica_ports.append(port)

    def _start_sentinel(self, deadline: float) -> None:
        port = free_port()
        quorum = self.want_sentinels // 2 + 1
        config = os.path.join(self.dir, f"sentinel-{port}.conf")
        with open(config, "w") as out:
            out.write(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {self.dir}\n"
                f"logfile {os.path.join(self.dir, f'sentinel-{port}.log')}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {self.master_port} {quorum}\n"
                f"sentinel down-after-milliseconds {self.master_name} 1000\n"
                f"sentinel failover-timeout {self.master_name} 5000\n"
            )
        self._spawn([self.executable, config, "--sentinel"], port, deadline)
        self.sentinel_ports.append(port)

    def start(self, timeout: float = 20.0) -> LocalSentinel:
        deadline = time.monotonic() + timeout
        self.master.start(timeout=timeout)
        for _ in range(self.want_replicas):
            self._start_replica(deadline)
        for _ in range(self.want_sentinels):
            self._start_sentinel(deadline)
        master = redis.Redis(port=self.master_port, socket_timeout=2)
        try:
            _until(
                lambda: int(master.info("replication")["connected_slaves"]) >= self.want_replicas,
                deadline,
                "the replicas to connect",
            )
        finally:
            master.close()
        for port in self.sentinel_ports:
            sentinel = redis.Redis(port=port, socket_timeout=2, decode_responses=True)
            try:
                _until(
                    lambda s=sentinel: (
                        s.execute_command(  # type: ignore[misc]
                            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
                        )
                        == ["127.0.0.1", str(self.master_port)]
                    ),
                    deadline,
                    f"sentinel {port} to know the master",
                )
            finally:
                sentinel.close()
        return self

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self.master.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()
