"""Backoff on separate `celery worker` nodes (prefork): a local HTTP upstream enforces a quota
the app does not know and answers 429 with Retry-After; every task finishes once, none fails or
spends a retry, and the upstream sees at most one 429 per pool process per pause."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from support.celery_helpers import wait_for
from support.upstream_server import upstream

pytestmark = pytest.mark.worker


def test_a_429_pauses_every_node(nodes_factory: Any) -> None:
    queue = f"bo-{uuid.uuid4().hex[:6]}"
    group = nodes_factory({queue: "200/s"}, conf={"governor_prefix": f"gt{uuid.uuid4().hex[:8]}"})
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


def test_a_live_change_reaches_every_node_within_a_second(
    nodes_factory: Any, redis_server: Any
) -> None:
    import time

    import redis

    from governor.celery.config.live import REFRESH, LiveLimits

    queue = f"lv-{uuid.uuid4().hex[:6]}"
    prefix = f"gt{uuid.uuid4().hex[:8]}"
    group = nodes_factory({queue: "100/s"}, conf={"governor_prefix": prefix})
    group.start(2, concurrency=2, queues=[queue])
    for _ in range(10):  # a second at 10/s under the configuration
        group.publish(queue, 1)
        time.sleep(0.1)
    live = LiveLimits(redis.Redis.from_url(redis_server.url(2)), prefix)
    changed = time.time()
    live.set(f"queue:{queue}", {"rules": "3/s"}, "test")
    for _ in range(20):  # two seconds at 10/s under the live limit
        group.publish(queue, 1)
        time.sleep(0.1)
    runs = wait_for(group.runs, lambda r: len(r) >= 30, timeout=60)
    assert len(runs) == 30 and not group.failures()
    after = sorted(r["t"] for r in runs if r["t"] >= changed + REFRESH)
    most = max(sum(1 for t in after[i:] if t < s + 1.0) for i, s in enumerate(after))
    print(f"\nafter a live change to 3/s: at most {most} starts in a second on 2 nodes")
    assert most <= 3, after
    assert len({r["node"] for r in runs}) == 2
