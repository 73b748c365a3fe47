"""Concurrency caps in Celery with a real worker (threads pool, in process) and the suite's Redis
broker: the most bodies running at once, waiting in line, hand-over, per-key caps, caps with
rules, slots given back whatever the end of the body."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from celery import Task
from celery.exceptions import Ignore, Reject

from governor import Limiter
from governor.celery import GovernedTask, Governor, current_permits
from governor.embedded import EmbeddedRedis
from support.celery_helpers import Recorder, most_at_once, new_app, wait_for, worker
from support.servers import ServerHandle


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


def test_a_task_cap_holds_across_pool_threads(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @governor.task(concurrency=2, shared=False, bind=True)
    def export(self: Task, n: int) -> None:
        start = time.time()
        permits = current_permits()
        time.sleep(0.2)
        rec.add(n=n, start=start, end=time.time(), fence=permits[0].fence if permits else 0)

    with worker(app, [q], concurrency=6):
        for n in range(10):
            export.delay(n)
        runs = rec.wait(10, timeout=30)
    assert sorted(r["n"] for r in runs) == list(range(10))
    assert most_at_once(runs) <= 2
    assert all(r["fence"] > 0 for r in runs)
    span = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    assert span < 0.2 * 5 * 2.5  # five rounds of two, with room for a slow machine
    lim = Limiter(
        governor.gate.client, None, concurrency=2, name="task", prefix=governor.settings.prefix
    )
    usage = lim.holders(export.name)
    assert usage.holders == () and usage.waiting == 0


def test_queue_rules_and_cap_together(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: {"rules": "5/s", "concurrency": 2}})
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(n: int) -> None:
        start = time.time()
        time.sleep(0.1)
        rec.add(n=n, start=start, end=time.time())

    with worker(app, [q], concurrency=4):
        for n in range(10):
            job.delay(n)
        runs = rec.wait(10, timeout=30)
    assert sorted(r["n"] for r in runs) == list(range(10))
    assert most_at_once(runs) <= 2
    starts = sorted(r["start"] for r in runs)
    assert all(starts[i + 5] - starts[i] >= 0.99 for i in range(len(starts) - 5))


def test_one_script_decides_rates_and_cap_together(redis_server: ServerHandle) -> None:
    """A task under a queue's rules and cap costs one decision script when it is admitted (rates
    and slot together) and one release at its end: watched with MONITOR on a private Redis."""
    q = queue_name()
    store = EmbeddedRedis().start()
    try:
        app = new_app(
            redis_server.url(),
            q,
            governor_redis_url=store.url(2),
            governor_queues={q: {"rules": "1000/s", "concurrency": 2}},
        )
        Governor(app)
        rec = Recorder(redis_server.url())

        @app.task(shared=False)
        def job(n: int) -> None:
            rec.add(n=n)

        client = redis.Redis.from_url(store.url(2))
        lim = Limiter(client, "1000/s", concurrency=2, name="queue")
        scripts = (lim._script, lim._rates, lim._cap_ops)
        shas = {s.sha: what for s, what in zip(scripts, ("decide", "rates", "cap_ops"))}
        for script in scripts:
            client.script_load(script.text)
        seen: list[str] = []
        watching = threading.Event()

        def watch() -> None:
            with contextlib.suppress(Exception), client.monitor() as monitor:
                watching.set()
                for command in monitor.listen():
                    seen.append(command["command"])

        threading.Thread(target=watch, daemon=True).start()
        assert watching.wait(5)
        marks = {
            "cap_decide.lua:": "decide",
            "cap_ops.lua:": "cap_ops",
            "sliding_log.lua:": "rates",
        }

        def count() -> Counter[str]:
            return Counter(
                "peek"  # the main process's look before the pool (at most one per 50 ms)
                if " peek " in c
                else shas.get(c.split()[1], "other")
                if c.upper().startswith("EVALSHA ")
                else next((what for mark, what in marks.items() if mark in c), "other")
                for c in list(seen)
                if c.upper().startswith(("EVALSHA ", "EVAL "))
            )

        with worker(app, [q], concurrency=1):
            for n in range(20):
                job.delay(n)
            rec.wait(20, timeout=30)
            counts = wait_for(count, lambda c: c["cap_ops"] >= 20, timeout=10)
        assert counts["decide"] == 20 and counts["rates"] == 0, counts
        assert counts["cap_ops"] == 20, counts  # one release per task
    finally:
        store.stop()


def test_per_key_caps(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    rec = Recorder(redis_server.url())

    @app.task(
        base=GovernedTask,
        governor_concurrency=1,
        governor_key=lambda account_id, **_: account_id,
        shared=False,
    )
    def rebuild(account_id: str, n: int) -> None:
        start = time.time()
        time.sleep(0.15)
        rec.add(account=account_id, n=n, start=start, end=time.time())

    with worker(app, [q], concurrency=6):
        for n in range(3):
            for account in ("a", "b"):
                rebuild.delay(account, n)
        runs = rec.wait(6, timeout=30)
    assert len(runs) == 6
    for account in ("a", "b"):
        assert most_at_once([r for r in runs if r["account"] == account]) == 1
    assert most_at_once(runs) == 2  # the two accounts ran side by side


@pytest.mark.compat
@pytest.mark.parametrize("ending", ["error", "retry", "ignore", "reject"])
def test_a_slot_is_given_back_however_the_body_ends(
    redis_server: ServerHandle, ending: str
) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    app.conf.governor_tasks = {"ends": {"concurrency": 1}}
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(name="ends", bind=True, shared=False, max_retries=1, default_retry_delay=0.05)
    def ends(self: Task, n: int) -> None:
        rec.add(n=n, retries=self.request.retries)
        if n == 0 and self.request.retries == 0:
            if ending == "error":
                raise RuntimeError("boom")
            if ending == "retry":
                raise self.retry()
            if ending == "ignore":
                raise Ignore()
            raise Reject("no", requeue=False)

    with worker(app, [q], concurrency=3):
        ends.delay(0)
        ends.delay(1)
        expected = 3 if ending == "retry" else 2
        runs = rec.wait(expected, timeout=20)
    assert len(runs) == expected
    lim = Limiter(
        governor.gate.client, None, concurrency=1, name="task", prefix=governor.settings.prefix
    )
    assert lim.holders("ends").holders == ()


def test_the_command_line_shows_holders_and_waiters(redis_server: ServerHandle) -> None:
    import json

    from click.testing import CliRunner

    from governor.cli import cli

    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: {"rules": "10/m", "concurrency": 2}})
    governor = Governor(app)
    settings = governor.settings
    lim = governor.gate.store.limiter("queue", settings.queues[q])
    first = lim.acquire(q, holder="task-1:0", info="node-a 101")
    lim.acquire(q, holder="task-2:0", info="node-b 202")
    assert lim.acquire(q, holder="task-3:0").capped == "full"
    assert lim.wait(q, "task-3:0", "{}").status == "queued"
    runner = CliRunner(env={"COLUMNS": "160", "GOVERNOR_REDIS_URL": ""})

    def run(*args: str) -> Any:
        return runner.invoke(cli, list(args), obj=app, catch_exceptions=False)

    shown = run("inspect", "queue", q, "--json")
    assert shown.exit_code == 1  # full: no slot for one more
    cap = json.loads(shown.stdout)["concurrency"]
    assert (cap["limit"], cap["running"], cap["waiting"]) == (2, 2, 1)
    assert [h["info"] for h in cap["holders"]] == ["node-a 101", "node-b 202"]
    text = run("inspect", "queue", q).stdout
    assert "2 of 2 at once; 1 waiting" in text and "task-1:0" in text and "node-b 202" in text
    status = run("status").stdout
    assert "10/m, 2 at once" in status and "2/2 running" in status and "1 waiting" in status
    assert "at once" in run("top", "--once").stdout
    assert first.hold is not None
    lim.release(q, first.hold)
    assert json.loads(run("inspect", "queue", q, "--json").stdout)["concurrency"]["waiting"] == 0


def test_an_expired_waiter_hands_its_slot_on_at_once(redis_server: ServerHandle) -> None:
    """A task handed a slot whose message Celery drops before the gate (it expired while it
    waited in line; a revoked one alike) leaves the line as it is dropped: the slot goes on to
    the next waiter at once, not after the 30 s lease of a hand-over nobody starts."""
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_concurrency_lease=30.0)
    governor = Governor(app)
    rec = Recorder(redis_server.url())
    release_a = threading.Event()

    @governor.task(concurrency=1, shared=False, bind=True)
    def export(self: Task, name: str) -> None:
        rec.add(name=name, start=time.time())
        if name == "A":
            release_a.wait(30)

    lim = Limiter(
        governor.gate.client, None, concurrency=1, name="task", prefix=governor.settings.prefix
    )
    with worker(app, [q], concurrency=4):
        export.delay("A")
        wait_for(rec.all, lambda runs: len(runs) == 1, timeout=20)
        export.apply_async(("B",), expires=3)  # seconds from now
        wait_for(lambda: lim.holders(export.name).waiting, lambda n: n == 1, timeout=20)
        export.delay("C")
        wait_for(lambda: lim.holders(export.name).waiting, lambda n: n == 2, timeout=20)
        time.sleep(3.5)  # B expires while it waits in line (Celery's clock, not governor's)
        ended = time.time()
        release_a.set()
        runs = wait_for(rec.all, lambda runs: len(runs) == 2, timeout=20)
    assert [r["name"] for r in runs] == ["A", "C"]  # B never ran
    assert runs[1]["start"] - ended < 10, "C waited for B's hand-over to lapse"
