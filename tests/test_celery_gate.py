"""The gate with a real Celery worker (threads pool, in process) and the suite's Redis broker."""

from __future__ import annotations

import time
import uuid

import pytest
from celery import Task

from celery_helpers import Recorder, most_in_window, new_app, worker
from conftest import ServerHandle
from governor import ConfigError, Limiter
from governor.celery import GovernedTask, Governor, GovernorTimeout


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


def test_queue_quota_holds_for_a_plain_task(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "5/s"})
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(bind=True, shared=False)  # a plain task: no GovernedTask base
    def plain(self: Task, i: int) -> None:
        rec.add(i=i, waits=((self.request.headers or {}).get("governor") or {}).get("waits", 0))

    with worker(app, [q]):
        for i in range(15):
            plain.delay(i)
        seen = rec.wait(15, timeout=20)
    assert sorted(r["i"] for r in seen) == list(range(15))
    starts = [r["t"] for r in seen]
    assert most_in_window(starts, 1.0) <= 5 + 1  # 5 per second, one more on a window edge
    assert max(starts) - min(starts) >= 1.9  # three batches of five: it did wait
    assert max(r["waits"] for r in seen) == 1  # each waiting task was deferred exactly once


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
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            time.sleep(0.05)
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
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            time.sleep(0.05)
    assert failures and "can never run" in str(failures[0]) and "3/s" in str(failures[0])


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
    ],
)
def test_bad_settings_fail_when_the_app_finalizes(
    redis_server: ServerHandle, conf: dict[str, object], mentions: str
) -> None:
    app = new_app(redis_server.url(), "q", **conf)
    Governor(app)
    with pytest.raises(ConfigError) as info:
        app.finalize()
    assert mentions in str(info.value)


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
            if fail_mode == "open":
                seen = rec.wait(2, timeout=10)
                assert [r["n"] for r in seen] == [0, 1]
                return
            time.sleep(2.0)  # bounded: long enough for several outage retries
            assert [r["n"] for r in rec.all()] == [0]  # never ran ungoverned
            store.start()
            seen = rec.wait(2, timeout=20)
        assert [r["n"] for r in seen] == [0, 1]
        assert seen[1]["t"] > down + 2.0
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
    assert all(r["waits"] == 0 for r in seen)  # never denied: each arrived for its booking
    starts = [r["t"] for r in seen]
    assert most_in_window(starts, 1.0) <= 4
    for customer in ("acme", "globex"):
        assert most_in_window([r["t"] for r in seen if r["customer"] == customer], 2.0) <= 3
    assert min(starts) >= started + 0.5 - 0.05
    assert max(dues) - started > 1.5  # the last ones were parked and released
