"""The short ways of the per-task path (bench.gate_path and bench.celery_overhead measure
them), in process against the suite's Redis: each comes to what the long way would, gives way
to it whenever a call is not the usual one, and follows a change of the live limits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals as celery_signals
from celery.app.task import Context

from governor import Limiter
from governor.celery import Governor
from governor.celery.admission.gate import Gate
from governor.celery.config.factors import adaptive_key
from governor.celery.config.live import LiveLimits
from governor.celery.decisions.leases import AdmissionLeases
from governor.celery.types import LimitConfig, LimitSpec
from governor.errors import ConfigError
from governor.rules import parse_rules
from support.celery_helpers import new_app, wait_for
from support.gate_helpers import LongWay, admit, request
from support.servers import ServerHandle


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def quota(redis_server: ServerHandle) -> Iterator[tuple[Any, Governor, str]]:
    """An app whose queue has a quota that never binds (gcra: its calls lease), its task."""
    q = queue_name()
    quota = {"rules": "1000/h", "algorithm": "gcra"}  # (slow enough to see what it counted)
    app = new_app(redis_server.url(), q, governor_queues={q: quota})
    governor = Governor(app)

    @app.task(shared=False)
    def job(**_: Any) -> None: ...

    app.finalize()
    governor.install(app.tasks[job.name])
    yield app.tasks[job.name], governor, q
    governor.gate.leases.release()


def test_the_usual_call_is_admitted_from_a_lease_the_short_way(
    quota: tuple[Any, Governor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    task, governor, q = quota
    gate = governor.gate
    long_way = LongWay(gate, monkeypatch)
    for _ in range(30):
        assert admit(gate, task, request(q)) is None
    assert gate.admitted == 30
    # the long way only for the first call, which tells how much room there is; then leases
    # of 2, 4, 8, 16 tasks' worth are taken the short way
    assert long_way.count == 1
    lim = gate.store.limiter("queue", governor.settings.queues[q])
    assert lim.usage(q).rules[0].used >= 30  # every admission counted (leases count ahead)


def test_an_unusual_call_takes_the_long_way(
    quota: tuple[Any, Governor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    task, governor, q = quota
    gate = governor.gate
    for _ in range(2):  # a lease of 2 more tasks' worth in this process (see .leases)
        admit(gate, task, request(q))
    long_way = LongWay(gate, monkeypatch)
    assert admit(gate, task, request(q)) is None and long_way.count == 0
    carried = {"governor": {"waits": 1, "since": time.time() - 1}}
    assert admit(gate, task, request(q, headers=carried)) is None  # waited before
    assert admit(gate, task, request(q, redelivered=True)) is None  # delivered again
    assert long_way.count == 2
    # a route whose limits are capped or shadowed has no short way
    for extra in ({"concurrency": 5}, {"shadow": True}):
        other = queue_name()
        config = {"rules": "1000/s", "algorithm": "gcra", **extra}
        app = new_app(governor.settings.redis_url or "", other, governor_queues={other: config})
        g = Governor(app)
        route = g.gate.calls.route(task, {"routing_key": other})
        assert lane_of(g.gate, task, route) is None, extra


def lane_of(gate: Gate, task: Any, route: Any) -> Any:
    return gate._lane(route, task, gate.calls.options(task))


def test_a_fair_call_leases_until_its_queue_is_seen_in_use(
    redis_server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = queue_name()
    config = {"rules": "1000/h", "algorithm": "gcra", "fair_by": "customer"}
    app = new_app(redis_server.url(), q, governor_queues={q: config})
    governor = Governor(app)

    @app.task(shared=False)
    def job(customer: str) -> None: ...

    app.finalize()
    task, gate = app.tasks[job.name], governor.gate
    lane = lane_of(gate, task, gate.calls.route(task, {"routing_key": q}))
    assert lane is not None and lane.fair == (("queue", q),)
    long_way = LongWay(gate, monkeypatch)
    for n in range(12):
        assert admit(gate, task, request(q), customer=f"c{n % 3}") is None
    # the first call asks Redis (and learns the room), the others lease: the tenant does not
    # matter to a lease (the rules are the limit's, shared by its tenants)
    assert long_way.count == 1 and gate.admitted == 12
    lim = gate.store.limiter("queue", governor.settings.queues[q])
    assert lim.usage(q).rules[0].used >= 12
    # once this process saw the queue in use, a new call waits in it behind those queued
    gate.fair._in_use(gate.calls.route(task, {"routing_key": q}).specs[0])
    deferred = admit(gate, task, request(q), customer="c0")
    assert deferred is not None and "fair queue" in str(deferred) and long_way.count == 2
    gate.leases.release()


@pytest.fixture
def keyed(redis_server: ServerHandle) -> Iterator[tuple[Any, Governor, str]]:
    """An app with a per-key task (1000/h, gcra, by customer), its task and queue."""
    q = queue_name()
    app = new_app(redis_server.url(), q)
    governor = Governor(app)

    @governor.task("1000/h", key=lambda customer, **_: customer, algorithm="gcra", shared=False)
    def job(customer: str) -> None: ...

    app.finalize()
    yield app.tasks[job.name], governor, q
    governor.gate.leases.release()


def test_a_per_key_task_leases_per_subject_the_short_way(
    keyed: tuple[Any, Governor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    task, governor, q = keyed
    gate = governor.gate
    long_way = LongWay(gate, monkeypatch)
    for n in range(12):
        assert admit(gate, task, request(q), customer=f"c{n % 2}") is None
    # one call per subject asks Redis (learning its room), then each subject leases
    assert long_way.count == 2 and gate.admitted == 12
    lim = gate.store.limiter(task.name, gate.calls.options(task).key_config)  # type: ignore[arg-type]
    assert lim.usage("c0").rules[0].used >= 6 and lim.usage("c1").rules[0].used >= 6
    # a key function that fails takes the long way, which names the task
    with pytest.raises(ConfigError, match=task.name):
        admit(gate, task, request(q), customer="")
    assert long_way.count == 3


def test_a_live_change_of_a_per_key_limit_reaches_its_lane(
    keyed: tuple[Any, Governor, str],
) -> None:
    task, governor, q = keyed
    gate = governor.gate
    info = {"routing_key": q}
    lane = lane_of(gate, task, gate.calls.route(task, info))
    assert lane is not None and lane.with_key("c0")[-1][1].config.rules == parse_rules("1000/h")
    LiveLimits(gate.client, governor.settings.prefix).set(task.name, {"rules": "5/s"}, "test")
    gate.live.changed()
    lane = lane_of(gate, task, gate.calls.route(task, info))
    assert lane is not None and lane.with_key("c0")[-1][1].config.rules == parse_rules("5/s")
    assert lane.with_key("c0")[-1][0].rules == parse_rules("5/s")  # its limiter too


def test_a_per_key_task_with_a_cap_or_a_fair_key_takes_the_long_way(
    redis_server: ServerHandle,
) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    governor = Governor(app)
    key = lambda customer, **_: customer  # noqa: E731

    @governor.task("1000/s", key=key, algorithm="gcra", concurrency=3, shared=False)
    def capped(customer: str) -> None: ...

    @governor.task("1000/s", key=key, algorithm="gcra", governor_fair_by="customer", shared=False)
    def fair(customer: str) -> None: ...

    app.finalize()
    for job in (capped, fair):
        task = app.tasks[job.name]
        route = governor.gate.calls.route(task, {"routing_key": q})
        assert lane_of(governor.gate, task, route) is None, job.name


def test_a_live_change_reaches_the_kept_route(quota: tuple[Any, Governor, str]) -> None:
    task, governor, q = quota
    gate = governor.gate
    info = {"routing_key": q}
    first = gate.calls.route(task, info)
    assert gate.calls.route(task, info) is first  # kept while the live limits stay
    lane = lane_of(gate, task, first)
    assert lane is not None and lane.limiters[0][0].rules == parse_rules("1000/h")
    LiveLimits(gate.client, governor.settings.prefix).set(f"queue:{q}", {"rules": "5/s"}, "test")
    gate.live.changed()  # (a worker looks again within REFRESH seconds)
    changed = gate.calls.route(task, info)
    assert changed is not first and changed.specs[0].config.rules == parse_rules("5/s")
    assert gate.calls.fixed_specs(task, info)[0].config.rules == parse_rules("5/s")
    lane = lane_of(gate, task, changed)
    assert lane is not None and lane.limiters[0][0].rules == parse_rules("5/s")


def test_an_adaptive_limit_under_a_factor_is_worked_out_every_call(
    redis_server: ServerHandle,
) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: {"rules": "100/s", "adaptive": True}})
    governor = Governor(app)

    @app.task(shared=False)
    def job() -> None: ...

    gate, info = governor.gate, {"routing_key": q}
    task = app.tasks[job.name]
    assert gate.calls.route(task, info) is gate.calls.route(task, info)  # no factor: kept
    prefix = governor.settings.prefix
    gate.client.hset(adaptive_key(prefix), f"queue:{q}", f"0.5:{int(time.time() * 1e6)}")
    gate.client.incr(f"{prefix}:{{live}}:version")
    gate.live.changed()
    first = gate.calls.route(task, info)
    assert first.specs[0].config.rules[0].limit < 100  # scaled down
    assert gate.calls.route(task, info) is not first  # climbs back with time: not kept


def test_task_postrun_is_received_once_a_slot_is_held(redis_server: ServerHandle) -> None:
    q = queue_name()
    config = {"rules": "1000/s", "algorithm": "gcra", "concurrency": 3}
    app = new_app(redis_server.url(), q, governor_queues={q: config})
    governor = Governor(app)

    @app.task(shared=False)
    def job() -> None: ...

    task, gate = app.tasks[job.name], governor.gate
    holding = gate.holding
    mine = [r for _, r in celery_signals.task_postrun.receivers if r == holding._task_done]
    assert not holding._listening and not mine  # nothing held yet: Celery need not send it
    req = request(q)
    assert admit(gate, task, req) is None
    assert holding._listening  # a slot is held: its release comes with task_postrun
    lim = gate.store.limiter("queue", governor.settings.queues[q])
    assert len(lim.holders(q).holders) == 1
    celery_signals.task_postrun.send(sender=task, task_id=req.id, task=task)
    # (a roomy cap's slot lingers a moment for this process's next task: tests/celery/
    # test_carried.py; with none, the carrier gives it back)
    held = wait_for(lambda: lim.holders(q).holders, lambda h: not h, timeout=10, every=0.01)
    assert held == ()


def test_early_hints_are_taken_again_for_another_config(
    quota: tuple[Any, Governor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, governor, q = quota
    early = governor.gate.early
    peeks: list[str] = []
    peek = Limiter.peek

    def counting(self: Limiter, *args: Any, **kwargs: Any) -> Any:
        peeks.append(self.name)
        return peek(self, *args, **kwargs)

    monkeypatch.setattr(Limiter, "peek", counting)
    spec = LimitSpec("queue", q, governor.settings.queues[q], q)
    assert not early.known_denied([spec], 1, lambda: "h:0")
    assert not early.known_denied([spec], 1, lambda: "h:0")
    assert len(peeks) == 1  # the hint holds
    full = LimitSpec("queue", q, LimitConfig(parse_rules("1/h"), "gcra"), q)
    full_lim = governor.gate.store.limiter(q, full.config)
    assert full_lim.acquire(q).allowed
    assert early.known_denied([full], 1, lambda: "h:0")  # another config: peeked again
    assert len(peeks) == 2


def test_a_route_seen_with_room_passes_the_main_process_at_once(
    quota: tuple[Any, Governor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Early deferral of the usual message: once every limit of its route was seen with room,
    the route passes without looking at hints until the oldest peek stops being trusted
    (HINT_TTL); then it looks (and peeks) again."""
    from types import SimpleNamespace

    from governor.celery.admission import early as early_module

    task, governor, q = quota
    early = governor.gate.early
    looked = SimpleNamespace(count=0)
    room_until = early._room_until

    def counting(*args: Any) -> float:
        looked.count += 1
        return room_until(*args)

    monkeypatch.setattr(early, "_room_until", counting)
    clock = [1000.0]
    monkeypatch.setattr(early_module.time, "monotonic", lambda: clock[0])
    route = governor.gate.calls.route(task, {"routing_key": q})

    def message(n: int) -> Any:
        return SimpleNamespace(
            id=f"m{n}", task=task, _request_dict={}, delivery_info={"routing_key": q}
        )

    for n in range(10):
        assert early.defer(message(n), route) is False
    assert looked.count == 1 and route.clear_until == clock[0] + early_module.HINT_TTL
    clock[0] += 1.5 * early_module.HINT_TTL
    assert early.defer(message(10), route) is False
    assert looked.count == 2
    # what it knows lives on the Route, which a live change replaces (Calls.route)
    assert governor.gate.calls.route(task, {"routing_key": q}) is route


