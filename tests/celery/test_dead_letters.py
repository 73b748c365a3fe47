"""The dead-letter place beyond parking: metrics, a cap's hand-over, a revoked fair call, and the
age rule that keeps a very late fair copy from running. The suite's Redis (store db 2, broker
db 1), explicit clocks where the scripts take them."""

from __future__ import annotations

import json
import urllib.request
import uuid
from types import SimpleNamespace
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from governor import Limiter
from governor.celery import Governor, metrics
from governor.celery.config.settings import load_settings
from governor.celery.config.store import Store
from governor.celery.fair.dispatcher import FairDispatcher
from governor.celery.fair.queue import CLAIMS_LONG_MS, CLAIMS_MS, FairQueue
from governor.celery.types import handed_by
from governor.celery.waiting import dead_letters
from governor.celery.waiting.envelope import envelope
from governor.celery.waiting.handover import Handover
from governor.embedded import free_port
from support.celery_helpers import new_app
from support.servers import ServerHandle

T = 1_800_000_000.0
HOUR, DAY = CLAIMS_MS / 1000, CLAIMS_LONG_MS / 1000


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_dead_letters_are_counted_and_held_in_metrics(redis_server: ServerHandle) -> None:
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q)
    governor = Governor(app)
    client, prefix = governor.gate.client, governor.settings.prefix
    port = free_port()
    metrics.install(app, port, "127.0.0.1", multiprocess=False)
    try:
        dead_letters.put(client, prefix, "parked", "p1", "not-json", "unreadable")
        dead_letters.put(client, prefix, "parked", "p1", "not-json", "unreadable")  # again
        fair = dead_letters.put(client, prefix, "fair:queue:q", "m1", "{}", "cannot publish")
        seen = scrape(port)
        assert seen[("governor_dead_lettered_total", (("kind", "parked"),))] == 1
        assert seen[("governor_dead_lettered_total", (("kind", "fair"),))] == 1
        assert seen[("governor_dead_letters", ())] == 2
        dead_letters.drop(client, prefix, [fair.id])  # an operator drops one: read at scrape
        assert scrape(port)[("governor_dead_letters", ())] == 1
    finally:
        metrics.uninstall()


def test_a_handed_over_message_that_cannot_be_read_is_dead_lettered(
    redis_server: ServerHandle,
) -> None:
    """The cap line's hand-over (the process that freed a slot publishes the waiter's message):
    an unreadable one is dead-lettered under its cap, a readable one goes out."""
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q)

    @app.task(shared=False)
    def job(n: int) -> None: ...

    client = redis.Redis.from_url(redis_server.url(2))
    settings = load_settings(app.conf)
    prefix = settings.prefix
    handover = Handover(app, Store(settings), settings)
    cap = Limiter(client, None, concurrency=1, name="queue", prefix=prefix)
    good = envelope(app, job.s(1).set(queue=q), 0.0, "queue:q")
    handed = handed_by(cap, "emails", [("bad:0", "not-json"), ("ok:0", good)])
    assert handover.publish(handed) == 1
    [letter] = dead_letters.entries(client, prefix)
    assert (letter.source, letter.kind, letter.entry) == ("cap:queue:emails", "cap", "bad:0")
    broker = redis.Redis.from_url(redis_server.url(1))
    assert broker.llen(q) == 1


def fair_setup(redis_server: ServerHandle) -> tuple[Any, Any, FairQueue, Any]:
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q, governor_queues={q: {"rules": "5/s", "fair_by": "c"}})
    governor = Governor(app)

    @app.task(shared=False)
    def job(c: str) -> None: ...

    lim = governor.gate.store.limiter("queue", governor.settings.queues[q])
    return app, governor, FairQueue(lim, q), job


