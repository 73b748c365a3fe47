"""The gate with a real Celery worker (threads pool, in process) and the suite's Redis broker."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from celery import Task

from governor import ConfigError, Limiter
from governor.celery import GovernedTask, Governor, GovernorTimeout, signals
from support.celery_helpers import Recorder, config_error, most_in_window, new_app, wait_for, worker
from support.servers import ServerHandle


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.mark.compat
def test_queue_quota_holds_for_a_plain_task(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "5/s"})
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(bind=True, shared=False)  # a plain task: no GovernedTask base
    def plain(self: Task, i: int) -> None:
        rec.add(i=i, waits=((self.request.headers or {}).get("governor") or {}).get("waits", 0))

    again: Counter[int] = Counter()  # task -> times it came with a booking and booked again

    def rebooked(request: Any = None, **_: Any) -> None:
        carried = (getattr(request, "headers", None) or {}).get("governor") or {}
        if carried.get("slots"):
            again[request.args[0]] += 1

    signals.task_deferred.connect(rebooked, weak=False)
    try:
        with worker(app, [q]):
            for i in range(15):
                plain.delay(i)
            seen = rec.wait(15, timeout=20)
    finally:
        signals.task_deferred.disconnect(rebooked)
    assert sorted(r["i"] for r in seen) == list(range(15))
    starts = [r["t"] for r in seen]
    assert most_in_window(starts, 1.0) <= 5 + 1  # 5 per second, one more on a window edge
    assert max(starts) - min(starts) >= 1.9  # three batches of five: it did wait
    # Each waiting task was deferred once: it booked its slot and ran on it. A worker that
    # starts one later than governor_late_tolerance (25 ms: a loaded CI machine does) books it
    # once more, and only then; never a loop.
    assert all(r["waits"] <= 1 + again[r["i"]] for r in seen)
    assert sum(r["waits"] for r in seen) <= 10 + sum(again.values())


def test_routing_decides_the_queue(redis_server: ServerHandle) -> None:
    q, free = queue_name(), queue_name()
    app = new_app(redis_server.url(), free, governor_queues={q: "1/m"})
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(where: str) -> None:
        rec.add(where=where)

    with worker(app, [q, free]):
        for _ in range(3):
            job.apply_async(("free",), queue=free)
        job.apply_async(("governed",), queue=q)
        job.apply_async(("governed",), queue=q)
        seen = rec.wait(4, timeout=10)
        time.sleep(0.5)
        seen = rec.all()
    assert sorted(r["where"] for r in seen) == ["free", "free", "free", "governed"]


def test_task_rules_and_per_key_limits(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    app.conf.governor_tasks = {"sync_account": "1/m"}
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(name="sync_account", shared=False)
    def sync_account(n: int) -> None:
        rec.add(task="sync", n=n)

    @governor.task(
        "2/m", key=lambda customer_id, **_: customer_id, limit_name="partner-api", shared=False
    )
    def call_partner(customer_id: str, payload: int) -> None:
        rec.add(task="partner", customer=customer_id, payload=payload)

    with worker(app, [q]):
        for n in range(3):
            sync_account.delay(n)
        for customer in ("acme", "globex"):
            for payload in range(3):
                call_partner.delay(customer, payload)
        rec.wait(5, timeout=10)
        time.sleep(1.0)
        seen = rec.all()
    assert sum(1 for r in seen if r["task"] == "sync") == 1
    per_customer = {c: sum(1 for r in seen if r.get("customer") == c) for c in ("acme", "globex")}
    assert per_customer == {"acme": 2, "globex": 2}
    lim = Limiter(governor.gate.client, "2/m", name="partner-api", prefix=app.conf.governor_prefix)
    usage = lim.usage("acme")
    assert (usage.rules[0].used, usage.booked) == (2, 1)  # two ran, one holds a booking


def test_a_denial_burns_nothing_in_the_other_limits(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "100/m"})
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @governor.task("1/h", key=lambda customer, **_: customer, shared=False)
    def job(customer: str) -> None:
        rec.add(customer=customer)

    with worker(app, [q]):
        for _ in range(5):
            job.delay("acme")  # one runs, four book slots an hour away
        rec.wait(1, timeout=10)
        time.sleep(1.0)
    queue_limiter = Limiter(
        governor.gate.client, "100/m", name="queue", prefix=app.conf.governor_prefix
    )
    used = queue_limiter.usage(q).rules[0].used
    # the queue quota counts the one that ran and the four bookings an hour ahead are not in
    # its minute: nothing was burnt by the denials
    assert used == 1, used


@pytest.mark.compat
def test_message_is_kept_and_retries_are_not_eaten(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "1/s"})
    Governor(app)
    rec = Recorder(redis_server.url())
    linked = Recorder(redis_server.url())

    @app.task(shared=False)
    def after(result: object, tag: str) -> None:
        linked.add(result=result, tag=tag)

    @app.task(bind=True, max_retries=1, shared=False)
    def job(self: Task, n: int, *, word: str) -> int:
        gov = (self.request.headers or {}).get("governor") or {}
        rec.add(
            id=self.request.id,
            n=n,
            word=word,
            retries=self.request.retries,
            custom=(self.request.headers or {}).get("x-custom"),
            priority=self.request.delivery_info.get("priority"),
            waits=gov.get("waits", 0),
            since=gov.get("since"),
        )
        if n == 2 and self.request.retries == 0:
            raise self.retry(countdown=0.1)  # its own retry still works after governance waits
        return n * 10

    with worker(app, [q], concurrency=2):
        results = [
            job.apply_async(
                (n,),
                {"word": f"w{n}"},
                headers={"x-custom": f"c{n}"},
                priority=3,
                link=after.s(f"tag{n}"),
            )
            for n in range(3)
        ]
        seen = rec.wait(4, timeout=15)
        linked.wait(3, timeout=10)
    by_n = {}
    for r in seen:
        by_n.setdefault(r["n"], []).append(r)
    for n, result in enumerate(results):
        first = by_n[n][0]
        assert first["id"] == result.id and first["word"] == f"w{n}"
        assert first["custom"] == f"c{n}" and first["priority"] == 3
        assert first["retries"] == 0
    assert by_n[2][0]["waits"] >= 1 and [r["retries"] for r in by_n[2]] == [0, 1]
    # the retry counts its own governance wait, not one from before the first run
    retried = by_n[2][1]
    assert retried["since"] is None or retried["since"] >= by_n[2][0]["t"] - 0.05
    assert sorted(r["tag"] for r in linked.all()) == ["tag0", "tag1", "tag2"]
    assert sorted(r["result"] for r in linked.all()) == [0, 10, 20]


def test_max_wait_gives_up_with_governor_timeout(
    redis_server: ServerHandle, failures: list[BaseException]
) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "1/m"})
    governor = Governor(app)

    @governor.task(max_wait=5, shared=False)
    def job() -> None:
        pass

    with worker(app, [q]):
        job.delay()
        job.delay()  # would wait about a minute
        wait_for(lambda: failures, bool, timeout=10, every=0.05)
    assert len(failures) == 1 and isinstance(failures[0], GovernorTimeout)
    assert "governor_max_wait=5" in str(failures[0])


def test_cost_above_the_limit_fails_clearly(
    redis_server: ServerHandle, failures: list[BaseException]
) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "3/s"})
    governor = Governor(app)

    @governor.task(cost=5, shared=False)
    def heavy() -> None:
        pass

    with worker(app, [q]):
        heavy.delay()
        wait_for(lambda: failures, bool, timeout=10, every=0.05)
    assert failures and "can never run" in str(failures[0]) and "3/s" in str(failures[0])


@pytest.mark.compat
@pytest.mark.parametrize(
    ("conf", "mentions"),
    [
        ({"governor_queues": {"emails": "10/x"}}, "governor_queues['emails']"),
        ({"governor_tasks": {"proj.sync": "abc"}}, "governor_tasks['proj.sync']"),
        ({"governor_queues": {"emails": {"rules": "1/s", "algorithm": "magic"}}}, "magic"),
        ({"governor_fail_mode": "maybe"}, "governor_fail_mode"),
        ({"governor_redis_url": "http://x"}, "governor_redis_url"),
        ({"governor_max_wait": "soon"}, "governor_max_wait"),
        ({"governor_queues": ["emails"]}, "governor_queues"),
        ({"governor_park_after": 0.5}, "governor_release_interval"),
    ],
)
def test_bad_settings_fail_when_the_app_finalizes(
    redis_server: ServerHandle, conf: dict[str, object], mentions: str
) -> None:
    assert mentions in config_error(redis_server.url(), **conf)


@pytest.mark.compat
def test_bad_task_options_fail_when_the_app_finalizes(redis_server: ServerHandle) -> None:
    app = new_app(redis_server.url(), "q")
    governor = Governor(app)

    @governor.task("5/parsec", shared=False)
    def job() -> None:
        pass

    with pytest.raises(ConfigError, match=r"task '.*job'.*parsec"):
        app.finalize()

    app2 = new_app(redis_server.url(), "q")
    Governor(app2)

    @app2.task(base=GovernedTask, governor_key="customer", shared=False)
    def job2() -> None:
        pass

    with pytest.raises(ConfigError, match="governor_key must be callable"):
        app2.finalize()


def test_no_redis_to_be_found(redis_server: ServerHandle) -> None:
    app = new_app(redis_server.url(), "q", governor_queues={"q": "1/s"})
    app.conf.governor_redis_url = None
    app.conf.broker_url = "amqp://guest@localhost//"
    Governor(app)
    with pytest.raises(ConfigError, match="governor_redis_url"):
        app.finalize()


@pytest.mark.compat
def test_denied_tasks_do_not_hold_the_worker(redis_server: ServerHandle) -> None:
    governed, other = queue_name(), queue_name()
    app = new_app(
        redis_server.url(),
        governed,
        governor_queues={governed: "1/m"},
        worker_prefetch_multiplier=1,
    )
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(kind: str, n: int) -> None:
        rec.add(kind=kind, n=n)

    with worker(app, [governed, other], concurrency=1):
        for n in range(30):
            job.apply_async(("governed", n), queue=governed)
        for n in range(10):
            job.apply_async(("other", n), queue=other)
        seen = rec.wait(11, timeout=15)
    assert sum(1 for r in seen if r["kind"] == "other") == 10
    assert sum(1 for r in seen if r["kind"] == "governed") == 1


@pytest.mark.compat
@pytest.mark.parametrize("fail_mode", ["closed", "open"])
def test_redis_outage(redis_server: ServerHandle, fail_mode: str) -> None:
    """governor's own redis-server is stopped: "closed" holds the task back (re-published after
    a backoff) until Redis is back; "open" runs it at once with a warning."""
    from governor.embedded import EmbeddedRedis

    store = EmbeddedRedis().start()
    try:
        q = queue_name()
        app = new_app(
            redis_server.url(),
            q,
            governor_queues={q: "100/s"},
            governor_redis_url=store.url(),
            governor_fail_mode=fail_mode,
            governor_outage_retry=0.5,
            governor_socket_timeout=0.5,
        )
        Governor(app)
        rec = Recorder(redis_server.url())

        @app.task(shared=False)
        def job(n: int) -> None:
            rec.add(n=n)

        with worker(app, [q]):
            job.delay(0)
            assert len(rec.wait(1, timeout=10)) == 1  # Redis up: runs
            store.stop()
            down = time.time()
            job.delay(1)
            # a released parked task arriving during the outage: its copy check needs Redis too
            job.apply_async((2,), headers={"governor": {"parked": "p:1:ab", "release": "x"}})
            if fail_mode == "open":
                seen = rec.wait(3, timeout=10)
                assert sorted(r["n"] for r in seen) == [0, 1, 2]
                return
            time.sleep(2.0)  # bounded: long enough for several outage retries
            assert [r["n"] for r in rec.all()] == [0]  # never ran ungoverned
            store.start()
            seen = rec.wait(3, timeout=20)
        assert sorted(r["n"] for r in seen) == [0, 1, 2]
        assert min(r["t"] for r in seen[1:]) > down + 2.0
    finally:
        store.close()


def test_submit_batch_books_every_call_before_sending(redis_server: ServerHandle) -> None:
    from governor.celery import submit_batch

    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "4/s"}, governor_park_after=1.5)
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @governor.task("3/2s", key=lambda customer, **_: customer, shared=False, bind=True)
    def call(self: Task, customer: str, n: int) -> None:
        gov = (self.request.headers or {}).get("governor") or {}
        rec.add(customer=customer, n=n, waits=gov.get("waits", 0))

    dues: list[float | None] = []
    with worker(app, [q]):
        started = time.time()
        results = submit_batch(
            (call.s(c, n) for n in range(6) for c in ("acme", "globex")),
            start_in=0.5,
            progress=lambda done, due: dues.append(due),
        )
        seen = rec.wait(12, timeout=20)
    assert len(results) == 12 and len(dues) == 12 and all(d is not None for d in dues)
    assert sorted((r["customer"], r["n"]) for r in seen) == sorted(
        (c, n) for n in range(6) for c in ("acme", "globex")
    )
    # never denied: each arrived for its booking (one that a loaded worker started later than
    # governor_late_tolerance re-books, once)
    assert sum(r["waits"] for r in seen) <= 2
    starts = [r["t"] for r in seen]
    assert most_in_window(starts, 1.0) <= 4
    for customer in ("acme", "globex"):
        assert most_in_window([r["t"] for r in seen if r["customer"] == customer], 2.0) <= 3
    assert min(starts) >= started + 0.5 - 0.05
    assert max(dues) - started > 1.5  # the last ones were parked and released


@pytest.mark.compat
def test_a_governed_task_without_governor_app(redis_server: ServerHandle) -> None:
    """``base=GovernedTask`` alone is enough: the worker installs governor (gate, held
    acknowledgements, the releaser of parked tasks) when it starts."""
    from governor.celery.bootstep import ReleaserStep
    from governor.celery.request import GovernedRequestMixin

    q = queue_name()
    app = new_app(redis_server.url(), q, governor_park_after=1.5)
    rec = Recorder(redis_server.url())

    @app.task(base=GovernedTask, governor_limit="1/2s", shared=False, bind=True)
    def job(self: Task, n: int) -> None:
        gov = (self.request.headers or {}).get("governor") or {}
        rec.add(n=n, waits=gov.get("waits", 0))

    assert Governor.find(app) is None
    with worker(app, [q]):
        assert Governor.find(app) is not None
        assert issubclass(app.tasks[job.name].Request, GovernedRequestMixin)
        assert ReleaserStep in app.steps["worker"]
        for n in range(3):
            job.delay(n)
        seen = rec.wait(3, timeout=20)
    assert sorted(r["n"] for r in seen) == [0, 1, 2]
    starts = sorted(r["t"] for r in seen)
    assert starts[2] - starts[0] >= 4.0 - 0.1  # 1 per 2 s: the third was parked, then released


def test_a_released_copy_runs_once_and_its_redelivery_runs(redis_server: ServerHandle) -> None:
    """Copies of one parked task (a releaser died after publishing, another released it again)
    carry different release tokens: the first to arrive runs, the other is dropped. The same
    copy delivered again (requeued, or its worker died) carries the same token: it runs."""
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "100/s"})
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(n: int) -> None:
        rec.add(n=n)

    parked = f"{uuid.uuid4().hex}:1:ab"
    with worker(app, [q]):
        job.apply_async((0,), headers={"governor": {"parked": parked, "release": "a"}})
        assert len(rec.wait(1, timeout=10)) == 1
        job.apply_async((1,), headers={"governor": {"parked": parked, "release": "b"}})
        job.apply_async((2,), headers={"governor": {"parked": parked, "release": "a"}})
        rec.wait(2, timeout=10)
        time.sleep(0.5)
    assert sorted(r["n"] for r in rec.all()) == [0, 2]


@pytest.mark.compat
def test_a_revoked_task_is_not_deferred(redis_server: ServerHandle) -> None:
    """A task revoked while its ETA was pending, that a limit would defer when it comes due,
    is discarded as Celery discards it, not re-published to wait."""
    from celery.signals import task_revoked
    from celery.worker.state import revoked

    from governor.celery import signals

    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "1/m"})
    Governor(app)
    rec = Recorder(redis_server.url())
    deferred: list[str] = []
    discarded: list[str] = []

    def on_deferred(request: object = None, **_: object) -> None:
        deferred.append(str(getattr(request, "id", "")))

    def on_revoked(request: object = None, **_: object) -> None:
        discarded.append(str(getattr(request, "id", "")))

    @app.task(shared=False)
    def job(n: int) -> None:
        rec.add(n=n)

    signals.task_deferred.connect(on_deferred, weak=False)
    task_revoked.connect(on_revoked, weak=False)
    try:
        with worker(app, [q]):
            job.delay(0)
            assert len(rec.wait(1, timeout=10)) == 1
            doomed = str(uuid.uuid4())
            job.apply_async((1,), task_id=doomed, countdown=1.5)  # held by the worker's timer
            time.sleep(0.7)
            revoked.add(doomed)  # what a revoke broadcast does in every worker, meanwhile
            wait_for(lambda: doomed in discarded, bool, timeout=10, every=0.05)
    finally:
        signals.task_deferred.disconnect(on_deferred)
        task_revoked.disconnect(on_revoked)
        revoked.discard(doomed)
    assert doomed in discarded and doomed not in deferred
    assert [r["n"] for r in rec.all()] == [0]


def test_a_task_that_cannot_be_republished_fails_visibly(
    redis_server: ServerHandle, failures: list[BaseException]
) -> None:
    """A deferral whose re-publish fails for good (here: its serializer refuses) fails the task
    with GovernorError, rather than requeueing it forever; a broker outage requeues it."""
    from kombu.serialization import register

    from governor import GovernorError

    refuse = {"now": False}

    def encode(body: object) -> str:
        if refuse["now"]:
            raise ValueError("this serializer refuses now")
        return json.dumps(body)

    register("gt-flaky", encode, json.loads, "application/x-gt-flaky", "utf-8")
    q = queue_name()
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: "1/m"},
        accept_content=["json", "application/x-gt-flaky"],
    )
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False, serializer="gt-flaky")
    def job(n: int) -> None:
        rec.add(n=n)

    with worker(app, [q]):
        job.delay(0)
        job.delay(1)
        refuse["now"] = True  # both are out; the re-publish of the deferred one will fail
        wait_for(lambda: failures, bool, timeout=10, every=0.05)
        time.sleep(0.5)
    assert len(failures) == 1 and isinstance(failures[0], GovernorError), failures
    assert "re-publishing it failed" in str(failures[0])
    assert [r["n"] for r in rec.all()] == [0]


def test_submit_batch_with_no_lead_time_spends_each_admission_once(
    redis_server: ServerHandle,
) -> None:
    from governor.celery import submit_batch

    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "5/s"})
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(n: int) -> None:
        rec.add(n=n)

    lim = Limiter(governor.gate.client, "5/s", name="queue", prefix=governor.settings.prefix)
    with worker(app, [q]):
        submit_batch((job.s(n) for n in range(3)), start_in=0)
        assert len(rec.wait(3, timeout=10)) == 3
        used = lim.usage(q).rules[0].used  # within the second (the window holds every start)
    assert used == 3  # not 6: nothing was taken at submit and again on arrival
    assert max(r["t"] for r in rec.all()) - min(r["t"] for r in rec.all()) < 1.0


@pytest.mark.compat
def test_early_deferral_pauses_while_redis_is_down(redis_server: ServerHandle) -> None:
    """The worker's main process peeks Redis before handing a message to the pool; when Redis
    is down it stops peeking for a while (the pool decides, with the fail_mode), rather than
    stalling the consumer on a socket timeout per message."""
    from types import SimpleNamespace

    from governor.celery.admission import early as early_module
    from governor.embedded import EmbeddedRedis

    store = EmbeddedRedis().start()
    try:
        q = queue_name()
        app = new_app(
            redis_server.url(),
            q,
            governor_queues={q: "1/s"},
            governor_redis_url=store.url(),
            governor_socket_timeout=0.5,
        )
        governor = Governor(app)

        @app.task(shared=False)
        def job() -> None: ...

        request = SimpleNamespace(
            id="r1",
            task=job,
            revoked=lambda: False,
            _request_dict={},
            delivery_info={"routing_key": q},
        )
        gate = governor.gate
        assert gate.defer_early(request) is False  # Redis up, room: the pool admits
        store.close()
        started = time.monotonic()
        assert gate.defer_early(request) is False  # Redis down: left to the pool
        assert gate.defer_early(request) is False  # and not asked again for a while
        assert time.monotonic() - started < 1.5
        assert gate.early.paused_until - time.monotonic() > early_module.EARLY_PAUSE - 2
    finally:
        store.close()  # idempotent: also when the test closed it
