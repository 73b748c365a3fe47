"""The partner API the showcase's ``call_partner`` tasks call: a small HTTP server on loopback.

It answers ``POST /v1/customers/CUSTOMER/calls`` with 200, except for a customer whose quota
at the partner ran out: after ``quota`` calls, 429 with ``Retry-After``, as real APIs do. The
task turns that answer into ``Backoff.from_response``, which pauses the customer on every worker
(see :mod:`workers.partner_api`). It runs in a thread of the showcase and counts the answers.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Partner"]

MAX_BODY = 64 * 1024


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about callers that hung up (worker nodes killed at the end); others: told."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Partner:
    """Answers every customer's calls, but at most ``quotas[customer]`` of that customer's
    (then 429 with ``Retry-After: retry_after``)."""

    def __init__(self, quotas: dict[str, int], retry_after: int = 600) -> None:
        self.quotas = dict(quotas)
        self.retry_after = retry_after
        self.answers: Counter[tuple[str, int]] = Counter()
        self.lock = threading.Lock()
        partner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                parts = self.path.strip("/").split("/")
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY or parts[:2] != ["v1", "customers"] or len(parts) != 4:
                    self._answer(404 if length <= MAX_BODY else 413, {"error": "no such call"})
                    return
                self.rfile.read(length)
                status = partner.answer(parts[2])
                headers = {"Retry-After": str(partner.retry_after)} if status == 429 else {}
                body = {"ok": True} if status == 200 else {"error": "quota exceeded"}
                self._answer(status, body, headers)

            def _answer(
                self, status: int, body: Any, headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, customer: str) -> int:
        time.sleep(0.01)  # the partner's own work
        with self.lock:
            served = self.answers[customer, 200]
            status = 429 if served >= self.quotas.get(customer, served + 1) else 200
            self.answers[customer, status] += 1
            return status

    def count(self, customer: str, status: int = 200) -> int:
        with self.lock:
            return self.answers[customer, status]

    def start(self) -> Partner:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