def test_the_sweeper_gives_back_what_an_idle_lease_did_not_use(
    redis_server: ServerHandle,
) -> None:
    import redis

    r = redis.Redis.from_url(redis_server.url())
    name = f"sweep-{uuid.uuid4().hex[:8]}"
    lim = Limiter(r, "1000/h", name=name)
    spec = LimitSpec("queue", name, LimitConfig(parse_rules("1000/h"), "sliding_log"), "q")
    leases = AdmissionLeases(0.05)  # the real clock: the sweeper thread runs on its own
    try:
        assert lim.acquire("q").allowed
        leases.observe([(lim, spec, lim.peek("q"))])
        assert leases.grant([(lim, spec)], 1) is not None
        assert lim.usage("q").rules[0].used == 1 + 1 + 2  # the task's unit and 2 leased
        used = wait_for(lambda: lim.usage("q").rules[0].used, lambda u: u == 2, timeout=10)
        assert used == 2  # the lease ran out unused: its 2 units came back
    finally:
        leases.release()


class Channel:
    no_ack_consumers = None

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.acked: list[Any] = []

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        if self.fail:
            raise ConnectionError("the broker went away")
        self.acked.append(delivery_tag)


@pytest.mark.parametrize("fail", [False, True])
def test_a_watched_ack_marks_a_failure_and_leaves_no_cycle(fail: bool) -> None:
    """wrap_ack's wrapper refers to the message and to its request: once the ack ran it is
    taken off the message, so neither waits for the garbage collector."""
    import gc

    from kombu import Message

    from governor.celery.patches import wrap_ack

    channel = Channel(fail)
    message = Message(body="{}", delivery_tag="t1", channel=channel)
    marked: list[str] = []
    wrap_ack(message, lambda: marked.append("unacked"))
    assert "ack" in vars(message)
    if fail:
        with pytest.raises(ConnectionError):
            message.ack()
    else:
        message.ack()
    assert marked == (["unacked"] if fail else []) and channel.acked == ([] if fail else ["t1"])
    assert "ack" not in vars(message)  # the class's own ack again
    gc.collect()
    gc.disable()
    try:
        for n in range(50):
            m = Message(body="{}", delivery_tag=n, channel=Channel(False))
            wrap_ack(m, lambda: None)
            m.ack()
            del m
        assert gc.collect() == 0  # nothing was left in a cycle
    finally:
        gc.enable()


