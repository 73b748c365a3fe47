"""Backoff in Celery with a real worker (threads pool, in process), the suite's Redis and a
local HTTP upstream that enforces a quota the app does not know: every task finishes once,
none fails or spends a retry, and the upstream sees few 429s."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Task

from governor.celery import Backoff, Governor, signals
from support.celery_helpers import Recorder, new_app, worker
from support.servers import ServerHandle
from support.upstream_server import get, upstream


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


class Pauses:
    """limit_paused as the test process sees it (the threads pool runs here)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        signals.limit_paused.connect(self.receive, weak=False)

    def receive(self, sender: Any = None, **kw: Any) -> None:
        self.seen.append({k: kw.get(k) for k in ("limit", "seconds", "level", "reason")})

    def close(self) -> None:
        signals.limit_paused.disconnect(self.receive)


@pytest.mark.parametrize(
    "headers", [pytest.param("retry-after", marks=pytest.mark.compat), "ratelimit"]
)
def test_a_429_pauses_the_limit_for_every_task(redis_server: ServerHandle, headers: str) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "100/s"})  # the app's guess
    Governor(app)
    rec = Recorder(redis_server.url())
    pauses = Pauses()
    try:
        with upstream(quota=5, window=1.0, headers=headers) as up:

            @app.task(bind=True, shared=False, max_retries=0)
            def call(self: Task, n: int) -> None:
                get(up.url)
                rec.add(n=n, retries=self.request.retries)

            with worker(app, [q], concurrency=4):
                for n in range(20):
                    call.delay(n)
                runs = rec.wait(20, timeout=40)
            statuses = up.statuses()
            refused = up.refused_per_window()
    finally:
        pauses.close()
    assert sorted(r["n"] for r in runs) == list(range(20))  # each once, none failed
    assert all(r["retries"] == 0 for r in runs)  # max_retries=0, and waits never count
    assert statuses.count(200) == 20
    # the first 429 of a window pauses everyone: only calls already on their way (4 threads)
    # also get one, and a call admitted in the moment before the pause is written
    assert max(refused.values()) <= 4 + 2, refused
    assert pauses.seen and all(p["limit"] == f"queue:{q}" for p in pauses.seen)
    assert all(p["level"] == 0 and 0 < p["seconds"] <= 1.0 for p in pauses.seen)


def test_a_bare_429_pauses_exponentially(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(
        redis_server.url(),
        q,
        governor_backoff_base=0.1,
        governor_backoff_max=0.3,
        governor_tasks={"bare": "100/s"},
    )
    Governor(app)
    rec = Recorder(redis_server.url())
    pauses = Pauses()
    try:
        with upstream(quota=100, headers="none") as up:
            up.refuse_first = 4

            @app.task(name="bare", bind=True, shared=False, max_retries=0)
            def call(self: Task) -> None:
                get(up.url)
                rec.add(retries=self.request.retries)

            with worker(app, [q], concurrency=1):
                call.delay()
                runs = rec.wait(1, timeout=20)
    finally:
        pauses.close()
    assert len(runs) == 1 and runs[0]["retries"] == 0
    assert [p["level"] for p in pauses.seen] == [1, 2, 3, 4]
    assert [round(p["seconds"], 3) for p in pauses.seen] == [0.1, 0.2, 0.3, 0.3]
    assert {p["limit"] for p in pauses.seen} == {"task:bare"}
    assert {p["reason"] for p in pauses.seen} == {"HTTP 429"}


@pytest.mark.parametrize("named", [None, "queue", "all", "no-such-limit"])
def test_backoff_names_the_limit_it_pauses(redis_server: ServerHandle, named: str | None) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "100/s"})
    governor = Governor(app)
    rec = Recorder(redis_server.url())
    pauses = Pauses()
    tries: list[int] = []

    @governor.task("50/s", key=lambda customer, **_: customer, shared=False)
    def call(customer: str) -> None:
        tries.append(1)
        if len(tries) == 1:
            raise Backoff(0.2, limit=named)
        rec.add(customer=customer)

    try:
        with worker(app, [q], concurrency=1):
            call.delay("c-1")
            runs = rec.wait(1, timeout=20)
    finally:
        pauses.close()
    assert len(runs) == 1
    expected = {
        None: [call.name],  # the most specific: the key's limit
        "queue": [f"queue:{q}"],
        "all": [f"queue:{q}", call.name],
        "no-such-limit": [call.name],  # warned, and the default paused: the task is kept
    }[named]
    assert sorted(p["limit"] for p in pauses.seen) == sorted(expected)


@pytest.mark.compat
def test_eager_and_direct_calls_raise_it(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "100/s"})
    Governor(app)

    @app.task(shared=False)
    def call() -> None:
        raise Backoff(1)

    with pytest.raises(Backoff):
        call()
    with pytest.raises(Backoff):
        call.apply().get()
