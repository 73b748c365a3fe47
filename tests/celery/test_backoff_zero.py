"""A Backoff with a wait of 0 (finding 5): ``Retry-After: 0``, an HTTP-date or a reset already
past on this host's clock (clock skew), or ``Backoff(0)``. The upstream refused, so the task
runs again after the capped exponential pause; it never fails for it."""

from __future__ import annotations

import time
import uuid
from email.utils import formatdate
from typing import Any

import pytest
from celery import Task

from governor.celery import Backoff, Governor, signals
from support.celery_helpers import Recorder, new_app, worker
from support.servers import ServerHandle

PAST = time.time() - 3600  # an hour behind: a server clock far behind this host's
WAITS: dict[str, Any] = {
    "Backoff(0)": lambda: Backoff(0),
    "Retry-After: 0": lambda: Backoff.from_response({"Retry-After": "0"}),
    "a past HTTP-date": lambda: Backoff.from_response(
        {"Retry-After": formatdate(PAST, usegmt=True)}
    ),
    "a past X-RateLimit-Reset": lambda: Backoff.from_response(
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(PAST))}
    ),
}


@pytest.mark.parametrize("answer", list(WAITS))
def test_a_wait_of_zero_runs_the_task_again(
    redis_server: ServerHandle, failures: list[BaseException], answer: str
) -> None:
    backoff = WAITS[answer]()
    assert backoff.retry_after == 0.0
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: "100/s"},
        governor_backoff_base=0.05,
        governor_backoff_max=0.05,
    )
    Governor(app)
    rec = Recorder(redis_server.url())
    paused: list[float] = []

    def receive(sender: Any = None, seconds: float = 0.0, **_: Any) -> None:
        paused.append(seconds)

    signals.limit_paused.connect(receive, weak=False)
    try:

        @app.task(bind=True, shared=False, max_retries=0)
        def call(self: Task) -> None:
            rec.add(retries=self.request.retries)
            if len(rec.all()) == 1:
                raise backoff

        with worker(app, [q], concurrency=1):
            call.delay()
            runs = rec.wait(2, timeout=20)
    finally:
        signals.limit_paused.disconnect(receive)
    assert not failures, failures
    assert len(runs) == 2 and all(r["retries"] == 0 for r in runs)
    assert paused == [pytest.approx(0.05, abs=1e-3)]  # the exponential pause's first step
