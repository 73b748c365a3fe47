"""The limiter on a real Redis Cluster: one slot per script call, subjects spread over the nodes.

A private cluster of three masters (no replicas, tests/support/local_cluster.py) is started
once for the module with the redis-server of :func:`governor.embedded.find_redis_server`.
Tests use an explicit clock unless they are about Redis ``TIME``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.cluster import RedisCluster
from redis.crc import key_slot

from governor import Decision, Limiter, Rule, aio
from governor.celery import Governor
from governor.celery.config.limit_config import limit_config
from governor.celery.config.settings import load_settings
from governor.celery.config.store import Store
from governor.cli import cli
from governor.connect import cluster_supported
from governor.direct import lane_for
from governor.embedded import find_redis_server, free_port
from governor.plan import most_in_window
from support.celery_helpers import Recorder, new_app, wait_for
from support.celery_helpers import worker as celery_worker
from support.local_cluster import MASTERS, SLOTS, LocalCluster
from support.local_cluster import command as _command
from support.servers import ServerHandle

# the versions matrix (noxfile.py) runs this file: RedisCluster (sync, asyncio, Celery, CLI)
pytestmark = pytest.mark.compat
NEEDS_TRANSACTIONS = pytest.mark.skipif(
    not cluster_supported(), reason="a Redis Cluster needs redis-py 6.1 (transactions)"
)
"""Tests of what runs transactions on the cluster (parking, live limits) or connects through
governor_redis_cluster / --cluster, which refuse an older redis-py."""

ALL = ["sliding_log", "gcra", "token_bucket", "fixed_window", "sliding_window"]
T0 = 1_700_000_000.0  # 20 s into a minute: fixed windows of a second and a minute stay put
NAME = "partner:{api}"  # an awkward limiter name too: escaped inside the hash tag

_PIECES = ["{", "}", "{}", "}{", ":", "{a:b}", "%7B", "%", "ümlaut", "日本", "🚦", " ", "*", "?[x]"]
SUBJECTS = [f"{_PIECES[i % 14]}{i}{_PIECES[i * 5 % 14]}" for i in range(200)]


# -- the cluster (tests/support/local_cluster.py) ---------------------------------------------


def _port_of(rc: RedisCluster, key: str) -> int:
    """The port of the node that owns ``key``'s slot, in the client's slot map."""
    return int(rc.get_node_from_key(key).port)  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    try:
        executable = find_redis_server()
    except FileNotFoundError as exc:
        pytest.skip(f"cannot start a Redis Cluster: {exc}")
    local = LocalCluster(executable)
    try:
        local.start()
    except (OSError, RuntimeError, redis.RedisError) as exc:
        local.close()
        pytest.skip(f"cannot start a Redis Cluster with {executable}: {exc}")
    try:
        yield local
    finally:
        local.close()


@pytest.fixture(scope="module")
def rc(cluster: LocalCluster) -> Iterator[RedisCluster]:
    client = cluster.client()
    yield client
    client.close()


def make(rc: RedisCluster, prefix: str, rules: str, algorithm: str) -> Limiter:
    return Limiter(rc, rules, algorithm=algorithm, name=NAME, prefix=prefix)


def one_subject_per_node(rc: RedisCluster, lim: Limiter) -> list[str]:
    """The first subject of SUBJECTS on each node (in port order)."""
    chosen: dict[int, str] = {}
    for subject in SUBJECTS:
        chosen.setdefault(_port_of(rc, lim.keys(subject)[0]), subject)
    assert len(chosen) == MASTERS, "SUBJECTS should cover every node"
    return [chosen[port] for port in sorted(chosen)]


# -- tests ------------------------------------------------------------------------------------


def test_the_cluster_is_real(cluster: LocalCluster, rc: RedisCluster) -> None:
    primaries = {node.port for node in rc.get_primaries()}  # type: ignore[no-untyped-call]
    assert primaries == set(cluster.ports)
    slots: dict[tuple[int, int], dict[str, Any]] = rc.cluster_slots()  # type: ignore[assignment]
    assert sum(end - start + 1 for start, end in slots) == SLOTS
    assert {node["primary"][1] for node in slots.values()} == primaries


@pytest.mark.parametrize("algorithm", ALL)
def test_every_key_of_a_subject_is_in_one_slot(cluster: LocalCluster, algorithm: str) -> None:
    lim = Limiter(None, "1/s", algorithm=algorithm, name=NAME)
    node = next(iter(cluster.nodes.values()))
    subjects: list[str | int] = [*SUBJECTS[:40], 42, -7]
    for subject in subjects:
        state, block = lim.keys(subject)
        slot = key_slot(state.encode())
        assert key_slot(block.encode()) == slot
        assert _command(node, "CLUSTER", "KEYSLOT", state) == slot  # the server agrees
        assert _command(node, "CLUSTER", "KEYSLOT", block) == slot


@pytest.mark.parametrize("algorithm", ALL)
def test_many_subjects_decide_on_every_node(
    cluster: LocalCluster, rc: RedisCluster, prefix: str, algorithm: str
) -> None:
    lim = make(rc, prefix, "2/s, 5/m", algorithm)
    second, minute = Rule.parse("2/s"), Rule.parse("5/m")
    for subject in SUBJECTS:
        pattern: list[tuple[bool, Rule | None]] = []
        for at, tries in ((T0, 3), (T0 + 1.5, 3), (T0 + 3, 2)):
            for _ in range(tries):
                d = lim.acquire(subject, now=at)
                assert d.now == at and d.blocked is None
                pattern.append((d.allowed, d.rule))
        assert pattern == [
            (True, None),
            (True, None),
            (False, second),
            (True, None),
            (True, None),
            (False, second),
            (True, None),
            (False, minute),
        ], f"{algorithm} {subject!r}"
        assert not lim.peek(subject, now=T0 + 3).allowed
        assert lim.usage(subject, now=T0 + 3).rules[1].used == 5

    # where the keys are, asked of each node itself: a node only holds keys of its own slots
    found = cluster.keys_by_node(f"{prefix}:*")
    states = {lim.keys(subject)[0]: subject for subject in SUBJECTS}
    assert set().union(*found.values()) == set(states)
    for port, keys in found.items():
        for key in keys:
            assert _port_of(rc, key) == port
    assert sum(1 for keys in found.values() if keys) == MASTERS  # spread over all (at least 2)

    listed = list(lim.subjects(count=50))
    assert sorted(listed) == sorted(SUBJECTS)  # SCAN went to every node, nothing repeated


def test_subjects_with_decoded_responses(cluster: LocalCluster, prefix: str) -> None:
    client = cluster.client(decode_responses=True)
    try:
        lim = Limiter(client, "1/s", name=NAME, prefix=prefix)
        subjects = SUBJECTS[:30]
        for subject in subjects:
            lim.block(subject, 60, "maintenance: {all}", now=T0)
        assert sorted(lim.subjects()) == sorted(subjects)
        assert lim.acquire(subjects[0], now=T0 + 1).blocked == "maintenance: {all}"
    finally:
        client.close()


@pytest.mark.parametrize("algorithm", ALL)
def test_block_unblock_usage_reset(
    cluster: LocalCluster, rc: RedisCluster, prefix: str, algorithm: str
) -> None:
    lim = make(rc, prefix, "10/s, 3/h", algorithm)
    subjects = one_subject_per_node(rc, lim)
    for subject in subjects:
        state, block = lim.keys(subject)
        node = cluster.nodes[_port_of(rc, block)]
        assert lim.acquire(subject, now=T0).allowed
        assert lim.block(subject, 30, "chargeback {fraud}: yes", now=T0) == T0 + 30
        assert node.exists(state, block) == 2  # both keys on the node that owns the slot
        d = lim.acquire(subject, now=T0 + 10)
        assert (d.allowed, d.blocked, d.retry_after, d.rule) == (
            False,
            "chargeback {fraud}: yes",
            20.0,
            None,
        )
        usage = lim.usage(subject, now=T0 + 10)
        assert (usage.blocked, usage.blocked_for, usage.subject) == (
            "chargeback {fraud}: yes",
            20.0,
            subject,
        )
        assert [r.used for r in usage.rules] == [0, 1]
        assert lim.unblock(subject) is True and lim.unblock(subject) is False
        assert node.exists(block) == 0
        assert lim.acquire(subject, now=T0 + 10).allowed
        assert lim.acquire(subject, now=T0 + 11).allowed
        d = lim.acquire(subject, now=T0 + 12)
        assert not d.allowed and d.rule == Rule.parse("3/h")
        assert lim.usage(subject, now=T0 + 12).rules[1].used == 3
        lim.reset(subject)
        assert node.exists(state) == 0
        assert lim.usage(subject, now=T0 + 12).rules[1].used == 0
        assert lim.acquire(subject, now=T0 + 12).allowed
    assert sorted(lim.subjects()) == sorted(subjects)


@pytest.mark.parametrize("algorithm", ALL)
def test_reserve_claim_refund(rc: RedisCluster, prefix: str, algorithm: str) -> None:
    lim = make(rc, prefix, "1/s, 3/m", algorithm)
    for subject in one_subject_per_node(rc, lim):
        assert lim.acquire(subject, now=T0).allowed
        booked = lim.reserve(subject, now=T0 + 0.1, tolerance=0.05)
        if not lim.algorithm.books:  # acts as acquire
            assert not booked.allowed and booked.slot is None and booked.retry_after > 0
            d = lim.acquire(subject, now=T0 + 1.1)  # sliding_window may hold back a bucket
            assert d.allowed
            assert lim.usage(subject, now=T0 + 1.1).rules[1].used == 2
            lim.refund(subject, d, now=T0 + 1.1)
            assert lim.usage(subject, now=T0 + 1.1).rules[1].used == 1
            continue
        assert booked.booked and booked.slot is not None
        assert booked.slot.start == pytest.approx(T0 + 1) and booked.slot.end == pytest.approx(
            T0 + 1.05
        )
        assert booked.retry_after == pytest.approx(0.9)
        assert not lim.acquire(subject, now=T0 + 1.5).allowed  # the booking counts
        early = lim.claim(subject, booked.slot, now=T0 + 0.99)
        assert not early.allowed and early.retry_after == pytest.approx(0.01)
        assert lim.claim(subject, booked.slot, now=T0 + 1.02).allowed
        assert lim.usage(subject, now=T0 + 2.5).rules[1].used == 2
        d = lim.acquire(subject, now=T0 + 2.5)
        assert d.allowed and d.remaining == 0
        assert not lim.acquire(subject, now=T0 + 3.6).allowed  # 3/m is used up
        lim.refund(subject, d, now=T0 + 3.6)
        assert lim.usage(subject, now=T0 + 3.6).rules[1].used == 2
        assert lim.acquire(subject, now=T0 + 3.6).allowed


def test_script_cache_flush_on_every_node(
    cluster: LocalCluster, rc: RedisCluster, prefix: str
) -> None:
    lim = make(rc, prefix, "1/s", "sliding_log")
    subjects = one_subject_per_node(rc, lim)
    for subject in subjects:
        assert lim.acquire(subject, now=T0).allowed
    for node in cluster.nodes.values():
        node.script_flush()
    for subject in subjects:  # EVALSHA fails with NOSCRIPT on the owning node, EVAL follows
        assert not lim.acquire(subject, now=T0).allowed
        assert lim.acquire(subject, now=T0 + 1).allowed


def test_threads_on_server_time_stay_within_the_limit(cluster: LocalCluster, prefix: str) -> None:
    """Three threads per algorithm, all five at once, hammer one subject on Redis TIME."""
    limit, per_algorithm, seconds = 8, 3, 1.5
    jobs = [algorithm for algorithm in ALL for _ in range(per_algorithm)]
    start = threading.Barrier(len(jobs))
    results: list[list[int]] = [[] for _ in jobs]  # admitted moments in microseconds, per thread
    errors: list[BaseException] = []

    def hammer(index: int) -> None:
        client = cluster.client()
        try:
            lim = make(client, prefix, f"{limit}/s", jobs[index])
            start.wait()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                d = lim.acquire("one {hot}: subject")
                if d.allowed:
                    results[index].append(round(d.now * 1_000_000))
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)
        finally:
            client.close()

    workers = [threading.Thread(target=hammer, args=(i,)) for i in range(len(jobs))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert not errors, errors
    for algorithm in ALL:
        mine = [result for job, result in zip(jobs, results) if job == algorithm]
        stamps = [t for result in mine for t in result]
        assert sum(1 for result in mine if result) >= 2, f"{algorithm}: no overlap"
        assert len(stamps) >= limit, f"{algorithm}: only {len(stamps)} admitted in {seconds}s"
        seen = most_in_window(stamps, 1_000_000)
        if algorithm in ("sliding_log", "sliding_window"):
            assert seen <= limit, f"{algorithm}: {seen} admitted within one second"
        elif algorithm == "fixed_window":
            per_second: dict[int, int] = {}
            for t in stamps:
                per_second[t // 1_000_000] = per_second.get(t // 1_000_000, 0) + 1
            assert max(per_second.values()) <= limit, f"fixed_window: {per_second}"
            assert seen <= 2 * limit
        else:  # gcra, token_bucket: a burst of the limit, then the limit per second
            assert seen <= 2 * limit, f"{algorithm}: {seen} admitted within one second"


@pytest.mark.parametrize("algorithm", ALL)
def test_asyncio_cluster_gives_the_same_answers(
    cluster: LocalCluster, rc: RedisCluster, prefix: str, algorithm: str
) -> None:
    rules = "3/s, 5/m"  # one name, two prefixes: each subject's twin keys share a slot
    sync = Limiter(rc, rules, algorithm=algorithm, name=NAME, prefix=f"{prefix}:sync")
    subjects = [*one_subject_per_node(rc, sync), *SUBJECTS[100:110]]

    async def run() -> None:
        client = cluster.async_client()
        lim = aio.Limiter(client, rules, algorithm=algorithm, name=NAME, prefix=f"{prefix}:async")
        try:
            for subject in subjects:
                for step in range(12):
                    now = T0 + step * 0.3
                    cost = 1 + step % 2
                    mine: Decision = await lim.acquire(subject, cost, now=now)
                    assert mine == sync.acquire(subject, cost, now=now), (subject, step)
                    assert await lim.peek(subject, now=now) == sync.peek(subject, now=now)
                    b1 = await lim.reserve(subject, now=now, tolerance=0.01)
                    b2 = sync.reserve(subject, now=now, tolerance=0.01)
                    assert b1 == b2
                    if b1.slot and b2.slot:
                        at = b1.slot.start
                        assert await lim.claim(subject, b1.slot, now=at) == sync.claim(
                            subject, b2.slot, now=at
                        )
                usage = await lim.usage(subject, now=T0 + 4)
                assert usage == sync.usage(subject, now=T0 + 4)
            listed = [s async for s in lim.subjects(count=5)]
            assert sorted(listed) == sorted(subjects) == sorted(sync.subjects(count=5))
            later = T0 + 3600  # after every booking
            for subject in subjects:
                d1 = await lim.acquire(subject, now=later)
                d2 = sync.acquire(subject, now=later)
                assert d1 == d2 and d1.allowed
                await lim.refund(subject, d1, now=later)
                sync.refund(subject, d2, now=later)
                assert await lim.usage(subject, now=later) == sync.usage(subject, now=later)
                assert await lim.block(subject, 10, "why {not}", now=later) == later + 10
                assert sync.block(subject, 10, "why {not}", now=later) == later + 10
                blocked = await lim.acquire(subject, now=later + 5)
                assert blocked == sync.acquire(subject, now=later + 5)
                assert blocked.blocked == "why {not}" and blocked.retry_after == 5.0
                assert await lim.usage(subject, now=later + 5) == sync.usage(subject, now=later + 5)
                assert await lim.unblock(subject) is True and sync.unblock(subject) is True
                assert await lim.unblock(subject) is False
                await lim.reset(subject)
                sync.reset(subject)
                assert (await lim.usage(subject, now=T0 + 4)).rules[1].used == 0
            assert [s async for s in lim.subjects()] == list(sync.subjects()) == []
        finally:
            await client.aclose()

    asyncio.run(run())


# -- governor's settings, the Celery integration, the CLI and doctor on the cluster -----------


@NEEDS_TRANSACTIONS
def test_a_celery_app_decides_on_the_cluster(
    cluster: LocalCluster, redis_server: ServerHandle
) -> None:
    """``governor_redis_cluster``: the Store makes a RedisCluster, and a worker (its broker on
    the suite's Redis) is governed through it."""
    nodes = ",".join(f"127.0.0.1:{port}" for port in cluster.ports[:2])  # two are enough
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(),
        q,
        governor_redis_url=f"redis://{nodes}",
        governor_redis_cluster=True,
        governor_queues={q: "4/s"},
        governor_park_after=5.0,
    )
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @governor.task(
        "1/m", key=lambda customer, **_: customer, limit_name="per-customer", shared=False
    )
    def job(customer: str, i: int) -> None:
        rec.add(customer=customer, i=i)

    app.finalize()
    prefix = app.conf.governor_prefix
    store = Store(load_settings(app.conf))
    assert isinstance(store.client, RedisCluster) and lane_for(store.client) is None
    lim = store.limiter("api", limit_config("2/s", "sliding_log", "test", 30.0))
    for subject in one_subject_per_node(store.client, lim):  # type: ignore[arg-type]
        assert [lim.acquire(subject, now=T0).allowed for _ in range(3)] == [True, True, False]

    customers = [f"c{i}" for i in range(6)]
    with celery_worker(app, [q]):
        for i, customer in enumerate(customers):
            job.delay(customer, i)
        job.delay("c0", 99)  # 1/m per customer: a wait longer than park_after (parked)
        seen = rec.wait(6, timeout=20)
        parked = wait_for(
            lambda: store.client.zcard(f"{prefix}:{{parked}}:due"), lambda n: n == 1, timeout=10
        )
    assert sorted(r["customer"] for r in seen) == customers
    assert most_in_window([r["t"] for r in seen], 1.0) <= 4 + 1
    assert parked == 1  # the one long wait is parked (one slot holds every parked task)
    per_node = cluster.keys_by_node(f"{prefix}:*")
    assert sum(1 for keys in per_node.values() if keys) >= 2  # spread over the masters


