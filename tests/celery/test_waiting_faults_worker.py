"""Unreadable waiting messages and revoked fair calls with a real worker (threads pool, in
process; its own releaser and fair dispatcher threads) and the suite's Redis as broker: nothing
stays parked or in transit, every other task runs once."""

from __future__ import annotations

import uuid

from celery.worker.state import revoked

from governor.celery import Governor
from governor.celery.fair.queue import FairQueue, fair_due_key
from governor.celery.waiting import dead_letters, parking
from governor.celery.waiting.envelope import envelope
from support.celery_helpers import Recorder, new_app, wait_for, worker
from support.servers import ServerHandle


def test_the_worker_dead_letters_what_it_cannot_read(redis_server: ServerHandle) -> None:
    """A parked entry and a fair-queue call that do not open: the worker's releaser and fair
    dispatcher move them to the dead letters; the good ones beside them run."""
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: {"rules": "2/s", "fair_by": "customer"}},
        governor_park_after=1.0,
        governor_release_interval=0.1,
    )
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(customer: str, n: int) -> None:
        rec.add(customer=customer, n=n)

    client, prefix = governor.gate.client, governor.settings.prefix
    now = float(client.time()[0])
    parking.park(client, prefix, "junk:1:aa", now, "not-json")
    good = job.s("p", 1).set(queue=q)
    parking.park(client, prefix, "good:1:aa", now, envelope(app, good, now, f"queue:{q}"))
    fq = FairQueue(governor.gate.store.limiter("queue", governor.settings.queues[q]), q)
    client.zadd(fair_due_key(prefix), {fq.describe(): now})
    fq.put(client, "poison", "a", 1.0, None, "not-json")
    for n in range(3):
        text = envelope(app, job.s("b", n).set(queue=q), 0.0, f"queue:{q}")
        fq.put(client, f"b{n}", "b", 1.0, None, text)
    with worker(app, [q], concurrency=2):
        runs = rec.wait(4, timeout=20)
        letters = wait_for(
            lambda: dead_letters.entries(client, prefix), lambda d: len(d) == 2, timeout=10
        )
    assert sorted((r["customer"], r["n"]) for r in runs) == [("b", 0), ("b", 1), ("b", 2), ("p", 1)]
    assert sorted(d.kind for d in letters) == ["fair", "parked"]
    assert parking.parked_count(client, prefix) == 0
    assert fq.take(client, room=0, most=0).flying == 0  # nothing left in transit


def test_a_revoked_call_leaves_its_fair_queue(redis_server: ServerHandle) -> None:
    """Calls wait in a fair queue; one is revoked meanwhile. Its copy, sent on, is discarded by
    the worker, and its call leaves the queue: it never runs, nothing stays in transit, and
    the others run once."""
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(), q, governor_queues={q: {"rules": "1/s", "fair_by": "customer"}}
    )
    governor = Governor(app)
    rec = Recorder(redis_server.url())
    client = governor.gate.client

    @app.task(shared=False)
    def job(customer: str, n: int) -> None:
        rec.add(customer=customer, n=n)

    fq = FairQueue(governor.gate.store.limiter("queue", governor.settings.queues[q]), q)
    [messages] = fq.key_names("fm")
    doomed = str(uuid.uuid4())
    try:
        with worker(app, [q], concurrency=2):
            for n in range(6):
                job.apply_async(("a", n), task_id=doomed if n == 5 else None)
            queued = wait_for(
                lambda: [m.decode() for m in client.hkeys(messages)],
                lambda members: any(doomed in m for m in members),
                timeout=10,
                every=0.02,
            )
            assert any(doomed in m for m in queued)
            revoked.add(doomed)  # what a revoke broadcast does in every worker
            runs = rec.wait(5, timeout=20)
            left = wait_for(
                lambda: fq.take(client, room=0, most=0),
                lambda t: t.waiting == 0 and t.flying == 0,
                timeout=20,
            )
    finally:
        revoked.discard(doomed)
    assert sorted(r["n"] for r in rec.all()) == [0, 1, 2, 3, 4] == sorted(r["n"] for r in runs)
    assert (left.waiting, left.flying) == (0, 0)
