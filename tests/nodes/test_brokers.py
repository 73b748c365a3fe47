"""Brokers other than Redis, on 2 separate `celery worker` nodes each: RabbitMQ (127.0.0.1:5672)
with every capability (prefork and gevent: rates, parked long waits, caps with hand-over, fair
sharing; prefork: Backoff pauses, a node killed), Amazon SQS through kombu's transport against
moto's local server (prefork: the same four; tests/support/governed_runs.py says what each checks).

The Redis broker runs the same scenario under every pool (tests/nodes/test_pools.py); its Backoff
and node-kill rows are tests/nodes/test_backoff_nodes.py and tests/nodes/test_faults_nodes.py. Queue
names are new for every test and deleted after it; a broker that cannot be reached is skipped,
saying so.
"""

from __future__ import annotations

import importlib.util
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from support.brokers import (
    RABBITMQ,
    Broker,
    RabbitBroker,
    SQSBroker,
    moto_executable,
    moto_server,
    reachable,
)
from support.celery_helpers import most_at_once, most_in_window, wait_for
from support.governed_runs import Work, check, publish_and_wait, start
from support.upstream_server import upstream

pytestmark = [pytest.mark.worker, pytest.mark.slow]


@pytest.fixture
def rabbitmq() -> Iterator[RabbitBroker]:
    if not reachable(RABBITMQ):
        pytest.skip("no RabbitMQ on 127.0.0.1:5672")
    broker = RabbitBroker()
    yield broker
    broker.cleanup()


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    if moto_executable() is None:
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    pytest.importorskip("boto3")
    pytest.importorskip("pycurl")
    with moto_server() as port:
        yield port


@pytest.fixture
def sqs(moto_port: int) -> Iterator[SQSBroker]:
    broker = SQSBroker(moto_port)
    yield broker
    broker.cleanup()


def run_capabilities(
    nodes_factory: Any, broker: Broker, pool: str, concurrency: int, kinds: tuple[str, ...]
) -> dict[str, Any]:
    run = start(
        nodes_factory,
        broker,
        pool=pool,
        nodes=2,
        concurrency=concurrency,
        cap=2,
        kinds=kinds,
        work=Work(),
    )
    try:
        publish_and_wait(run)
        return check(run)
    finally:
        run.nodes.stop()


@pytest.mark.parametrize("pool", ["prefork", "gevent"])
def test_rabbitmq_rates_parking_caps_and_fairness(
    rabbitmq: RabbitBroker, nodes_factory: Any, pool: str
) -> None:
    if pool == "gevent" and importlib.util.find_spec("gevent") is None:
        pytest.skip("gevent is not installed")
    concurrency = 3 if pool == "prefork" else 100
    out = run_capabilities(
        nodes_factory, rabbitmq, pool, concurrency, ("rate", "park", "cap", "fair")
    )
    print(f"\n{pool} x rabbitmq: {out}")


def test_sqs_rates_parking_caps_and_fairness(sqs: SQSBroker, nodes_factory: Any) -> None:
    out = run_capabilities(nodes_factory, sqs, "prefork", 3, ("rate", "park", "cap", "fair"))
    print(f"\nprefork x sqs (moto): {out}")


def test_rabbitmq_a_429_pauses_every_node(rabbitmq: RabbitBroker, nodes_factory: Any) -> None:
    """A local upstream allows 10 calls a second and answers 429 with Retry-After: its pause
    reaches both nodes through Redis, every call runs once, none fails or spends a retry."""
    import uuid

    queue = f"bo-{uuid.uuid4().hex[:8]}"
    rabbitmq.made.append(queue)
    nodes = nodes_factory(
        {queue: "200/s"},
        broker=rabbitmq.url,
        conf={"imports": ["pool_probe"], "governor_prefix": f"gt{uuid.uuid4().hex[:8]}"},
    )
    with upstream(quota=10, window=1.0) as up:
        nodes.env["GT_UPSTREAM"] = up.url
        nodes.start(2, concurrency=2, queues=[queue], timeout=90)
        nodes.send(queue, "worker_app.upstream", [(n,) for n in range(40)])
        runs = wait_for(nodes.runs, lambda r: len(r) >= 40, timeout=90)
        refused = up.refused_per_window()
        statuses = up.statuses()
    assert not nodes.failures(), nodes.failures()[:3]
    assert sorted(r["n"] for r in runs) == list(range(40)), nodes.log_text()[-3000:]
    assert all(r["retries"] == 0 for r in runs)
    left = wait_for(lambda: rabbitmq.waiting([queue], nodes), lambda n: n == 0, timeout=30)
    assert left == 0
    assert len(nodes.runs()) == 40
    # a pause's first 429 stops everyone: the others meet only the calls they had in flight
    # (one per pool process), and one admitted in the moment before the pause is written
    assert max(refused.values(), default=0) <= 4 + 2, refused
    assert statuses.count(429) <= 40 // 2, statuses
    print(
        f"\nprefork x rabbitmq, Backoff: 40 calls, {statuses.count(429)} 429s in "
        f"{len(refused)} windows, at most {max(refused.values(), default=0)} in one"
    )