def _invoke(*args: str) -> Any:
    runner = CliRunner(env={"COLUMNS": "120", "GOVERNOR_REDIS_URL": ""})
    return runner.invoke(cli, list(args), catch_exceptions=False)


@NEEDS_TRANSACTIONS
def test_cli_and_doctor_on_the_cluster(
    cluster: LocalCluster, rc: RedisCluster, prefix: str
) -> None:
    # a minute's rule: the subjects' state outlives the whole test (a 5/s log is gone after a
    # second, and on a loaded machine the last status came later than that)
    lim = Limiter(rc, "5/m", name="partner-api", prefix=prefix)
    subjects = one_subject_per_node(rc, lim)
    for subject in subjects:
        lim.acquire(subject)
    url = f"redis://127.0.0.1:{cluster.ports[0]},127.0.0.1:{cluster.ports[1]}"
    status = _invoke("--redis-url", url, "--cluster", "--prefix", prefix, "status", "--json")
    assert status.exit_code == 0, status.output
    (found,) = json.loads(status.stdout)["limits"]
    assert found["name"] == "partner-api" and found["subject_count"] == MASTERS

    doctor = _invoke("--redis-url", url, "--cluster", "doctor", "--json")
    checks = json.loads(doctor.stdout)["checks"]
    coverage = [c for c in checks if c["check"] == "cluster"]
    assert len(coverage) == MASTERS and all(c["status"] == "ok" for c in coverage)
    assert "16384/16384 slots ok" in coverage[0]["detail"]
    assert [c["status"] for c in checks if c["check"] == "persistence"] == ["FAIL"] * MASTERS
    assert doctor.exit_code == 1  # no persistence anywhere

    if importlib.util.find_spec("flask") is not None:  # the dashboard takes the same options
        from governor.cli.common import State
        from governor.dashboard.server import Dashboard
        from support.dashboard_helpers import get

        state = State(redis_url=url, prefix=prefix, cluster=True)
        with Dashboard(state, port=0, interval=0.3) as board:
            read = wait_for(  # the first reading may still be under way
                lambda: get(f"{board.url}/api/limits")[1]["limits"], bool, timeout=10
            )
            (shown,) = read
            assert shown["name"] == "partner-api" and len(shown["subjects"]) == MASTERS
            listed = get(f"{board.url}/api/limit?label=partner-api")[1]
            assert sorted(s["subject"] for s in listed["subjects"]) == sorted(subjects)

    plain = _invoke("--redis-url", url, "status")
    assert plain.exit_code == 2 and "set --cluster" in plain.stderr
    runner = CliRunner(env={"GOVERNOR_REDIS_URL": url, "GOVERNOR_REDIS_CLUSTER": "1"})
    from_env = runner.invoke(cli, ["--prefix", prefix, "status", "--json"])
    assert from_env.exit_code == 0 and json.loads(from_env.stdout)["limits"]
    not_a_cluster = _invoke(
        "--redis-url", f"redis://127.0.0.1:{free_port()}", "--cluster", "status"
    )
    assert not_a_cluster.exit_code == 3 and "Redis Cluster cannot be connected" in (
        not_a_cluster.stderr
    )