def test_early_deferral_works_out_a_per_key_call_only_now_and_then(
    redis_server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A per-key task's calls need their message decoded and a peek per subject in the
    worker's main process: one call each HINT_TTL while none is seen denied, every call for
    DENYING seconds after one was."""
    from types import SimpleNamespace

    from governor.celery.admission import early as early_module

    q = queue_name()
    app = new_app(redis_server.url(), q)
    governor = Governor(app)

    @governor.task("1000/h", key=lambda customer, **_: customer, shared=False)
    def job(customer: str) -> None: ...

    app.finalize()
    task = app.tasks[job.name]
    gate = governor.gate
    worked_out = LongWay(gate, monkeypatch)  # counts Calls.call: a call worked out

    def message(n: int) -> Any:
        return SimpleNamespace(
            id=f"m{n}",
            task=task,
            revoked=lambda: False,
            _request_dict={},
            _context=Context({"id": f"m{n}", "headers": None}),
            delivery_info={"routing_key": q},
            args=[],
            kwargs={"customer": f"c{n % 3}"},
            hostname="test@host",
        )

    clock = [1000.0]
    monkeypatch.setattr(early_module.time, "monotonic", lambda: clock[0])
    for n in range(10):
        assert gate.defer_early(message(n)) is False  # room: the pool admits
    assert worked_out.count == 1  # the first, then none within HINT_TTL
    clock[0] += 1.5 * early_module.HINT_TTL
    assert gate.defer_early(message(10)) is False
    assert worked_out.count == 2
    gate.early.denying[task.name] = clock[0] + early_module.DENYING  # one was seen denied
    for n in range(5):
        gate.defer_early(message(11 + n))
    assert worked_out.count == 2 + 5


def test_redis_away_when_a_lease_runs_out_meets_the_fail_mode(
    redis_server: ServerHandle,
) -> None:
    """The short way asks Redis for a new lease when one runs out: Redis away there is what
    it is on the long way (governor_fail_mode; "open" runs the task ungoverned)."""
    from governor.celery import signals
    from governor.embedded import EmbeddedRedis

    store = EmbeddedRedis().start()
    try:
        q = queue_name()
        quota = {"rules": "1000/h", "algorithm": "gcra"}
        app = new_app(
            redis_server.url(),
            q,
            governor_queues={q: quota},
            governor_redis_url=store.url(),
            governor_socket_timeout=0.5,
            governor_fail_mode="open",
        )
        governor = Governor(app)

        @app.task(shared=False)
        def job() -> None: ...

        task, gate = app.tasks[job.name], governor.gate
        admit(gate, task, request(q))  # tells the room
        admit(gate, task, request(q))  # a lease of 2 more
        admit(gate, task, request(q))
        admit(gate, task, request(q))  # the lease is used up
        seen: list[str] = []

        def unavailable(sender: Any = None, fail_mode: str = "", **_: Any) -> None:
            seen.append(fail_mode)

        signals.storage_unavailable.connect(unavailable, weak=False)
        try:
            store.close()
            assert admit(gate, task, request(q)) is None  # open: it runs
            assert seen == ["open"]
        finally:
            signals.storage_unavailable.disconnect(unavailable)
    finally:
        store.close()