def test_rabbitmq_a_node_killed_mid_backlog(rabbitmq: RabbitBroker, nodes_factory: Any) -> None:
    """A node is SIGKILLed (main and pool processes) while tasks of a rate limit run, wait
    parked (its releaser among those that release them) and hold or wait for a cap's slots:
    RabbitMQ gives its unacknowledged messages to the other node, its slots come back after
    their lease (3 s), its parked tasks are released by the other node. Nothing is lost, the
    rate and the cap hold; a task runs twice only if the killed node had it in hand (its body
    running, or deferred and not yet acknowledged: at least once, as documented)."""
    run = start(
        nodes_factory,
        rabbitmq,
        pool="prefork",
        nodes=2,
        concurrency=3,
        cap=2,
        kinds=("rate", "cap"),
        work=Work(rate=40, cap=12),
        conf={"governor_concurrency_lease": 3.0},
    )
    nodes, queues = run.nodes, run.queues
    run.started = time.time()
    nodes.send(queues["cap"], "worker_app.noop", [(n,) for n in run.work.numbers("cap")])
    nodes.send(queues["rate"], "worker_app.noop", [(n,) for n in run.work.numbers("rate")])

    def under_way() -> tuple[int, int]:
        booked = {r["n"] for r in nodes.runs() if "node0" in r["node"] and r["waits"]}
        return len(booked), run.parked()

    # past the first wave of deferrals: the node runs booked tasks, others are parked
    seen = wait_for(under_way, lambda v: v[0] >= 2 and v[1] >= 3, timeout=60)
    assert seen[0] >= 2 and seen[1] >= 3, seen
    nodes.kill(0)
    killed = time.time()
    runs = wait_for(nodes.runs, lambda r: len({x["n"] for x in r}) >= run.total, timeout=120)
    left = wait_for(run.left, lambda n: n == 0, timeout=60, every=0.5)
    runs = nodes.runs()
    ends = nodes.records("ends")
    finished = {(e["id"], e["pid"]) for e in ends}
    try:
        assert left == 0, nodes.log_text()[-3000:]
        kinds = run.by_kind(runs)
        for kind, numbers in run.numbers.items():
            assert {r["n"] for r in kinds[kind]} == numbers, kind  # none lost
        failures = [f for f in nodes.failures() if "WorkerLostError" not in f["exc"]]
        assert not failures, failures[:3]
        # at least once: a second run only of what the killed node had in hand (received and
        # not done with: a body ended, or a deferral half a second before the kill)
        in_hand = had_in_hand(nodes, "node0", killed)
        twice = {i for i, c in Counter(r["id"] for r in runs).items() if c > 1}
        assert twice <= in_hand, (twice, in_hand)
        counted = [c["counted"] for c in nodes.records("counted") if c["queue"] == queues["rate"]]
        most = most_in_window(counted, 1.0)
        assert most <= 10, f"{most} admissions counted in a second under 10/s"
        cap_ids = {r["id"] for r in kinds["cap"]}
        cut = [
            {"start": r["t"], "end": killed}
            for r in runs
            if r["id"] in cap_ids and "node0" in r["node"] and (r["id"], r["pid"]) not in finished
        ]
        peak = most_at_once([e for e in ends if e["id"] in cap_ids] + cut)
        assert peak <= 2, f"{peak} bodies at once under 2 at once"
    finally:
        nodes.stop()
    print(
        f"\nprefork x rabbitmq, node SIGKILLed {killed - run.started:.1f}s in: "
        f"{len(runs)} runs of {run.total} tasks, {len(twice)} twice ({len(in_hand)} in its "
        f"hands), rate {most}/10 counted, cap {peak}/2 at once"
    )


def had_in_hand(nodes: Any, node: str, killed: float) -> set[str]:
    """Tasks whose message ``node`` received more often than it was done with before
    ``killed`` (a body that ended; a deferral half a second before: its acknowledgement
    follows at once)."""
    received = Counter(r["id"] for r in nodes.records("received") if node in r["node"])
    done = Counter(e["id"] for e in nodes.records("ends") if node in e["node"])
    done.update(
        d["id"]
        for d in nodes.records("deferred")
        if node in d["node"] and not d["parked"] and d["t"] <= killed - 0.5
    )
    return {i for i, count in received.items() if count > done[i]}
