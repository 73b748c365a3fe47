"""One LLM-quota scenario on real worker nodes: the chat-completions server
(:mod:`support.llm_server`), two ``celery worker`` nodes of :mod:`support.llm_app`, a backlog of
calls per organisation published at once, and optionally another client spending part of the
same quota outside governor. Shared by tests/nodes/test_llm_nodes.py and bench/llm.py."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from .llm_server import LLMServer, llm_server

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Setup:
    """The provider's quota per organisation (governor's limits equal it) and the work."""

    requests: int = 100
    tokens: int = 16_000
    window: float = 4.0
    orgs: int = 2
    calls: int = 100
    """Calls per organisation."""
    max_tokens: tuple[int, ...] = (256, 512, 1024)
    prompt_chars: tuple[int, int] = (200, 1200)
    nodes: int = 2
    concurrency: int = 4
    outside: float = 0.0
    """Share of the token quota another client spends outside governor (0: none)."""
    seed: int = 19
    transit: float = 0.1
    """governor's ``transit`` (seconds from admission to the server's count: the tasks' calls
    took 10 to 150 ms here, on 2 busy cores; without it, 1 to 2 % of calls met the server's
    full window at a window's end)."""

    @property
    def limit(self) -> dict[str, str]:
        ms = round(self.window * 1000)
        return {"requests": f"{self.requests}/{ms}ms", "tokens": f"{self.tokens}/{ms}ms"}

    def work(self) -> list[tuple[str, str, int, int]]:
        """(org, prompt, max_tokens, n) of every call, interleaved by organisation."""
        rng = random.Random(self.seed)
        out = []
        for n in range(self.calls * self.orgs):
            prompt = "p" * rng.randint(*self.prompt_chars)
            out.append((f"org-{n % self.orgs}", prompt, rng.choice(self.max_tokens), n))
        return out


@dataclass
class Result:
    mode: str
    setup: Setup
    done: int
    calls: list[list[Any]]
    """[time, n, org, status, tokens, retries] of every attempt the tasks made."""
    fills: list[float]
    """Token fill of each whole provider window while calls waited (every organisation)."""
    wall: float
    """First call to the last success (seconds)."""
    ideal: float
    """The served tokens at exactly the quota: tokens / (orgs * quota) windows."""
    outside: int = 0
    log: str = field(default="", repr=False)
    refusals: list[tuple[float, str, float]] = field(default_factory=list, repr=False)
    """The server's 429s: (time, organisation, seconds until the call would have fit)."""

    @property
    def refused(self) -> int:
        return sum(1 for c in self.calls if c[3] == 429)

    @property
    def fill(self) -> float:
        return sum(self.fills) / len(self.fills) if self.fills else 0.0


def _start(env: dict[str, str], setup: Setup, queue: str) -> tuple[list[Any], list[Path]]:
    procs, logs = [], []
    for i in range(setup.nodes):
        log = Path(f"/tmp/{env['GL_KEY']}-node{i}.log")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "celery", "-A", "llm_app", "worker", "-P", "prefork",
                    "-c", str(setup.concurrency), "-n", f"node{i}-{env['GL_KEY']}@%h",
                    "-Q", queue, "--without-gossip", "--without-mingle", "--without-heartbeat",
                    "--loglevel", "WARNING",
                ],
                cwd=HERE,
                env=env,
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )  # fmt: skip
    return procs, logs


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _outside(server: LLMServer, setup: Setup, stop: threading.Event, sent: list[int]) -> None:
    """Another client of organisation org-0: ``outside`` of its token quota, in calls like
    the tasks' (a prompt of 175 tokens, ``max_tokens`` 512: about 430 tokens on average),
    evenly spread; a refused call is sent again after its retry-after (so the client spends
    its share)."""
    import openai

    c = openai.OpenAI(base_url=server.url, api_key="x", organization="org-0", max_retries=0)
    every = setup.window * 430 / (setup.tokens * setup.outside)
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            c.chat.completions.create(
                model="local", messages=[{"role": "user", "content": "o" * 700}], max_tokens=512
            )
            sent[0] += 1
        except openai.RateLimitError as exc:
            stop.wait(float(exc.response.headers.get("retry-after-ms", "1000")) / 1000)
            continue
        next_at += every
        stop.wait(max(0.0, next_at - time.monotonic()))


def run(
    mode: str, setup: Setup, broker: str, store: str, record_url: str, timeout: float = 180.0
) -> Result:
    """Publish every call at once and wait until all succeeded (or ``timeout``)."""
    key = f"gl{uuid.uuid4().hex[:8]}"
    queue = f"llm-{key}"
    record = redis.Redis.from_url(record_url)
    with llm_server(setup.requests, setup.tokens, setup.window) as server:
        env = {
            **os.environ,
            "GL_BROKER": broker,
            "GL_STORE": store,
            "GL_RECORD": record_url,
            "GL_KEY": key,
            "GL_URL": server.url,
            "GL_MODE": mode,
            "GL_LIMIT": json.dumps(setup.limit),
            "GL_TRANSIT": str(setup.transit),
            "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        }
        procs, logs = _start(env, setup, queue)
        stop = threading.Event()
        sent = [0]
        try:
            deadline = time.monotonic() + 60
            while record.scard(f"{key}:ready") < setup.nodes:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError("nodes did not start: " + _tail(logs))
                time.sleep(0.1)
            work = setup.work()
            if setup.outside:
                threading.Thread(
                    target=_outside, args=(server, setup, stop, sent), daemon=True
                ).start()
            _send(broker, queue, work)
            deadline = time.monotonic() + timeout
            while record.llen(f"{key}:done") < len(work) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            stop.set()
            _stop(procs)
        calls = [json.loads(x) for x in record.lrange(f"{key}:calls", 0, -1)]
        done = {json.loads(x)[1] for x in record.lrange(f"{key}:done", 0, -1)}
        fills: list[float] = []
        served = 0
        first = min((c[0] for c in calls), default=0.0)
        last = max((c[0] for c in calls if c[3] == 200), default=first)
        for o in range(setup.orgs):
            org = f"org-{o}"
            mine = [c for c in server.calls(org) if c.status == 200]
            if mine:
                start = min(c.t for c in server.calls(org))
                fills += server.fill(org, start, max(c.t for c in mine))
                served += sum(c.tokens for c in mine)
        ideal = served / (setup.orgs * setup.tokens) * setup.window
        text = _tail(logs)
        refusals = list(server.refusals)
    return Result(
        mode, setup, len(done), calls, fills, last - first, ideal, sent[0], text, refusals
    )


def _send(broker: str, queue: str, work: list[tuple[str, str, int, int]]) -> None:
    from celery import Celery

    producer = Celery("producer", broker=broker)
    with producer.producer_or_acquire() as pub:
        for args in work:
            producer.send_task("llm_app.complete", args, queue=queue, producer=pub)
    producer.close()


def _tail(logs: list[Path]) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists())
