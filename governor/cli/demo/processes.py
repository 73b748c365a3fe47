"""The demo's processes: a private Redis (unless given one), two worker nodes, and the
signal handling that lets Ctrl-C stop them all (see :mod:`governor.cli.demo.command`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from ...connect import Names, target
from ...embedded import EmbeddedRedis
from ...errors import ConfigError
from ..common import EXIT_FAILED, EXIT_UNREACHABLE, CliError, mask_url

if TYPE_CHECKING:
    import redis

__all__ = ["CONCURRENCY", "NODES", "TASK", "Cluster"]

NODES = 2
CONCURRENCY = 2
TASK = "governor.demo.call"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
INSTALL_HINT = "install governor's demo extra (pip install 'celery-governor[demo]')"

# -- processes ------------------------------------------------------------------------------


def _parent_death_signal() -> Callable[[], None] | None:
    """Linux: a ``preexec_fn`` asking for SIGTERM when the demo dies, even by SIGKILL
    (``PR_SET_PDEATHSIG``); None elsewhere. ``prctl`` is looked up here, in the parent, so the
    child runs no import between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def die_with_parent() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return die_with_parent


DEADLINES = "_kombu.binding_deadlines"
"""A key kombu's Redis transport keeps for every app on the server (no TTL)."""


class Cluster:
    """The demo's processes: a private Redis (unless given one) and the worker nodes.

    Each worker leads its own process group and session (its pool processes join the group),
    so :meth:`stop` reaches every process it started, and a Ctrl-C on the terminal reaches the
    demo (and the private Redis, which shares its group) but not the workers: the demo stops
    them. On Linux the workers also get SIGTERM if the demo dies without cleaning up.
    """

    def __init__(self, run: str, rules: str, redis_url: str | None, workdir: Path) -> None:
        self.run = run
        self.rules = rules
        self.given_url = redis_url
        self.workdir = workdir
        self.embedded: EmbeddedRedis | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.hurry = False
        self.prefix = f"governor-demo-{run}"
        self.queue = self.prefix
        self.record_key = f"{self.prefix}:starts"
        self.ready_key = f"{self.prefix}:ready"
        self.broker_url = ""
        self.store_url = ""
        self._client: redis.Redis | None = None
        self.redis_pid: int | None = None
        self._had_deadlines = True
        self.redis_label = ""
        """Where Redis runs, for people: "private Redis on 127.0.0.1:PORT" or the masked URL."""

    # -- redis ------------------------------------------------------------------------------

    def start_redis(self) -> None:
        if self.given_url:
            self.broker_url = self.store_url = self.given_url
            self.redis_label = mask_url(self.given_url)
            try:  # a bad URL is told without quoting its password
                target(self.given_url, names=Names(url="--redis-url"))
            except ConfigError as exc:
                raise CliError(str(exc)) from None
            self._ping()
            self._had_deadlines = bool(self.client.exists(DEADLINES))
            return
        try:
            server = EmbeddedRedis(prefer_bundled=True)
        except FileNotFoundError:
            raise CliError(
                f"no redis-server to run: {INSTALL_HINT} (it bundles one), install Redis, "
                "or pass --redis-url"
            ) from None
        self.embedded = server
        try:
            server.start()
        except RuntimeError as exc:
            raise CliError(f"could not start a private Redis: {exc}", EXIT_FAILED) from None
        self.redis_pid = server.process.pid if server.process is not None else None
        self.broker_url, self.store_url = server.url(0), server.url(1)
        self.redis_label = f"private Redis on 127.0.0.1:{server.port}"

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.store_url, socket_connect_timeout=3.0, socket_timeout=10.0
            )
        return self._client

    def _ping(self) -> None:
        from redis.exceptions import RedisError

        try:
            self.client.ping()
        except ValueError as exc:
            raise CliError(f"bad Redis URL {mask_url(self.store_url)!r}: {exc}") from None
        except RedisError as exc:
            raise CliError(
                f"cannot reach Redis at {mask_url(self.store_url)}: {exc}", EXIT_UNREACHABLE
            ) from None

    # -- workers ----------------------------------------------------------------------------

    def node_name(self, i: int) -> str:
        return f"demo{i + 1}-{self.run}"

    def start_workers(self, loglevel: str = "INFO") -> None:
        env = {
            **os.environ,
            "BROKER_URL": self.broker_url,
            "GOVERNOR_REDIS_URL": self.store_url,
            "GOVERNOR_PREFIX": self.prefix,
            "GOVERNOR_DEMO_RULES": self.rules,
            "GOVERNOR_DEMO_READY": self.ready_key,
            "PYTHONUNBUFFERED": "1",
        }
        for name in ("CELERY_BROKER_URL", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL"):
            env.pop(name, None)  # Celery would prefer these to the app's BROKER_URL
        preexec = _parent_death_signal()
        for i in range(NODES):
            log = self.workdir / f"{self.node_name(i)}.log"
            self.logs.append(log)
            with log.open("wb") as out:
                self.workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "celery",
                            "-A",
                            "governor.cli.demo.app",
                            "worker",
                            "-P",
                            "prefork",
                            "-c",
                            str(CONCURRENCY),
                            "-n",
                            f"{self.node_name(i)}@%h",
                            "-Q",
                            self.queue,
                            "--without-gossip",
                            "--without-mingle",
                            "--without-heartbeat",
                            "--loglevel",
                            loglevel,
                        ],
                        cwd=self.workdir,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=preexec,
                    )
                )

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while self.client.scard(self.ready_key) < len(self.workers):
            self.check_workers()
            if time.monotonic() > deadline:
                raise CliError(
                    f"the workers did not start within {timeout:.0f}s:\n{self.log_tail()}",
                    EXIT_FAILED,
                )
            time.sleep(0.1)

    def check_workers(self) -> None:
        for proc, log in zip(self.workers, self.logs):
            if proc.poll() is not None:
                raise CliError(
                    f"worker {log.stem} exited with code {proc.returncode}:\n{self.log_tail(log)}",
                    EXIT_FAILED,
                )

    def log_tail(self, log: Path | None = None, chars: int = 2000) -> str:
        logs = [log] if log is not None else self.logs
        return "\n".join(
            p.read_text(errors="replace")[-chars:].rstrip() for p in logs if p.exists()
        )

    @property
    def pids(self) -> dict[str, Any]:
        """What the demo started: worker (process group leader) pids, their node names (as
        ``-n`` gave them, without the host) and the Redis pid."""
        return {
            "workers": [p.pid for p in self.workers],
            "nodes": [self.node_name(i) for i in range(len(self.workers))],
            "redis": self.redis_pid,
        }

    # -- stopping ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything started, in order: workers (warm shutdown, SIGKILL after
        ``STOP_TIMEOUT`` or a second Ctrl-C), then Redis; on a given server, delete the demo's
        keys. Never raises."""
        previous = {s: _set_handler(s, self._hurry) for s in _STOP_SIGNALS}
        try:
            self._stop_workers()
            self._cleanup_keys()
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.close()
            if self.embedded is not None:
                with contextlib.suppress(Exception):
                    self.embedded.close()
                self.embedded = None
        finally:
            for signum, handler in previous.items():
                if handler is not None:
                    _set_handler(signum, handler)

    def _hurry(self, signum: int, frame: FrameType | None) -> None:
        self.hurry = True

    def _stop_workers(self) -> None:
        # A private Redis is thrown away with all it holds: its workers are killed outright
        # (their whole process groups, at once). On a given server they shut down warmly
        # (SIGTERM), handing back the messages they hold, before the demo deletes its keys.
        first = signal.SIGTERM if self.embedded is None else signal.SIGKILL
        for proc in self.workers:
            _signal_group(proc.pid, first)
        killed = first == signal.SIGKILL
        deadline = time.monotonic() + STOP_TIMEOUT
        while any(_group_alive(p) for p in self.workers):
            if not killed and (self.hurry or time.monotonic() > deadline):
                for proc in self.workers:
                    _signal_group(proc.pid, signal.SIGKILL)
                killed, deadline = True, time.monotonic() + STOP_TIMEOUT
            elif killed and time.monotonic() > deadline:
                left = [p.pid for p in self.workers if _group_alive(p)]
                click.echo(f"warning: worker process groups {left} did not exit", err=True)
                return
            time.sleep(0.05)

    def _cleanup_keys(self) -> None:
        if self.given_url is None or not self.store_url:
            return  # the private Redis goes away with its data
        with contextlib.suppress(Exception):
            client = self.client
            keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
            # kombu's binding tables of the demo's queue (named after it: its exchange)
            keys += [f"_kombu.binding.{self.queue}", f"_kombu.binding_permanent.{self.queue}"]
            if not self._had_deadlines:  # kombu's, shared by every app: only if the demo made it
                keys.append(DEADLINES)
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    """Whether any process of the worker's group is still running (reaps the leader)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not _only_zombies(proc.pid)


def _only_zombies(pgid: int) -> bool:
    """True when every process left in the group is a zombie (Linux; False elsewhere)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return False
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
Handler = Callable[[int, FrameType | None], Any] | int | None


def _set_handler(signum: int, handler: Handler) -> Handler:
    try:
        return signal.signal(signum, handler)
    except ValueError:  # not the main thread (e.g. a test runner): leave signals alone
        return None


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[list[str]]:
    """Ctrl-C (SIGINT), SIGTERM and SIGHUP raise KeyboardInterrupt, so the demo stops through
    its clean-up; yields the names of the signals received. A signal ignored when the demo
    started (``nohup``, a background job) stays ignored."""
    seen: list[str] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        seen.append(signal.Signals(signum).name)
        raise KeyboardInterrupt(seen[-1])

    previous: dict[int, Handler] = {}
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) != signal.SIG_IGN:
            previous[sig] = _set_handler(sig, interrupt)
    try:
        yield seen
    finally:
        for num, handler in previous.items():
            if handler is not None:
                _set_handler(num, handler)
