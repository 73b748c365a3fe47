"""Backoff on separate `celery worker` nodes (prefork): a local HTTP upstream enforces a quota
the app does not know and answers 429 with Retry-After; every task finishes once, none fails or
spends a retry, and the upstream sees at most one 429 per pool process per pause."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from upstream_server import upstream
from worker_nodes import Nodes

from celery_helpers import wait_for
from conftest import ServerHandle

pytestmark = pytest.mark.worker


@pytest.fixture
def nodes(redis_server: ServerHandle) -> Iterator[Any]:
    made: list[Nodes] = []

    def make(queues: dict[str, Any], **kw: Any) -> Nodes:
        n = Nodes(redis_server.url(1), redis_server.url(2), redis_server.url(3), queues, **kw)
        made.append(n)
        return n

    yield make
    for n in made:
        n.stop()


def test_a_429_pauses_every_node(nodes: Any) -> None:
    queue = f"bo-{uuid.uuid4().hex[:6]}"
    group = nodes({queue: "200/s"}, conf={"governor_prefix": f"gt{uuid.uuid4().hex[:8]}"})
    with upstream(quota=10, window=1.0) as up:
        group.env["GT_UPSTREAM"] = up.url
        group.start(2, concurrency=2, queues=[queue])
        group.publish(queue, 60, task="worker_app.upstream")
        runs = wait_for(group.runs, lambda r: len(r) >= 60, timeout=60)
        refused = up.refused_per_window()
        statuses = up.statuses()
    assert not group.failures(), group.failures()[:3]
    assert sorted(r["n"] for r in runs) == list(range(60)), group.log_text()[-3000:]
    assert all(r["retries"] == 0 for r in runs)
    span = max(r["t"] for r in runs) - min(r["t"] for r in runs)
    print(
        f"\n60 calls to an upstream allowing 10/s, 2 nodes x 2 processes: {span:.1f}s "
        f"(ideal 5-6 s), {statuses.count(429)} 429s in {len(refused)} windows, "
        f"at most {max(refused.values(), default=0)} in one"
    )
    # a pause's first 429 stops everyone: the others meet only the calls they had in flight
    # (one per pool process), and one admitted in the moment before the pause is written
    assert max(refused.values(), default=0) <= 4 + 2, refused
    assert statuses.count(429) <= 60 // 2, statuses
