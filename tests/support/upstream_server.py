"""A local HTTP upstream for tests: it enforces a quota the app does not know and answers
HTTP 429 with the headers real APIs send. It runs in a thread of the test process, on loopback,
and records every request it answered: (time, status)."""

from __future__ import annotations

import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Upstream:
    """At most ``quota`` requests per fixed window of ``window`` seconds (aligned to the Unix
    clock); the rest get 429. ``headers``: "retry-after" (delta-seconds, rounded up, as RFC 9110
    has it), "ratelimit" (the IETF field), or "none" (a bare 429)."""

    def __init__(self, quota: int, window: float = 1.0, headers: str = "retry-after") -> None:
        self.quota, self.window, self.headers = quota, window, headers
        self.lock = threading.Lock()
        self.counts: dict[int, int] = {}
        self.log: list[tuple[float, int]] = []
        self.refuse_first = 0
        """Refuse this many requests first, whatever the quota (a bare 429 each)."""
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, headers = upstream.answer()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/call"

    def answer(self) -> tuple[int, dict[str, str]]:
        now = time.time()
        with self.lock:
            if self.refuse_first > 0:
                self.refuse_first -= 1
                self.log.append((now, 429))
                return 429, {}
            index = math.floor(now / self.window)
            used = self.counts.get(index, 0)
            if used < self.quota:
                self.counts[index] = used + 1
                self.log.append((now, 200))
                return 200, {}
            self.log.append((now, 429))
        reset = (index + 1) * self.window - now
        if self.headers == "retry-after":
            return 429, {"Retry-After": str(math.ceil(reset))}
        if self.headers == "ratelimit":
            return 429, {
                "RateLimit-Policy": f'"q";q={self.quota};w={math.ceil(self.window)}',
                "RateLimit": f'"q";r=0;t={math.ceil(reset)}',
            }
        return 429, {}

    def statuses(self) -> list[int]:
        with self.lock:
            return [s for _, s in self.log]

    def refused_per_window(self) -> dict[int, int]:
        """429s per quota window (index -> count)."""
        out: dict[int, int] = {}
        with self.lock:
            for t, status in self.log:
                if status == 429:
                    index = math.floor(t / self.window)
                    out[index] = out.get(index, 0) + 1
        return out


def get(url: str) -> None:
    """Call the upstream as a task would; a 429 or 503 becomes a Backoff read from its
    headers."""
    from governor.celery import Backoff

    try:
        urllib.request.urlopen(url, timeout=5).close()
    except urllib.error.HTTPError as exc:
        if exc.code in (429, 503):
            raise Backoff.from_response(exc) from None
        raise


@contextmanager
def upstream(quota: int, window: float = 1.0, headers: str = "retry-after") -> Iterator[Upstream]:
    server = Upstream(quota, window, headers)
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
        thread.join(5)
