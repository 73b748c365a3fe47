"""Live limits and shadow limits with a real worker (threads pool, in process) and the suite's
Redis: a change made with `governor limits set` governs the next calls within about a second,
`reset` goes back to the configuration, bad input writes nothing; a shadow limit counts what it
would defer and defers nothing."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from click.testing import CliRunner

from governor.celery import Governor, signals
from governor.celery.config.live import REFRESH, LiveLimits
from governor.cli import cli
from support.celery_helpers import Recorder, new_app, wait_for, worker
from support.servers import ServerHandle


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


def most_in_a_second(starts: list[float]) -> int:
    starts = sorted(starts)
    return max((sum(1 for t in starts[i:] if t < s + 1.0) for i, s in enumerate(starts)), default=0)


def test_the_command_line_sets_shows_and_resets(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "100/s"})
    governor = Governor(app)
    runner = CliRunner(env={"COLUMNS": "160", "GOVERNOR_REDIS_URL": ""})

    def run(*args: str) -> Any:
        return runner.invoke(cli, list(args), obj=app, catch_exceptions=False)

    live = LiveLimits(governor.gate.client, governor.settings.prefix)
    bad = run("limits", "set", q, "20/parsec")
    assert bad.exit_code == 2 and "20/parsec" in bad.output and live.entries() == {}
    unknown = run("limits", "set", "no-such-queue", "5/s")
    assert unknown.exit_code == 2 and f"queue:{q}" in unknown.output
    assert run("limits", "set", q, "--shadow").exit_code == 2  # neither rules nor a cap
    done = run("limits", "set", q, "20/s, 800/d", "--by", "ops@test")  # a bare queue name
    assert done.exit_code == 0, done.output
    assert f"queue:{q}: 20/s, 800/d for every worker (by ops@test)" in done.output
    shown = json.loads(run("limits", "show", "--json").stdout)
    row = next(r for r in shown if r["label"] == f"queue:{q}")
    assert row["live"] == {"rules": "20/s, 800/d"} and row["configured"] == "100/s"
    assert row["by"] == "ops@test" and abs(row["at"] - time.time()) < 60
    assert "20/s, 800/d (live)" in run("status").stdout
    assert "configured: 100/s" in run("limits", "show").stdout
    assert (
        run("limits", "reset", f"queue:{q}").output.strip().endswith("back to the configuration.")
    )
    assert live.entries() == {}
    assert "had no live limit" in run("limits", "reset", f"queue:{q}").output


def test_a_live_change_reaches_the_worker_within_a_second(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: "100/s"})
    governor = Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(n: int) -> None:
        rec.add(n=n)

    live = LiveLimits(governor.gate.client, governor.settings.prefix)
    picked: list[Any] = []

    def receive(sender: Any = None, labels: Any = None, **_: Any) -> None:
        picked.append(labels)

    signals.live_limits_changed.connect(receive, weak=False)
    with worker(app, [q], concurrency=4):
        for n in range(10):  # a second under the configuration
            job.delay(n)
            time.sleep(0.1)
        changed = time.time()
        live.set(f"queue:{q}", {"rules": "4/s"}, "test")
        for n in range(10, 30):  # two seconds under the live limit, arriving at 10/s
            job.delay(n)
            time.sleep(0.1)
        runs = rec.wait(30, timeout=30)
    assert sorted(r["n"] for r in runs) == list(range(30))
    before = [r["t"] for r in runs if r["t"] < changed]
    after = [r["t"] for r in runs if r["t"] >= changed + REFRESH]
    assert most_in_a_second(before) >= 8  # 10/s went through before the change
    assert after and most_in_a_second(after) <= 4, sorted(after)
    signals.live_limits_changed.disconnect(receive)
    assert [f"queue:{q}"] in picked  # the worker's process picked the change up, once
    live.reset(f"queue:{q}")


def test_a_shadow_limit_defers_nothing_and_counts(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_queues={q: {"rules": "2/s", "shadow": True}})
    Governor(app)
    rec = Recorder(redis_server.url())
    denied: list[dict[str, Any]] = []

    def receive(sender: Any = None, **kw: Any) -> None:
        denied.append({"limit": kw.get("limit"), "rule": str(kw.get("rule"))})

    signals.shadow_denied.connect(receive, weak=False)

    @app.task(shared=False)
    def job(n: int) -> None:
        rec.add(n=n)

    try:
        with worker(app, [q], concurrency=2):
            started = time.time()
            for n in range(10):
                job.delay(n)
            runs = rec.wait(10, timeout=20)
            wait_for(lambda: len(denied), lambda d: d >= 8, timeout=5)
    finally:
        signals.shadow_denied.disconnect(receive)
    assert len(runs) == 10
    assert max(r["t"] for r in runs) - started < 2.0  # nothing waited for the 2/s
    assert len(denied) == 8 and {d["limit"] for d in denied} == {f"queue:{q}"}
    assert all("2/s" in d["rule"] for d in denied)
