"""Parked tasks that cannot be read (issue 18, finding 6): the releaser moves them to the
dead-letter place instead of keeping them picked up, so they never stop the others; there they
are counted, inspectable, re-drivable and droppable. Explicit clocks, the suite's Redis as
both governor's store (db 2) and the broker (db 1)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from celery import Celery

from governor.celery.waiting import parking
from governor.celery.waiting.envelope import envelope
from governor.celery.waiting.releaser import Releaser
from support.servers import ServerHandle

T = 1_800_000_000.0


def json_app(redis_server: ServerHandle, queue: str) -> Celery:
    """An app that accepts JSON only: a pickled envelope is unreadable to it."""
    app = Celery(f"dl-{uuid.uuid4().hex[:6]}", broker=redis_server.url(1), set_as_current=False)
    app.conf.update(task_default_queue=queue, accept_content=["json"])
    return app


def queued(redis_server: ServerHandle, queue: str) -> list[dict[str, object]]:
    broker = redis.Redis.from_url(redis_server.url(1))
    return [json.loads(raw) for raw in broker.lrange(queue, 0, -1)]


def unreadable(app: Celery, task: object, n: int) -> str:
    """A parked envelope this app cannot open: half pickled (accept_content refuses it), half
    not JSON at all."""
    if n % 2:
        return "not-json"
    sig = task.s(n).set(serializer="pickle")  # type: ignore[attr-defined]
    return envelope(app, sig, T, "queue:q")


@pytest.fixture
def store(redis_server: ServerHandle) -> redis.Redis:
    return redis.Redis.from_url(redis_server.url(2))


def test_unreadable_parked_tasks_do_not_stop_the_releaser(
    redis_server: ServerHandle, store: redis.Redis, prefix: str
) -> None:
    """Twice a batch of unreadable entries, due first, and one good one: before, the
    unreadable ones were kept picked up and taken again first each time their pickup lapsed,
    a batch at a time, so the good one never went out."""
    queue = f"dl-{uuid.uuid4().hex[:8]}"
    app = json_app(redis_server, queue)

    @app.task(shared=False)
    def job(n: int) -> None: ...

    batch = 2
    for n in range(2 * batch):
        parking.park(store, prefix, f"bad{n}", T - 10, unreadable(app, job, n))
    good = job.s(99).set(headers={"governor": {"waits": 1, "parked": "good"}})
    parking.park(store, prefix, "good", T - 5, envelope(app, good, T - 5, "queue:q"))
    releaser = Releaser(app, lambda: store, prefix, horizon=5.0, pickup=2.0, batch=batch)
    published = sum(releaser.release_once(now=T + k) for k in range(8))
    assert published == 1
    assert [m["headers"]["governor"]["parked"] for m in queued(redis_server, queue)] == ["good"]  # type: ignore[index]
    assert parking.parked_count(store, prefix) == 0

    from governor.celery.waiting import dead_letters

    dead = dead_letters.entries(store, prefix)
    assert sorted(d.entry for d in dead) == [f"bad{n}" for n in range(2 * batch)]
    assert {d.kind for d in dead} == {"parked"} and dead_letters.count(store, prefix) == 4
    assert all("unreadable" in d.reason for d in dead)
    # the text is kept as it was parked
    assert {d.text for d in dead if d.entry == "bad1"} == {"not-json"}


def test_a_dead_parked_task_is_redriven_once_readable_or_dropped(
    redis_server: ServerHandle, store: redis.Redis, prefix: str
) -> None:
    from governor.celery.waiting import dead_letters

    queue = f"dl-{uuid.uuid4().hex[:8]}"
    app = json_app(redis_server, queue)

    @app.task(shared=False)
    def job(n: int) -> None: ...

    for n in (0, 2):  # pickled: readable once the app accepts pickle
        parking.park(store, prefix, f"p{n}", T, unreadable(app, job, n))
    parking.park(store, prefix, "junk", T, "not-json")
    releaser = Releaser(app, lambda: store, prefix, horizon=5.0, pickup=2.0, batch=10)
    assert releaser.release_once(now=T) == 0
    dead = {d.entry: d for d in dead_letters.entries(store, prefix)}
    assert sorted(dead) == ["junk", "p0", "p2"]
    # the same entry dead-lettered again (a releaser died between the two steps) is one letter
    again = dead_letters.put(store, prefix, "parked", "junk", "not-json", "unreadable", now=T + 1)
    assert again.id == dead["junk"].id and again.times == 2
    assert dead_letters.count(store, prefix) == 3

    app.conf.accept_content = ["json", "pickle"]  # the operator fixes the app
    assert dead_letters.redrive(store, prefix, dead["p0"]) == "p0"
    assert dead_letters.count(store, prefix) == 2
    assert releaser.release_once(now=T + 10) == 1
    sent = queued(redis_server, queue)
    assert len(sent) == 1
    assert dead_letters.drop(store, prefix, [dead["junk"].id, "nonesuch"]) == 1
    assert [d.entry for d in dead_letters.entries(store, prefix)] == ["p2"]
    assert dead_letters.get(store, prefix, dead["p2"].id) is not None
    assert dead_letters.get(store, prefix, dead["junk"].id) is None


def test_a_message_the_broker_refuses_for_good_is_dead_lettered(
    redis_server: ServerHandle, store: redis.Redis, prefix: str
) -> None:
    """Readable, but its publication fails for a reason that will not pass (here: it names a
    serializer nobody installed): dead-lettered, and the next one goes out."""
    queue = f"dl-{uuid.uuid4().hex[:8]}"
    app = json_app(redis_server, queue)

    @app.task(shared=False)
    def job(n: int) -> None: ...

    text = json.loads(envelope(app, job.s(1), T, "queue:q"))
    body = json.loads(text["body"])
    body["options"] = {**(body.get("options") or {}), "serializer": "nonesuch"}
    text["body"] = json.dumps(body)
    parking.park(store, prefix, "refused", T - 1, json.dumps(text))
    parking.park(store, prefix, "fine", T, envelope(app, job.s(2), T, "queue:q"))
    releaser = Releaser(app, lambda: store, prefix, horizon=5.0, pickup=2.0, batch=10)
    assert releaser.release_once(now=T) == 1

    from governor.celery.waiting import dead_letters

    [dead] = dead_letters.entries(store, prefix)
    assert dead.entry == "refused" and "publish" in dead.reason
    assert parking.parked_count(store, prefix) == 0
