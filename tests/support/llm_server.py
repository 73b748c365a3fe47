"""A local HTTP server that speaks OpenAI's chat-completions format and enforces per-organisation
quotas, for the tests and benchmarks of limits with meters (issue 19).

``POST /v1/chat/completions`` (what the ``openai`` client sends with ``base_url`` pointed here):

- the organisation is the ``OpenAI-Organization`` header (``OpenAI(organization=...)``);
- prompt tokens are the characters of the messages' contents divided by 4 (rounded down), the
  completion's length is drawn at random, uniformly from 1 to ``max_tokens`` (seeded);
- each organisation may use ``requests`` calls and ``tokens`` tokens (prompt + completion) in
  any ``window`` seconds (a sliding window: exact, like the provider's own counters); a call is
  counted with its real tokens when it arrives, or refused with 429, OpenAI's error body and
  ``retry-after``/``retry-after-ms`` (when the window will have room for it);
- every answer carries ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets as Go
  durations, ``1.5s``), as OpenAI's do;
- an accepted call answers after ``base + per_token * completion tokens`` seconds.

It runs in a thread of the calling process, on loopback, and records every call it answered
(:attr:`LLMServer.log`): time, organisation, status, prompt and completion tokens.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Call", "LLMServer", "llm_server"]


@dataclass(frozen=True, slots=True)
class Call:
    t: float
    org: str
    status: int
    prompt: int
    completion: int

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion


def go_duration(seconds: float) -> str:
    """``1.5s``, ``120ms``, ``1m2.5s``: how OpenAI writes its resets."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.3g}s" if minutes else f"{rest:.3g}s"


class LLMServer:
    """Per organisation: at most ``requests`` calls and ``tokens`` tokens in any ``window``."""

    def __init__(
        self,
        requests: int,
        tokens: int,
        window: float,
        *,
        base: float = 0.05,
        per_token: float = 0.0002,
        seed: int = 19,
    ) -> None:
        self.requests, self.tokens, self.window = requests, tokens, window
        self.base, self.per_token = base, per_token
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.counted: dict[str, deque[tuple[float, int]]] = {}
        self.log: list[Call] = []
        self.refusals: list[tuple[float, str, float]] = []
        """(time, organisation, seconds until it would have fit) of every 429."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                org = self.headers.get("OpenAI-Organization") or "-"
                status, headers, payload, delay = server.answer(org, body)
                if delay:
                    time.sleep(delay)
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    # -- the provider ----------------------------------------------------------------------

    def answer(
        self, org: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, str], dict[str, Any], float]:
        """(status, headers, JSON body, seconds to take) for one call."""
        messages = body.get("messages") or []
        prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4
        most = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        now = time.time()
        with self.lock:
            completion = self.random.randint(1, max(1, most))
            log = self.counted.setdefault(org, deque())
            while log and log[0][0] <= now - self.window:
                log.popleft()
            used = sum(n for _, n in log)
            total = prompt + completion
            fits = len(log) + 1 <= self.requests and used + total <= self.tokens
            if fits:
                log.append((now, total))
                used += total
            self.log.append(Call(now, org, 200 if fits else 429, prompt, completion if fits else 0))
            headers = self._headers(log, used, now)
            if not fits:
                wait = self._room_in(log, total, now)
                self.refusals.append((now, org, wait))
        if not fits:
            headers["retry-after"] = str(max(1, math.ceil(wait)))
            headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
            kind = "requests" if len(log) + 1 > self.requests else "tokens"
            error = {
                "message": f"Rate limit reached for {kind} in organization {org}",
                "type": kind,
                "param": None,
                "code": "rate_limit_exceeded",
            }
            return 429, headers, {"error": error}, 0.0
        payload = {
            "id": f"chatcmpl-{len(self.log)}",
            "object": "chat.completion",
            "created": int(now),
            "model": str(body.get("model") or "local"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "x" * min(completion, 64)},
                    "finish_reason": "length" if completion >= most else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": total,
            },
        }
        return 200, headers, payload, self.base + self.per_token * completion

    def _headers(self, log: deque[tuple[float, int]], used: int, now: float) -> dict[str, str]:
        oldest = (log[0][0] + self.window - now) if log else 0.0
        return {
            "x-ratelimit-limit-requests": str(self.requests),
            "x-ratelimit-remaining-requests": str(max(0, self.requests - len(log))),
            "x-ratelimit-reset-requests": go_duration(oldest),
            "x-ratelimit-limit-tokens": str(self.tokens),
            "x-ratelimit-remaining-tokens": str(max(0, self.tokens - used)),
            "x-ratelimit-reset-tokens": go_duration((log[-1][0] + self.window - now) if log else 0),
        }

    def _room_in(self, log: deque[tuple[float, int]], total: int, now: float) -> float:
        """Seconds until the window has room for one more call of ``total`` tokens."""
        used, count = sum(n for _, n in log), len(log)
        for t, n in log:  # oldest first: each leaves the window at t + window
            used, count = used - n, count - 1
            if used + total <= self.tokens and count + 1 <= self.requests:
                return max(0.0, t + self.window - now)
        return self.window

    # -- what it saw -------------------------------------------------------------------------

    def calls(self, org: str | None = None) -> list[Call]:
        with self.lock:
            return [c for c in self.log if org is None or c.org == org]

    def fill(self, org: str, start: float, end: float) -> list[float]:
        """Token fill of each whole window ``[start + k*window, start + (k+1)*window)`` that
        ends by ``end``: tokens the organisation was served in it over its quota."""
        windows = int((end - start) // self.window)
        used = [0] * windows
        for c in self.calls(org):
            k = int((c.t - start) // self.window)
            if c.status == 200 and 0 <= k < windows:
                used[k] += c.tokens
        return [u / self.tokens for u in used]


@contextmanager
def llm_server(requests: int, tokens: int, window: float, **kw: Any) -> Iterator[LLMServer]:
    server = LLMServer(requests, tokens, window, **kw)
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
        thread.join(5)
