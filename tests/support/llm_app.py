"""The Celery app of the LLM-quota scenarios (tests/nodes/test_llm_nodes.py, bench/llm.py): one
task calls a chat-completions server (tests/support/llm_server.py) with the real ``openai``
client, as issue 19's example does. Configured from the environment:

GL_BROKER / GL_STORE / GL_RECORD   Redis URLs (broker, governor, records)
GL_KEY      record key prefix (and governor's prefix)
GL_URL      the server's base URL (``http://127.0.0.1:<port>/v1``)
GL_MODE     "settle": governor's limits, settle and observe (the example); "blind": settle
            without observe; "nosettle": the same limits, reserving the worst case and never
            settling; "learned": the tokens learned
            (``learned(prompt + max_tokens)``), settle and observe; "retry": no governor, a 429
            is retried after its retry-after (``self.retry``)
GL_LIMIT    JSON: governor's rules per meter (``{"requests": "60/4s", "tokens": "8000/4s"}``)
GL_TRANSIT  ``governor_transit`` (seconds; default 0)

Each attempt appends [time, n, org, status, tokens, retries] to ``<GL_KEY>:calls``; a task that
succeeded appends [time, n] to ``<GL_KEY>:done``; ``worker_ready`` adds the node to
``<GL_KEY>:ready``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Any

import openai
import redis
from celery import Celery, Task
from celery.signals import worker_process_init, worker_ready

from governor.celery import Backoff, GovernedTask, Governor, learned, observe, settle
from governor.upstream import wait_from_headers

KEY = os.environ.get("GL_KEY", "gl")
MODE = os.environ.get("GL_MODE", "settle")
app = Celery("llm_app", broker=os.environ.get("GL_BROKER", "redis://127.0.0.1:6379/1"))
app.conf.update(
    governor_redis_url=os.environ.get("GL_STORE"),
    governor_prefix=KEY,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
)
Governor(app)
_record = redis.Redis.from_url(os.environ.get("GL_RECORD", "redis://127.0.0.1:6379/3"))
_clients: dict[tuple[int, str], openai.OpenAI] = {}


def client(org: str) -> openai.OpenAI:
    """One client per process and organisation (a forked pool process makes its own)."""
    key = (os.getpid(), org)
    if key not in _clients:
        _clients[key] = openai.OpenAI(
            base_url=os.environ["GL_URL"],
            api_key="test",
            organization=org,
            max_retries=0,
            timeout=30,
        )
    return _clients[key]


def estimate(prompt: str, max_tokens: int) -> int:
    return len(prompt) // 4 + max_tokens


def _cost(org: str, prompt: str, max_tokens: int, **_: Any) -> dict[str, Any]:
    tokens = estimate(prompt, max_tokens)
    if MODE == "learned":
        return {"requests": 1, "tokens": learned(tokens, most=tokens)}
    return {"requests": 1, "tokens": tokens}


governed: dict[str, Any] = {}
if MODE != "retry":
    governed = {
        "base": GovernedTask,
        "governor_limit": json.loads(os.environ.get("GL_LIMIT") or "{}"),
        "governor_transit": float(os.environ.get("GL_TRANSIT") or 0),
        "governor_key": lambda org, **_: org,
        "governor_cost": _cost,
    }


@app.task(bind=True, name="llm_app.complete", max_retries=None, **governed)
def complete(self: Task, org: str, prompt: str, max_tokens: int, n: int) -> str:
    try:
        raw = client(org).chat.completions.with_raw_response.create(
            model="local",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
        )
    except openai.RateLimitError as err:
        _note(self, n, org, 429, 0)
        if MODE == "retry":
            raise self.retry(countdown=wait_from_headers(err.response) or 1.0) from None
        raise Backoff.from_response(err.response) from None
    resp = raw.parse()
    assert resp.usage is not None
    if MODE in ("settle", "learned", "blind"):
        settle(self, tokens=resp.usage.total_tokens)  # the unused reservation goes back
    if MODE in ("settle", "learned"):
        observe(self, raw)  # the provider's remaining counters
    _note(self, n, org, 200, resp.usage.total_tokens)
    _record.rpush(f"{KEY}:done", json.dumps([time.time(), n]))
    return resp.choices[0].message.content or ""


def _note(task: Task, n: int, org: str, status: int, tokens: int) -> None:
    row = [time.time(), n, org, status, tokens, task.request.retries]
    _record.rpush(f"{KEY}:calls", json.dumps(row))


@worker_process_init.connect
def _warm(**_: Any) -> None:
    """Pay the client's lazy work (imports, its models' validators, the HTTP connection pool)
    before the first task, with one real call: governor counts a call when it admits it, the
    server when it arrives, and a first call that took a second and a half to leave a fresh
    process (measured here) met the server's count a window later."""
    # one real call, for an organisation of its own (not counted with the tasks')
    with contextlib.suppress(openai.OpenAIError):
        client("warm").chat.completions.with_raw_response.create(
            model="local", messages=[{"role": "user", "content": "warm"}], max_tokens=1
        )


@worker_ready.connect
def _ready(sender: Any = None, **_: Any) -> None:
    _record.sadd(f"{KEY}:ready", f"{socket.gethostname()}:{os.getpid()}:{sender.hostname}")
