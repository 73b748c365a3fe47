"""Worker nodes for the benchmarks: separate `celery worker` processes on one app module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The checkout: workers load ``bench.<module>`` from it."""


def start_nodes(
    module: str, env: dict[str, str], queue: str, count: int = 2, concurrency: int = 2
) -> list[subprocess.Popen[bytes]]:
    """``count`` prefork nodes of ``concurrency`` processes consuming ``queue``."""
    logs = Path(tempfile.mkdtemp(prefix=f"governor-{module}-"))
    tag = os.urandom(4).hex()
    return [
        subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", f"bench.{module}", "worker", "-P", "prefork",
                "-c", str(concurrency), "-n", f"node{i}-{tag}@%h", "-Q", queue,
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", "WARNING",
            ],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=(logs / f"node{i}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for i in range(count)
    ]  # fmt: skip


def stop_nodes(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def send(broker: str, task: str, queue: str, calls: list[tuple[object, ...]]) -> None:
    """Publish one task per argument tuple, as any producer would (a last argument None
    becomes the moment it is published)."""
    import time

    from celery import Celery

    producer = Celery("producer", broker=broker)
    with producer.producer_or_acquire() as pub:
        for args in calls:
            if args and args[-1] is None:
                args = (*args[:-1], time.time())
            producer.send_task(task, args, queue=queue, producer=pub)
    producer.close()