@NEEDS_TRANSACTIONS
def test_parking_shards_spread_over_the_cluster(rc: RedisCluster, prefix: str) -> None:
    from governor.celery.waiting import parking

    ids = [parking.new_parking_id(f"task{n}:1:ab", 8) for n in range(40)]
    due = float(rc.time()[0])
    for pid in ids:
        parking.park(rc, prefix, pid, due, json.dumps({"due": due}))  # type: ignore[arg-type]
    slots = {rc.keyslot(parking.keys(prefix, parking.shard_of(pid))[0]) for pid in ids}
    ports = {_port_of(rc, parking.keys(prefix, parking.shard_of(pid))[0]) for pid in ids}
    print(f"\n40 parked with 8 shards: {len(slots)} slots on {len(ports)} masters")
    assert len(slots) >= 6 and len(ports) >= 2  # no single slot holds every parked task
    assert parking.parked_count(rc, prefix, shards=8) == 40  # type: ignore[arg-type]
    assert parking.claim_first_delivery(rc, prefix, ids[0], "t")  # type: ignore[arg-type]
    _, taken = parking.take_due(rc, prefix, 5.0, 30.0, 100, shards=8)  # type: ignore[arg-type]
    assert sorted(pid for pid, _ in taken) == sorted(ids)
    for pid in ids:
        parking.forget_released(rc, prefix, pid)  # type: ignore[arg-type]
    assert parking.parked_count(rc, prefix, shards=8) == 0  # type: ignore[arg-type]
