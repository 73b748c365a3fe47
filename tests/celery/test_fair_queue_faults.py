"""The fair queue under faults (issue 18): an unreadable call (finding 14), a call the broker
refuses, a Redis error while a call is queued (finding 8), and copies made while the broker is
slow (finding 15). Explicit clocks; the suite's Redis as the store (db 2) and broker (db 1)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis

from governor.celery import Governor
from governor.celery.fair.dispatcher import FairDispatcher
from governor.celery.fair.queue import FairQueue, fair_due_key
from governor.celery.waiting.envelope import envelope
from support.celery_helpers import new_app
from support.servers import ServerHandle

T = 1_800_000_000.0


def fair_app(redis_server: ServerHandle, rules: str = "1/s", queues: int = 1) -> Any:
    """An app with ``queues`` fair queues (``rules`` each, fair by ``customer``), its governor,
    the queues' names and a ``job(customer, n)`` task."""
    names = [f"q-{uuid.uuid4().hex[:8]}" for _ in range(queues)]
    app = new_app(
        redis_server.url(),
        names[0],
        governor_queues={q: {"rules": rules, "fair_by": "customer"} for q in names},
    )
    governor = Governor(app)

    @app.task(shared=False)
    def job(customer: str, n: int) -> None: ...

    return app, governor, names, job


def fair_queue(governor: Any, name: str) -> FairQueue:
    lim = governor.gate.store.limiter("queue", governor.settings.queues[name])
    return FairQueue(lim, name)


def queue_up(governor: Any, fq: FairQueue, tenant: str, text: str, at: float = T) -> None:
    """What a denied call does: index the fair limit, then wait in its queue."""
    client = governor.gate.client
    client.zadd(fair_due_key(governor.settings.prefix), {fq.describe(): at})
    fq.put(client, f"{tenant}-{uuid.uuid4().hex[:6]}", tenant, 1.0, None, text)


def arrived(redis_server: ServerHandle, name: str) -> list[dict[str, Any]]:
    """Pop every message the broker holds for queue ``name``: their governor headers."""
    broker = redis.Redis.from_url(redis_server.url(1))
    out = []
    while (raw := broker.rpop(name)) is not None:
        out.append(json.loads(raw)["headers"]["governor"])
    return out


def claim(governor: Any, fq: FairQueue, carried: dict[str, Any], now: float) -> bool:
    """What the gate does with a copy sent on from a fair queue."""
    return fq.claim(governor.gate.client, carried["fair"], carried["release"], now=now)


def test_an_unreadable_call_does_not_stall_its_fair_queue(redis_server: ServerHandle) -> None:
    """The issue's repro: 1/s, one "not-json" call from tenant a, three good calls from b.
    Before, takes at 0, 1, 5, 9 s returned nothing but the poison, at 10.5 s the poison again,
    and b never ran: its lease counted as in flight, taking the only unit of room for good."""
    app, governor, [q], job = fair_app(redis_server)
    fq = fair_queue(governor, q)
    queue_up(governor, fq, "a", "not-json")
    for n in range(3):
        queue_up(governor, fq, "b", envelope(app, job.s("b", n).set(queue=q), 0.0, f"queue:{q}"))
    dispatcher = FairDispatcher(app, governor.gate.store, governor.settings)
    ran = []
    for t in (0, 1, 2, 3, 5, 9, 10.5):
        dispatcher.dispatch_once(now=T + t)
        for carried in arrived(redis_server, q):
            ran.append(claim(governor, fq, carried, T + t + 0.1))
    assert ran == [True, True, True]

    from governor.celery.waiting import dead_letters

    [dead] = dead_letters.entries(governor.gate.client, governor.settings.prefix)
    assert dead.kind == "fair" and dead.text == "not-json" and "unreadable" in dead.reason
    assert dead.where["tenant"] == "a"


