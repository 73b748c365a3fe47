"""A waiter handed a slot by a decision or a refund (not by a release or a sweep) comes with its
cap: an unreadable one is dead-lettered under that cap and leaves its line at once, and the slot
goes on to the next waiter (found by the chaos run of issue 18: it was dead-lettered under
``cap``, held the slot for a whole lease, then stayed lapsed in the line for good). A line of
hundreds of unreadable waiters passes the slot on in a loop (it recursed, and about the 490th
stayed handed over). The suite's Redis (store db 2, broker db 1); explicit clocks set up the
cap, the decisions run on Redis's clock (a holder that lapsed 70 s ago is lapsed on either)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis

from governor.celery import Governor
from governor.celery.types import LimitSpec, WaitState, Who, handed_by
from governor.celery.waiting import dead_letters
from governor.celery.waiting.envelope import envelope
from support.celery_helpers import new_app
from support.servers import ServerHandle


def capped(redis_server: ServerHandle) -> tuple[Any, Governor, LimitSpec, Any]:
    """An app whose queue admits 10/s, 1 at once; a task of it; its limit's spec."""
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q, governor_queues={q: {"rules": "10/s", "concurrency": 1}})

    @app.task(shared=False)
    def job(n: int) -> None: ...

    governor = Governor(app)
    spec = LimitSpec("queue", "queue", governor.settings.queues[q], q)
    return app, governor, spec, job


def letters(governor: Governor) -> set[tuple[str, str]]:
    found = dead_letters.entries(governor.gate.client, governor.settings.prefix)
    return {(x.source, x.entry) for x in found}


def test_a_decision_hands_an_unreadable_waiter_over_and_it_leaves_the_line(
    redis_server: ServerHandle,
) -> None:
    app, governor, spec, job = capped(redis_server)
    gate, q = governor.gate, spec.subject
    lim = gate.store.limiter(spec.name, spec.config)
    broker = redis.Redis.from_url(redis_server.url(1))
    t = time.time()
    assert lim.acquire(q, holder="dead:0", token="tok", now=t - 100).allowed  # lapsed at t - 70
    assert lim.wait(q, "poison:0", "not an envelope", now=t - 99).status == "queued"
    good = envelope(app, dict(job.s(1).set(queue=q, task_id="next")), 0.0, f"queue:{q}")
    assert lim.wait(q, "next:0", good, now=t - 98).status == "queued"
    # a call decides: its sweep drops the dead holder and hands its slot to the oldest waiter
    outcome = gate.decider.decide([spec], 1, WaitState(), who=Who("late:0", "tok2", "test"))
    assert not outcome.allowed and outcome.decision is not None
    assert outcome.decision.capped == "full"
    assert letters(governor) == {(f"cap:queue:{q}", "poison:0")}  # was ("cap", "poison:0")
    usage = lim.holders(q)
    assert [(h.holder, h.pending) for h in usage.holders] == [("next:0", True)]  # the slot went on
    assert usage.waiting == 0 and broker.llen(q) == 1  # next's message is out
    lim.sweep(q, now=usage.now + 3600)
    assert [h for h, _ in lim.lapsed(q, now=usage.now + 3600)] == ["next:0"]  # not the poison


def test_a_refund_hands_an_unreadable_waiter_over_and_it_leaves_the_line(
    redis_server: ServerHandle,
) -> None:
    _app, governor, spec, _job = capped(redis_server)
    gate, q = governor.gate, spec.subject
    lim = gate.store.limiter(spec.name, spec.config)
    outcome = gate.decider.decide([spec], 1, WaitState(), who=Who("first:0", "tok", "test"))
    assert outcome.allowed
    assert lim.wait(q, "poison:0", "{broken").status == "queued"
    gate.decider.refund(outcome.held, 1)  # the admission is given back (say, early deferral's)
    assert letters(governor) == {(f"cap:queue:{q}", "poison:0")}
    usage = lim.holders(q)
    assert usage.held == 0 and usage.waiting == 0  # the slot is free at once, not in a lease
    assert lim.lapsed(q, now=usage.now + 3600) == ()


def test_a_long_line_of_unreadable_waiters_passes_the_slot_on_to_its_end(
    redis_server: ServerHandle,
) -> None:
    """``accept_content`` changed under a backlog: 600 waiters nobody can read, then a readable
    one; a release hands the slot down the whole line: 600 letters, the readable one out."""
    app, governor, spec, job = capped(redis_server)
    gate, q = governor.gate, spec.subject
    lim = gate.store.limiter(spec.name, spec.config)
    first = gate.decider.decide([spec], 1, WaitState(), who=Who("first:0", "tok", "test"))
    assert first.allowed
    for n in range(600):
        assert lim.wait(q, f"old{n}:0", "{old").status == "queued"
    good = envelope(app, dict(job.s(1).set(queue=q, task_id="new")), 0.0, f"queue:{q}")
    assert lim.wait(q, "new:0", good).status == "queued"
    ((_, _, decision),) = first.held
    assert decision.hold is not None
    _, handed = lim.release(q, decision.hold)  # its body ended (as Holding gives it back)
    gate.handover.publish(handed_by(lim, q, handed))
    assert len(letters(governor)) == 600
    usage = lim.holders(q)
    assert [(h.holder, h.pending) for h in usage.holders] == [("new:0", True)]
    assert usage.waiting == 0 and redis.Redis.from_url(redis_server.url(1)).llen(q) == 1
