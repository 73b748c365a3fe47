"""Every Celery pool, on the suite's Redis broker: rates, parked long waits, concurrency caps with
hand-over and fair sharing hold on 2 separate `celery worker` nodes, every task runs exactly
once (tests/support/governed_runs.py says what each queue checks).

Under a green pool (gevent, eventlet: 100 greenlets a node) nothing governor does may block the
hub: a green thread in each worker process notes its longest gap between 10 ms sleeps while
tasks wait in caps, parking, fair queues and ``BLPOP`` (a plain ``Concurrency`` cap in the
body) and governor's metrics are scraped, and the process has no OS thread but its main one
(the releaser, the fair dispatcher, the slot renewer, lease timers, the metrics server are
green threads). A task that then keeps the hub busy for 1.5 s shows the watch sees a block.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from support.brokers import RedisBroker
from support.celery_helpers import wait_for
from support.governed_runs import Run, Work, check, publish_and_wait, start
from support.servers import ServerHandle

pytestmark = [pytest.mark.worker, pytest.mark.slow]

POOLS = {
    # pool: (nodes, processes/threads/greenlets per node, concurrency cap, body seconds)
    "prefork": (2, 3, 2, 0.2),
    "threads": (2, 4, 2, 0.2),
    "solo": (2, 1, 1, 0.05),
    "gevent": (2, 100, 2, 0.2),
    "eventlet": (2, 100, 2, 0.2),
}
GREEN = ("gevent", "eventlet")
KINDS = ("rate", "park", "cap", "fair")
HUB_GAP = 0.75
"""The longest a green thread may wait for the hub while governed tasks wait (seconds): a
block by governor (a parked wait, a cap's line, BLPOP) would last a wait, 1 s or more here;
a busy shared machine delays the hub by tens of milliseconds."""
BLOCK = 1.5


@pytest.mark.parametrize("pool", list(POOLS))
def test_every_capability_holds_on_the_pool(
    pool: str, nodes_factory: Any, redis_server: ServerHandle
) -> None:
    if pool in GREEN and importlib.util.find_spec(pool) is None:  # (not imported here)
        pytest.skip(f"{pool} is not installed")
    count, concurrency, cap, sleep = POOLS[pool]
    broker = RedisBroker(redis_server.url(1))
    work = Work(hold=6 if pool in GREEN else 0)
    run = start(
        nodes_factory,
        broker,
        pool=pool,
        nodes=count,
        concurrency=concurrency,
        cap=cap,
        kinds=KINDS,
        work=work,
        sleep=sleep,
        metrics=pool in GREEN,
        # Celery 5.7 acknowledges from each greenlet: kombu's 10 connections run out and a
        # message is lost (governor.deployment.green_connections; the worker warns)
        conf={"broker_transport_options": {"max_connections": concurrency + 10}}
        if pool in GREEN
        else None,
    )
    try:
        publish_and_wait(run)
        measured = check(run)
        if pool in GREEN:
            measured["hub"] = check_hub(run, concurrency)
    finally:
        run.nodes.stop()
        broker.cleanup()
    print(f"\n{pool} x redis, {count} nodes x {concurrency}: {measured}")


def check_hub(run: Run, concurrency: int) -> str:
    """The hub watch of every worker process while the run's tasks waited and ran; then a
    task that blocks the hub, which the watch must see."""
    notes = [h for h in run.nodes.records("hub") if run.started <= h["t"] <= run.done + 0.5]
    assert len(notes) >= 4, f"the hub watch wrote {len(notes)} notes\n{run.log()}"
    gap = max(h["gap"] for h in notes)
    threads = {h["threads"] for h in notes}
    connections = max(h["redis"] for h in notes)
    assert gap < HUB_GAP, f"the hub was blocked for {gap:.2f}s\n{run.log()}"
    assert threads == {1}, f"OS threads in a worker process: {threads}"
    # one connection per green thread in a Redis call at most (100 greenlets a node, the
    # releaser, the fair dispatcher, the renewer): none kept per task
    assert connections <= concurrency + 3, connections
    before = len(run.nodes.records("hub"))
    run.nodes.send(run.queues["hold"], "pool_probe.block", [(BLOCK,)])
    seen = wait_for(
        lambda: [h["gap"] for h in run.nodes.records("hub")[before:]],
        lambda gaps: any(g >= BLOCK - 0.1 for g in gaps),
        timeout=30,
    )
    assert any(g >= BLOCK - 0.1 for g in seen), f"the watch missed a {BLOCK}s block: {seen}"
    return f"longest gap {gap * 1000:.0f} ms, 1 OS thread, <= {connections} Redis connections"
