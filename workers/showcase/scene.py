"""The showcase's processes: a private Redis, two ``celery -A workers.app worker`` nodes, the
``governor`` commands it runs, and ``governor -A workers.app dashboard`` servers.

Each child leads its own process group and session (a worker's pool processes join its group),
so :meth:`Scene.stop` reaches every process started, by pid; on Linux they also get SIGTERM if
the showcase dies without cleaning up. As ``governor demo`` does (its helpers are reused), the
workers of a private Redis are killed outright: the Redis goes away with all they hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from governor.cli.demo.processes import _group_alive, _parent_death_signal, _signal_group
from governor.embedded import EmbeddedRedis, free_port

__all__ = ["ROOT", "Board", "Scene", "ShowcaseError", "wait_for"]

ROOT = Path(__file__).resolve().parents[2]
"""The project's folder: ``workers`` is imported from there."""
QUEUES = "celery,emails,exports,reports"
PREFIX = "governor"
STOP_TIMEOUT = 10.0
T = TypeVar("T")


class ShowcaseError(Exception):
    """Something the showcase needs did not happen: the message says what, and where to look."""


def wait_for(read: Callable[[], T], done: Callable[[T], bool], timeout: float, what: str) -> T:
    """``read()`` once ``done`` holds of it; ShowcaseError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise ShowcaseError(f"{what}: not within {timeout:.0f}s (last seen: {value!r})")
        time.sleep(0.2)


@dataclass
class Board:
    """A ``governor dashboard`` process: its URL and, if it asks for one, its token."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    token: str | None = None