def test_a_revoked_fair_call_leaves_its_queue(redis_server: ServerHandle) -> None:
    """A copy Celery discards (revoked, or past its expires) takes its call out of transit:
    otherwise each copy would be discarded in turn, and the call sent again for good."""
    app, governor, fq, job = fair_setup(redis_server)
    client = governor.gate.client
    fq.put(client, "m", "a", 1.0, None, envelope(app, job.s("a"), 0.0, "queue:q"))
    [sent] = fq.take(client, room=1, most=5, now=T).calls
    dispatcher = FairDispatcher(app, governor.gate.store, governor.settings)
    carried = {"fair": sent.member, "release": "tok", "sent": T, "copy": 1, "fq": fq.describe()}
    dispatcher.forget_revoked(request=SimpleNamespace(id="x", governor=carried))
    assert fq.take(client, room=1, most=5, now=T + 3600).calls == []  # never sent again
    assert not fq.claim(client, sent.member, "another", now=T + 3601)
    dispatcher.forget_revoked(request=SimpleNamespace(id="y", headers={}))  # not a fair copy


def test_a_copy_whose_claim_was_forgotten_runs_only_if_it_cannot_be_a_second(
    redis_server: ServerHandle,
) -> None:
    """Claims are remembered an hour (a day for calls sent more than once). A copy that finds
    no claim and no waiting call: the only copy of its call, within a day, is a redelivery of
    the copy that ran (it runs); an older one, or one of several, is dropped."""
    _, governor, fq, _ = fair_setup(redis_server)
    client = governor.gate.client

    def sent_once(name: str, at: float) -> str:
        fq.put(client, name, "a", 1.0, None, "{}")
        [call] = fq.take(client, room=1, most=5, now=at).calls
        assert fq.claim(client, call.member, "ran", now=at + 1, sent=at, copy=1)
        return call.member

    def sweep(at: float) -> None:  # another call's claim forgets claims that are due
        fq.put(client, f"s{at}", "b", 1.0, None, "{}")
        [call] = fq.take(client, room=1, most=5, now=at).calls
        assert fq.claim(client, call.member, "s", now=at, sent=at, copy=1)

    one = sent_once("one", T)
    sweep(T + HOUR + 10)
    assert fq.claim(client, one, "ran", now=T + HOUR + 20, sent=T, copy=1)  # redelivered
    late = sent_once("late", T + 10)
    sweep(T + DAY + 20)
    assert not fq.claim(client, late, "ran", now=T + DAY + 30, sent=T + 10, copy=1)
    # a call sent twice: its claim is kept a day, so the first copy is told apart by its token
    fq.put(client, "twice", "c", 1.0, None, "{}")
    [first] = fq.take(client, room=1, most=5, now=T).calls
    [second] = fq.take(client, room=1, most=5, now=T + 11).calls
    assert second.copy == 2 and fq.claim(client, second.member, "2nd", now=T + 12, sent=T + 11)
    sweep(T + HOUR + 100)
    assert not fq.claim(client, first.member, "1st", now=T + HOUR + 110, sent=T, copy=1)
    assert fq.claim(client, first.member, "2nd", now=T + HOUR + 120, sent=T + 11, copy=2)
    # a young copy of a call Redis lost (a failover) runs: nothing is lost
    assert fq.claim(client, "000000000099:lost", "t", now=T + 5, sent=T, copy=1)


def test_letters_show_what_they_hold(redis_server: ServerHandle) -> None:
    client = redis.Redis.from_url(redis_server.url(2))
    prefix = f"gt{uuid.uuid4().hex[:10]}"
    text = json.dumps({"task": "proj.report", "body": "…"})
    a = dead_letters.put(client, prefix, "parked", "p", text, "x" * 5000, now=T)
    b = dead_letters.put(client, prefix, "cap:queue:q", "h:0", b"\xff\x00", "unreadable", now=T + 1)
    assert a.task == "proj.report" and len(a.reason) == dead_letters.MAX_REASON
    assert b.task is None and dead_letters.get(client, prefix, b.id).text == b"\xff\x00"  # type: ignore[union-attr]
    assert [d.id for d in dead_letters.entries(client, prefix)] == [a.id, b.id]
    assert [d.id for d in dead_letters.entries(client, prefix, limit=1)] == [a.id]
    assert dead_letters.entries(client, prefix, limit=0) == [] and a.at == T
    client.hset(dead_letters.keys(prefix)[0], "odd", "not json")  # not ours: shown as it is
    client.zadd(dead_letters.keys(prefix)[1], {"odd": 0})
    assert dead_letters.get(client, prefix, "odd").reason == "unreadable record"  # type: ignore[union-attr]