def test_a_call_the_broker_refuses_spoils_no_other_fair_limit(redis_server: ServerHandle) -> None:
    """A readable call whose publication fails for good (a serializer nobody installed) is
    dead-lettered; before, its exception ended the whole look, so the other limits' calls
    were not sent on either."""
    app, governor, [q1, q2], job = fair_app(redis_server, queues=2)
    text = json.loads(envelope(app, job.s("a", 1).set(queue=q1), 0.0, f"queue:{q1}"))
    body = json.loads(text["body"])
    body["options"] = {**(body.get("options") or {}), "serializer": "nonesuch"}
    text["body"] = json.dumps(body)
    fq1, fq2 = fair_queue(governor, q1), fair_queue(governor, q2)
    queue_up(governor, fq1, "a", json.dumps(text))
    queue_up(governor, fq2, "b", envelope(app, job.s("b", 2).set(queue=q2), 0.0, f"queue:{q2}"))
    dispatcher = FairDispatcher(app, governor.gate.store, governor.settings)
    sent, _, _ = dispatcher.dispatch_once(now=T)
    assert sent == 1 and len(arrived(redis_server, q2)) == 1 and arrived(redis_server, q1) == []

    from governor.celery.waiting import dead_letters

    [dead] = dead_letters.entries(governor.gate.client, governor.settings.prefix)
    assert dead.kind == "fair" and "publish" in dead.reason


def test_a_redis_error_while_queueing_follows_the_fail_mode(redis_server: ServerHandle) -> None:
    """A call for a fair queue in use goes straight into it; Redis away at that moment is an
    outage (governor_fail_mode), not a task failure: before, a raw ZADD raised
    redis.ConnectionError out of the gate."""
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: {"rules": "1/s", "fair_by": "customer"}},
        governor_redis_url="redis://127.0.0.1:1/0",  # nothing listens there
        governor_fail_mode="open",
        governor_socket_timeout=0.2,
    )
    governor = Governor(app)

    @app.task(shared=False)
    def job(customer: str) -> None: ...

    gate = governor.gate
    gate.fair.busy[("queue", q)] = time.monotonic() + 60  # its fair queue is in use
    job.push_request(
        id=str(uuid.uuid4()),
        headers={},
        delivery_info={"routing_key": q, "exchange": ""},
        args=("a",),
        kwargs={},
        called_directly=False,  # as in a worker
    )
    try:
        assert gate.admit(job, ("a",), {}) is None  # fail open: it runs, ungoverned
    finally:
        job.pop_request()


def test_copies_under_a_broker_backlog_are_few_and_a_late_one_never_runs(
    redis_server: ServerHandle,
) -> None:
    """A call sent on that has not arrived is sent again; under a broker backlog, before, it
    was sent again every 10 s (a copy per 10 s of backlog, feeding it), and a copy arriving
    more than an hour after another copy had run ran again."""
    _, governor, [q], _ = fair_app(redis_server)
    client = governor.gate.client
    fq = fair_queue(governor, q)
    fq.put(client, "slow", "a", 1.0, None, "{}")
    copies = []
    for t in range(0, 101):  # the broker delivers nothing for 100 s
        copies += fq.take(client, room=1, most=10, now=T + t).calls
    assert [c.copy for c in copies] == [1, 2, 3, 4]  # at 0, 10, 30, 70 s: the wait doubles
    member = copies[0].member
    assert fq.claim(client, member, "latest", now=T + 101)  # the last copy arrives and runs
    # an hour and more later other calls' claims sweep old claims away...
    later = T + 101 + 3_700
    fq.put(client, "other", "b", 1.0, None, "{}")
    [(other, *_)] = fq.take(client, room=1, most=10, now=later).calls
    assert fq.claim(client, other, "x", now=later)
    # ... and the first copy, stuck in the backlog all along, arrives: it must not run
    assert not fq.claim(client, member, "first", now=later + 1)
    assert fq.claim(client, member, "latest", now=later + 2)  # the copy that ran, redelivered


def test_copy_marks_in_headers_are_untrusted() -> None:
    from governor.celery.fair.queue import copy_marks

    assert copy_marks({"sent": 12.5, "copy": 3}) == (12.5, 3)
    for odd in (None, "x", {"sent": "soon", "copy": "2"}, {"sent": float("nan"), "copy": True}):
        assert copy_marks(odd) == (None, 1)
    assert copy_marks({"sent": float("inf"), "copy": 10**9}) == (None, 1)


def test_an_hours_backlog_makes_eleven_copies(r: redis.Redis, prefix: str) -> None:
    """The bound docs/fairness-tenants.md gives: a copy waits 10 s, 20 s, 40 s ... up to 10
    minutes before the next is sent, so a call whose copies all sit in an hour's backlog is
    sent 11 times (before: 360)."""
    from governor import Limiter

    fq = FairQueue(Limiter(r, "1/s", name="queue", prefix=prefix), "backlog")
    fq.put(r, "slow", "a", 1.0, None, "{}")
    sent = [t for t in range(3600) if fq.take(r, room=1, most=1, now=T + t).calls]
    assert sent == [0, 11, 32, 73, 154, 315, 636, 1237, 1838, 2439, 3040]
