"""Governed tasks inside Celery's canvas, with a result backend, on a real worker (threads
pool): a deferral neither completes a chord early nor runs its callback twice, a chain's next
step gets the governed step's result, a group's results are all there."""

from __future__ import annotations

import uuid

import pytest
from celery import chain, chord, group

from governor.celery import Governor, signals
from support.celery_helpers import Recorder, new_app, worker
from support.servers import ServerHandle


@pytest.mark.compat
def test_chains_chords_and_groups_under_a_limit(redis_server: ServerHandle) -> None:
    q = f"cv-{uuid.uuid4().hex[:6]}"
    base = redis_server.url().rsplit("/", 1)[0]
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: "4/s"},
        result_backend=f"{base}/4",
        task_ignore_result=False,
    )
    Governor(app)
    rec = Recorder(redis_server.url())
    deferred: list[str] = []

    def count(sender: object = None, **_: object) -> None:
        deferred.append(str(getattr(sender, "name", sender)))

    signals.task_deferred.connect(count, weak=False)

    @app.task(shared=False)
    def double(n: int) -> int:
        rec.add(kind="double", n=n)
        return 2 * n

    @app.task(shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(shared=False)
    def total(values: list[int]) -> int:
        rec.add(kind="callback", n=sum(values))
        return sum(values)

    with worker(app, [q], concurrency=4):
        chained = chain(double.s(5), add.s(1), double.s()).apply_async()
        chorded = chord([double.s(n) for n in range(8)], total.s()).apply_async()
        grouped = group(double.s(n) for n in range(6)).apply_async()
        assert chained.get(timeout=40) == 22  # (5*2 + 1) * 2, each step after the one before
        assert chorded.get(timeout=40) == sum(2 * n for n in range(8))
        assert grouped.get(timeout=40) == [2 * n for n in range(6)]
    signals.task_deferred.disconnect(count)
    assert len(deferred) >= 5  # the limit made calls wait, inside the chain, chord and group
    callbacks = [r for r in rec.all() if r["kind"] == "callback"]
    assert len(callbacks) == 1  # the chord's callback ran once, after all of its header
    doubles = [r for r in rec.all() if r["kind"] == "double"]
    assert len(doubles) == 2 + 8 + 6  # every governed call ran once