class Scene:
    """Starts and stops the showcase's processes. ``workdir`` holds their logs."""

    def __init__(self, workdir: Path, nodes: int = 2, concurrency: int = 4) -> None:
        self.workdir = workdir
        self.nodes = nodes
        self.concurrency = concurrency
        self.redis: EmbeddedRedis | None = None
        self.children: list[subprocess.Popen[bytes]] = []
        self.workers: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.env: dict[str, str] = {}

    # -- starting ---------------------------------------------------------------------------

    def start_redis(self, partner_url: str) -> None:
        """A private redis-server (broker in db 0, governor's store in db 1), and the
        environment every child reads (as docker-compose.yml sets it)."""
        try:
            self.redis = EmbeddedRedis()
        except FileNotFoundError as exc:
            raise ShowcaseError(str(exc)) from None
        try:
            self.redis.start()
        except RuntimeError as exc:
            raise ShowcaseError(f"could not start a private Redis: {exc}") from None
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_BROKER")}
        loopback = "127.0.0.1,localhost"
        self.env = {
            **env,
            "BROKER_URL": self.redis.url(0),
            "GOVERNOR_REDIS_URL": self.redis.url(1),
            "GOVERNOR_PREFIX": PREFIX,
            "PARTNER_API_URL": partner_url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
            # the partner is on loopback: never through a proxy the environment names
            "NO_PROXY": ",".join(filter(None, [env.get("NO_PROXY"), loopback])),
            "no_proxy": ",".join(filter(None, [env.get("no_proxy"), loopback])),
        }
        for name in (
            "GOVERNOR_SENTINEL_MASTER",
            "GOVERNOR_REDIS_CLUSTER",
            "GOVERNOR_DASHBOARD_TOKEN",
        ):
            self.env.pop(name, None)  # this scene's Redis and dashboards, nobody else's

    def _spawn(
        self, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env=env or self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_parent_death_signal(),
            )
        self.children.append(proc)
        return proc

    def start_workers(self) -> None:
        for i in range(1, self.nodes + 1):
            log = self.workdir / f"node{i}.log"
            args = [sys.executable, "-m", "celery", "-A", "workers.app", "worker"]
            args += ["-P", "prefork", "-c", str(self.concurrency), "-n", f"node{i}@%h"]
            args += ["-Q", QUEUES, "--without-gossip", "--without-mingle", "--without-heartbeat"]
            self.workers.append((self._spawn([*args, "--loglevel", "INFO"], log), log))

    def wait_workers(self, timeout: float) -> None:
        """Until every node logged that it is ready (a node that exits: its log's end)."""

        def ready() -> int:
            self.check_workers()
            return sum(" ready." in log.read_text(errors="replace") for _, log in self.workers)

        wait_for(ready, lambda n: n == len(self.workers), timeout, "the worker nodes to start")

    def check_workers(self) -> None:
        for proc, log in self.workers:
            if proc.poll() is not None:
                raise ShowcaseError(f"{log.stem} exited ({proc.returncode}):\n{tail(log)}")

    def start_dashboard(self, name: str, *extra: str, token: str | None = None) -> Board:
        """``governor -A workers.app dashboard`` on a free port (``extra``: more options)."""
        port = free_port()
        log = self.workdir / f"{name}.log"
        args = [sys.executable, "-m", "governor.cli", "-A", "workers.app", "dashboard"]
        env = {**self.env, "GOVERNOR_DASHBOARD_TOKEN": token} if token else None
        proc = self._spawn([*args, "--port", str(port), *extra], log, env)
        return Board(f"http://127.0.0.1:{port}", proc, log, token)

    def wait_dashboard(self, board: Board, timeout: float) -> None:
        def answers() -> bool:
            if board.process.poll() is not None:
                raise ShowcaseError(f"the dashboard exited:\n{tail(board.log)}")
            try:
                with urllib.request.urlopen(f"{board.url}/api/limits", timeout=2):
                    return True
            except urllib.error.HTTPError:
                return True  # it answers (401 until logged in)
            except OSError:
                return False

        wait_for(answers, bool, timeout, f"the dashboard on {board.url}")

    @staticmethod
    def read(board: Board, path: str) -> Any:
        """The JSON a read-only dashboard answers at ``path`` (``api/inspect?...``)."""
        with urllib.request.urlopen(f"{board.url}/{path}", timeout=10) as answer:
            return json.loads(answer.read())

    def governor(self, *args: str, timeout: float = 60) -> str:
        """Run ``governor -A workers.app ARGS`` (as a person would); its output."""
        command = [sys.executable, "-m", "governor.cli", "-A", "workers.app", *args]
        try:
            done = subprocess.run(
                command, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise ShowcaseError(f"governor {' '.join(args)}: no answer in {timeout:.0f}s") from None
        if done.returncode != 0:
            raise ShowcaseError(f"governor {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    # -- stopping ---------------------------------------------------------------------------

    def stop_workers(self) -> None:
        """Kill the worker nodes' process groups (their messages go with the private Redis)."""
        self._stop([proc for proc, _ in self.workers], signal.SIGKILL)

    def stop_redis(self) -> None:
        if self.redis is not None:
            self.redis.stop()

    def stop(self) -> None:
        """Stop everything started, children first (SIGTERM, then SIGKILL after
        ``STOP_TIMEOUT``), then Redis. Never raises."""
        with contextlib.suppress(Exception):
            self.stop_workers()
        with contextlib.suppress(Exception):
            self._stop(self.children, signal.SIGTERM)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.close()
            self.redis = None

    @staticmethod
    def _stop(processes: list[subprocess.Popen[bytes]], first: signal.Signals) -> None:
        for proc in processes:
            _signal_group(proc.pid, first)
        deadline = time.monotonic() + STOP_TIMEOUT
        while any(_group_alive(p) for p in processes):
            if time.monotonic() > deadline:
                if first == signal.SIGKILL:
                    left = [p.pid for p in processes if _group_alive(p)]
                    print(f"warning: process groups {left} did not exit", file=sys.stderr)
                    return
                for proc in processes:
                    _signal_group(proc.pid, signal.SIGKILL)
                first, deadline = signal.SIGKILL, time.monotonic() + STOP_TIMEOUT
            time.sleep(0.05)


def tail(log: Path, chars: int = 2000) -> str:
    return log.read_text(errors="replace")[-chars:].rstrip() if log.exists() else ""
