"""Parking against a real Redis (and the Redis broker): release tokens, envelopes, errors."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from governor import Limiter, StorageUnavailable
from governor.celery.waiting import parking, releaser
from governor.celery.waiting.envelope import envelope, open_envelope
from governor.embedded import EmbeddedRedis
from support.servers import ServerHandle


class Opaque:
    """Not JSON: only a pickling task can carry it."""

    def __init__(self, value: int) -> None:
        self.value = value


def test_a_release_token_tells_a_redelivery_from_a_second_copy(r: redis.Redis, prefix: str) -> None:
    claim = parking.claim_first_delivery
    assert claim(r, prefix, "t1:1:ab", "first")  # the first copy to arrive runs
    assert claim(r, prefix, "t1:1:ab", "first")  # the same copy again (redelivered, requeued)
    assert not claim(r, prefix, "t1:1:ab", "second")  # a second release of the same entry
    assert not claim(r, prefix, "t1:1:ab", None)
    # messages from before tokens existed: first wins, any other is dropped
    assert claim(r, prefix, "t2:1:ab", None)
    assert not claim(r, prefix, "t2:1:ab", None)
    assert 0 < r.pttl(f"{prefix}:{{parked}}:seen:t1:1:ab") <= parking.SEEN_TTL_MS


def _app(redis_server: ServerHandle, queue: str) -> Celery:
    app = Celery(f"pk-{uuid.uuid4().hex[:6]}", broker=redis_server.url(1), set_as_current=False)
    app.conf.update(task_default_queue=queue, accept_content=["json", "pickle"])
    return app


def _queued(redis_server: ServerHandle, queue: str) -> list[dict[str, object]]:
    broker = redis.Redis.from_url(redis_server.url(1))
    return [json.loads(raw) for raw in broker.lrange(queue, 0, -1)]


def test_the_releaser_stamps_each_publication(redis_server: ServerHandle, prefix: str) -> None:
    queue = f"pk-{uuid.uuid4().hex[:8]}"
    app = _app(redis_server, queue)

    @app.task(shared=False)
    def job(n: int) -> None: ...

    client = redis.Redis.from_url(redis_server.url(2))
    for n in range(2):
        sig = job.s(n).set(headers={"governor": {"waits": 1, "parked": f"id{n}"}})
        due = float(client.time()[0])
        parking.park(client, prefix, f"id{n}", due, envelope(app, sig, due, "test"))
    releaser_ = releaser.Releaser(app, lambda: client, prefix, horizon=5.0)
    assert releaser_.release_once() == 2
    assert parking.parked_count(client, prefix) == 0
    headers = [m["headers"]["governor"] for m in _queued(redis_server, queue)]  # type: ignore[index]
    assert sorted(h["parked"] for h in headers) == ["id0", "id1"]
    tokens = {h["release"] for h in headers}
    assert len(tokens) == 2 and all(isinstance(t, str) and len(t) == 16 for t in tokens)
    assert all(h["waits"] == 1 for h in headers)


def test_an_envelope_uses_the_tasks_serializer(redis_server: ServerHandle) -> None:
    app = _app(redis_server, "q")

    @app.task(shared=False, serializer="pickle")
    def pickled(thing: Opaque) -> None: ...

    text = envelope(app, pickled.s(Opaque(7)), 1.0, "test")
    assert json.loads(text)["ct"] == "application/x-python-serialize"
    sig, due, _ = open_envelope(app, text)
    assert due == 1.0 and sig.args[0].value == 7
    # and the call's own serializer option comes first
    text = envelope(app, pickled.s(3).set(serializer="json"), 1.0, "test")
    assert json.loads(text)["ct"] == "application/json"


@pytest.fixture
def own_redis() -> Iterator[redis.Redis]:
    """A redis-server of this test's own: it is made to refuse writes."""
    server = EmbeddedRedis().start()
    client = redis.Redis.from_url(server.url())
    try:
        yield client
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize(
    ("setup", "reply"),
    [
        ([("CONFIG", "SET", "min-replicas-to-write", "1")], "NOREPLICAS"),
        ([("CONFIG", "SET", "maxmemory", "1")], "maxmemory"),
        ([("REPLICAOF", "127.0.0.1", "1")], "read only replica"),
    ],
)
def test_a_server_refusing_writes_is_unavailable_not_a_crash(
    own_redis: redis.Redis, setup: list[tuple[str, ...]], reply: str
) -> None:
    """A Redis that is up but refuses writes (no replicas, out of memory, a replica after a
    failover) is an outage: the gate's fail_mode applies, as for a connection error."""
    lim = Limiter(own_redis, "5/s", name="refused")
    assert lim.acquire("a", now=100.0).allowed
    for command in setup:
        own_redis.execute_command(*command)
    with pytest.raises(StorageUnavailable) as info:
        lim.acquire("a", now=100.1)
    assert reply in str(info.value)


def test_parking_shards_spread_and_release_every_shard(
    redis_server: ServerHandle, prefix: str
) -> None:
    queue = f"pk-{uuid.uuid4().hex[:8]}"
    app = _app(redis_server, queue)

    @app.task(shared=False)
    def job(n: int) -> None: ...

    client = redis.Redis.from_url(redis_server.url(2))
    due = float(client.time()[0])
    ids = [parking.new_parking_id(f"task{n}:1:ab", 4) for n in range(20)]
    assert len({parking.shard_of(i) for i in ids}) >= 3 and parking.shard_of("plain:1") is None
    for n, pid in enumerate(ids):
        sig = job.s(n).set(headers={"governor": {"waits": 1, "parked": pid}})
        parking.park(client, prefix, pid, due, envelope(app, sig, due, "test"))
    parking.park(client, prefix, "old:1:cd", due, envelope(app, job.s(99), due, "test"))
    assert parking.parked_count(client, prefix, shards=4) == 21
    assert parking.parked_count(client, prefix) == 1  # unsharded: only {parked}
    assert parking.claim_first_delivery(client, prefix, ids[0], "t")
    assert not parking.claim_first_delivery(client, prefix, ids[0], "other")
    releaser_ = releaser.Releaser(app, lambda: client, prefix, horizon=5.0, shards=4)
    assert releaser_.release_once() == 21
    assert parking.parked_count(client, prefix, shards=4) == 0
    assert len(_queued(redis_server, queue)) == 21


def test_parking_waits_for_a_replica(redis_server: ServerHandle, prefix: str) -> None:
    """With governor_park_replicas, parking waits until a replica holds the task; when too few
    acknowledge in time, it stays parked with a warning."""
    from support.celery_helpers import wait_for
    from support.sentinels import LocalSentinel

    with LocalSentinel(sentinels=1, replicas=1) as setup:
        client = redis.Redis(port=setup.master_port)
        # the first sync waits for the master's diskless-sync delay (5 s by default)
        synced = wait_for(
            lambda: client.info("replication").get("slave0", {}).get("state"),
            lambda state: state == "online",
            timeout=20,
        )
        assert synced == "online"
        due = float(client.time()[0]) + 60
        assert parking.park(client, prefix, "ok:1:aa", due, "{}", replicas=1, timeout=2.0) == 1
        replica = redis.Redis(port=setup.replica_ports[0])
        assert replica.zscore(parking.keys(prefix)[0], "ok:1:aa") is not None
        # too few replicas: it stays parked (a releaser may be publishing it), with a warning
        assert parking.park(client, prefix, "few:1:bb", due, "{}", replicas=2, timeout=0.2) == 2
        assert parking.parked_count(client, prefix) == 2
        client.close()
        replica.close()
