"""Start and stop real `celery worker` processes running tests/support/worker_app.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent


class Nodes:
    """A group of worker nodes sharing one configuration."""

    def __init__(
        self,
        broker: str,
        store: str,
        record: str,
        queues: dict[str, str],
        conf: dict[str, Any] | None = None,
        sleep: float = 0.0,
    ) -> None:
        self.key = f"gt{uuid.uuid4().hex[:10]}"
        self.env = {
            **os.environ,
            "GT_BROKER": broker,
            "GT_STORE": store,
            "GT_RECORD": record,
            "GT_KEY": self.key,
            "GT_QUEUES": json.dumps(queues),
            "GT_CONF": json.dumps(conf or {}),
            "GT_SLEEP": str(sleep),
            "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        }
        self.record = redis.Redis.from_url(record)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(
        self,
        count: int,
        concurrency: int,
        queues: list[str],
        pool: str = "prefork",
        timeout: float = 30.0,
    ) -> None:
        first = len(self.procs)
        self.record.delete(f"{self.key}:ready")
        for i in range(first, first + count):
            log = Path(f"/tmp/{self.key}-node{i}.log")
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "worker_app",
                        "worker",
                        "-P",
                        pool,
                        "-c",
                        str(concurrency),
                        "-n",
                        f"node{i}-{self.key}@%h",
                        "-Q",
                        ",".join(queues),
                        "--without-gossip",
                        "--without-mingle",
                        "--without-heartbeat",
                        "--loglevel",
                        os.environ.get("GT_LOGLEVEL", "INFO"),
                    ],
                    cwd=HERE,
                    env=self.env,
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout
        while self.record.scard(f"{self.key}:ready") < count:
            for proc, log in zip(self.procs[first:], self.logs[first:]):
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited: {log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "workers did not become ready: "
                    + "\n".join(log.read_text()[-2000:] for log in self.logs)
                )
            time.sleep(0.1)

    def runs(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.record.lrange(f"{self.key}:runs", 0, -1)]

    def failures(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.record.lrange(f"{self.key}:failures", 0, -1)]

    def wait_runs(self, count: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.record.llen(f"{self.key}:runs") < count:
            time.sleep(0.1)
        return self.runs()

    def publish(self, queue: str, count: int, task: str = "worker_app.noop") -> None:
        """Send ``count`` tasks the way any producer would: a fresh app on the broker."""
        from celery import Celery

        producer_app = Celery("producer", broker=self.env["GT_BROKER"])
        with producer_app.producer_or_acquire() as producer:
            for n in range(count):
                producer_app.send_task(task, (n,), queue=queue, producer=producer)
        producer_app.close()

    def send(
        self,
        queue: str,
        task: str | list[str],
        calls: list[tuple[Any, ...]],
        options: list[dict[str, Any]] | None = None,
        broker: str | None = None,
    ) -> None:
        """Send one task per argument tuple, as any producer would. ``task``: one name, or one
        per call; ``options``: Celery's options of each call (``task_id``, ``expires``...);
        ``broker``: another way to the nodes' broker (say, not through a proxy)."""
        from celery import Celery

        names = [task] * len(calls) if isinstance(task, str) else task
        producer_app = Celery("producer", broker=broker or self.env["GT_BROKER"])
        with producer_app.producer_or_acquire() as producer:
            for name, args, opts in zip(names, calls, options or [{}] * len(calls)):
                producer_app.send_task(name, args, queue=queue, producer=producer, **opts)
        producer_app.close()

    def records(self, kind: str) -> list[Any]:
        """What the nodes wrote to ``<key>:<kind>`` (JSON values)."""
        return [json.loads(x) for x in self.record.lrange(f"{self.key}:{kind}", 0, -1)]

    def pause(self, index: int) -> None:
        """SIGSTOP a whole node (its main process and its pool processes)."""
        os.killpg(self.procs[index].pid, signal.SIGSTOP)

    def resume(self, index: int) -> None:
        os.killpg(self.procs[index].pid, signal.SIGCONT)

    def kill(self, index: int) -> None:
        os.killpg(self.procs[index].pid, signal.SIGKILL)
        self.procs[index].wait(10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)  # a paused node could not stop
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def log_text(self) -> str:
        return "\n".join(log.read_text(errors="replace") for log in self.logs if log.exists())
