"""Slots carried over to the process's next task (governor/celery/decisions/carried.py), in
process against the suite's Redis: a roomy cap's slot lingers after its task and is given back
in the next decision of that cap (one script, not two), by the carrier thread when no task
follows, at once under a tight cap; a waiter gets the freed slot before the next task."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals as celery_signals
from celery.app.task import Context

from governor import Limiter
from governor.celery import Governor
from governor.celery.admission.gate import Gate
from governor.celery.signals import slot_lost
from governor.celery.types import WaitState, Who
from support.celery_helpers import new_app, wait_for
from support.gate_helpers import LongWay, admit, request
from support.servers import ServerHandle


def run(gate: Gate, task: Any, q: str, **kwargs: Any) -> Context:
    """One task through the gate and to its body's end (``task_postrun``); its request."""
    req = request(q)
    assert admit(gate, task, req, **kwargs) is None
    celery_signals.task_postrun.send(sender=task, task_id=req.id, task=task)
    return req


class Counted:
    """Counts a limiter method's calls (the scripts a task costs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.count = 0
        original = getattr(Limiter, name)

        def counting(lim: Limiter, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(lim, *args, **kwargs)

        monkeypatch.setattr(Limiter, name, counting)


def capped(redis_server: ServerHandle, config: dict[str, Any]) -> tuple[Any, Governor, str]:
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q, governor_queues={q: config})
    governor = Governor(app)

    @app.task(shared=False)
    def job(**_: Any) -> None: ...

    app.finalize()
    return app.tasks[job.name], governor, q


@pytest.fixture
def roomy(redis_server: ServerHandle) -> Iterator[tuple[Any, Governor, str]]:
    """A queue capped at 10 (a task leaves 9 free: its slot may linger), linger long enough
    that only the test decides when the carrier would give a slot back."""
    task, governor, q = capped(redis_server, {"concurrency": 10})
    governor.gate.carried.linger = 60.0
    yield task, governor, q
    governor.gate.holding.release_all()


def holders(governor: Governor, q: str) -> list[str]:
    lim = governor.gate.store.limiter("queue", governor.settings.queues[q])
    return [h.holder for h in lim.holders(q).holders]


def test_the_next_task_gives_the_slot_back_in_its_own_decision(
    roomy: tuple[Any, Governor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    task, governor, q = roomy
    releases = Counted(monkeypatch, "release")
    decisions = Counted(monkeypatch, "acquire")
    first = run(governor.gate, task, q)
    assert holders(governor, q) == [f"{first.id}:0"]  # it ended; its slot lingers
    for _ in range(5):
        req = run(governor.gate, task, q)
        assert holders(governor, q) == [f"{req.id}:0"]  # the previous one given back
    assert decisions.count == 6 and releases.count == 0  # one script a task
    governor.gate.holding.release_all()  # the process leaves: what lingers goes back
    assert holders(governor, q) == []


def test_with_a_carried_slot_a_capped_call_takes_the_short_way(
    roomy: tuple[Any, Governor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    task, governor, q = roomy
    gate = governor.gate
    decisions = Counted(monkeypatch, "acquire")
    long_way = LongWay(gate, monkeypatch)
    for _ in range(6):
        run(gate, task, q)
    # the first call takes the long way (nothing carried yet); the others the short one,
    # each one script that takes its slot and gives the previous task's back
    assert long_way.count == 1 and decisions.count == 6 and gate.admitted == 6
    lim = gate.store.limiter("queue", governor.settings.queues[q])
    for n in range(9):  # the cap fills up elsewhere, and a task waits in its line
        assert lim.acquire(q, holder=f"other{n}:0").allowed
    assert lim.wait(q, "waiter:0", "its message").status == "queued"
    published: list[Any] = []
    monkeypatch.setattr(gate.handover, "publish", published.extend)
    deferred = admit(gate, task, request(q))
    # the carried slot went to the waiter; the call took the long way, to the cap's line
    assert [h for h, _, _ in published] == ["waiter:0"]
    assert deferred is not None and "waits for a slot" in str(deferred)
    assert long_way.count == 2


def test_a_lingering_slot_that_is_lost_sends_no_slot_lost(
    roomy: tuple[Any, Governor, str],
) -> None:
    """Its task ended: nothing runs over the cap if it is lost (Redis lost it, say)."""
    task, governor, q = roomy
    run(governor.gate, task, q)
    [(permit, _)] = governor.gate.carried._slots.values()
    assert permit.ended
    sent: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        sent.append(kwargs)

    slot_lost.connect(receiver, weak=False)
    try:
        lim = governor.gate.store.limiter("queue", governor.settings.queues[q])
        governor.gate.store.client.delete(*lim.cap_keys(q))
        assert not permit.renew() and permit.lost
    finally:
        slot_lost.disconnect(receiver)
    assert sent == []


def test_a_slot_no_task_takes_is_given_back_by_the_carrier(redis_server: ServerHandle) -> None:
    task, governor, q = capped(redis_server, {"concurrency": 10})
    run(governor.gate, task, q)
    held = wait_for(lambda: holders(governor, q), lambda h: not h, timeout=10, every=0.01)
    assert held == []


def test_a_tight_cap_gives_the_slot_back_at_once(redis_server: ServerHandle) -> None:
    task, governor, q = capped(redis_server, {"concurrency": 2})  # 1 left free: not roomy
    governor.gate.carried.linger = 60.0
    run(governor.gate, task, q)
    assert holders(governor, q) == []


def test_a_waiter_gets_the_carried_slot_before_the_next_task(
    roomy: tuple[Any, Governor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    task, governor, q = roomy
    gate = governor.gate
    first = run(gate, task, q)  # admitted with 9 free: its slot lingers
    lim = gate.store.limiter("queue", governor.settings.queues[q])
    for n in range(9):  # other workers fill the cap, and one more waits in its line
        assert lim.acquire(q, holder=f"other{n}:0", info="elsewhere").allowed
    assert lim.wait(q, "waiter:0", "its message").status == "queued"
    published: list[Any] = []
    monkeypatch.setattr(gate.decider, "publish", published.extend)
    spec = gate.calls.route(task, {"routing_key": q}).specs[0]
    who = Who("next:0", "tok", "test@host 1")
    outcome = gate.decider.decide([spec], 1, WaitState(), lease=True, who=who)
    # the lingering slot went back first, to the oldest waiter; the next task finds it full
    assert not outcome.allowed and outcome.decision is not None
    assert outcome.decision.capped == "full"
    assert [(h, m) for h, m, _ in published] == [("waiter:0", "its message")]
    assert f"{first.id}:0" not in holders(governor, q)
    assert "waiter:0" in holders(governor, q)


def test_a_fair_quota_with_a_capped_key_costs_one_script_a_task(
    redis_server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = f"q-{uuid.uuid4().hex[:8]}"
    quota = {"rules": "1000000/s", "algorithm": "gcra", "fair_by": "customer"}
    app = new_app(redis_server.url(), q, governor_queues={q: quota})
    governor = Governor(app)

    @governor.task(
        "1000000/s",
        key=lambda customer, **_: customer,
        algorithm="gcra",
        concurrency=1000,
        shared=False,
    )
    def job(customer: str) -> None: ...

    app.finalize()
    task, gate = app.tasks[job.name], governor.gate
    gate.carried.linger = 60.0
    for _ in range(3):  # the first calls learn the room (and take the first leases)
        run(gate, task, q, customer="c0")
    decisions, bookings = Counted(monkeypatch, "acquire"), Counted(monkeypatch, "reserve")
    releases = Counted(monkeypatch, "release")
    for _ in range(20):
        run(gate, task, q, customer="c0")
    # the fair quota from leases, the capped key asked once a task (its previous slot given
    # back in that call): about one script a task
    assert bookings.count == 0 and releases.count == 0
    assert 20 <= decisions.count <= 21
    gate.holding.release_all()
    gate.leases.release()
