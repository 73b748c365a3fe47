"""Adaptive limits (AIMD): the factor's decrease in Redis (once per overload), its climb back
with time, the rules it scales to, and a worker whose adaptive limit learns an upstream's quota
from its 429s."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
import redis

from governor.celery import Governor, signals
from governor.celery.config.factors import Factor, read_factors, scaled
from governor.celery.config.limit_config import limit_config
from governor.celery.config.live import LiveView
from governor.celery.config.settings import Settings
from governor.celery.feedback.adaptive import decrease
from governor.celery.types import LimitSpec
from governor.errors import ConfigError
from governor.rules import Rule
from support.celery_helpers import Recorder, new_app, worker
from support.servers import ServerHandle
from support.upstream_server import get, upstream


def test_a_factor_scales_rules_in_steps() -> None:
    config = limit_config({"rules": "100/s, 10/m", "adaptive": True}, "sliding_log", "x")
    assert scaled(config, 1.0) is config and scaled(config, 0.999) is not config
    half = scaled(config, 0.5)
    assert half.rules == (Rule(50, 1.0), Rule(5, 60.0))  # the count scales: the burst too
    assert half.adaptive and half.algorithm == "sliding_log" and half.ceiling == config.rules
    assert scaled(config, 0.505).rules == half.rules  # rounded down to a step of 1/100
    assert scaled(config, 0.0).rules == (Rule(1, 1.0), Rule(1, 600.0))  # the floor step


def test_a_factor_climbs_back_with_time() -> None:
    f = Factor(0.5, 1000.0)
    assert f.at(1000.0, 0.02) == 0.5
    assert f.at(1010.0, 0.02) == pytest.approx(0.7)
    assert f.at(2000.0, 0.02) == 1.0 and f.at(900.0, 0.02) == 0.5


def test_bad_adaptive_settings_are_refused() -> None:
    for value in ({"concurrency": 2, "adaptive": True}, {"rules": "5/s", "adaptive": "yes"}):
        with pytest.raises(ConfigError):
            limit_config(value, "sliding_log", "x")


def test_decreases_count_once_per_overload(r: redis.Redis, prefix: str) -> None:
    settings = Settings(redis_url=None, prefix=prefix)
    assert decrease(r, settings, "queue:q", gap=30) == (pytest.approx(0.7), True)
    assert decrease(r, settings, "queue:q", gap=30) == (pytest.approx(0.7, abs=0.01), False)
    factors = read_factors(r, prefix)
    assert set(factors) == {"queue:q"} and factors["queue:q"].value == pytest.approx(0.7)
    version = int(r.get(f"{prefix}:{{live}}:version") or 0)
    assert version == 1  # workers read the factors again
    # a process's view scales the adaptive limit it governs (and nothing else)
    view = LiveView(lambda: r, settings)
    config = limit_config({"rules": "20/s", "adaptive": True}, "sliding_log", "x")
    spec = LimitSpec("queue", "queue", config, "q")
    other = LimitSpec("queue", "queue", replace(config, adaptive=False), "q")
    scaled_spec, kept = view.apply([spec, other])
    assert scaled_spec.config.rules == (Rule(14, 1.0),) and kept is other


def test_an_adaptive_limit_learns_the_upstream_quota(redis_server: ServerHandle) -> None:
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: {"rules": "20/s", "adaptive": True}},
        governor_adaptive_decrease=0.5,
    )
    Governor(app)
    rec = Recorder(redis_server.url())
    adapted: list[float] = []

    def receive(sender: Any = None, factor: float = 0.0, **_: Any) -> None:
        adapted.append(factor)

    signals.limit_adapted.connect(receive, weak=False)
    try:
        with upstream(quota=5, window=1.0) as up:

            @app.task(shared=False, max_retries=0)
            def call(n: int) -> None:
                get(up.url)
                rec.add(n=n)

            with worker(app, [q], concurrency=4):
                for n in range(40):
                    call.delay(n)
                runs = rec.wait(40, timeout=60)
            statuses = up.statuses()
    finally:
        signals.limit_adapted.disconnect(receive)
    assert sorted(r["n"] for r in runs) == list(range(40))
    assert adapted and adapted[0] == pytest.approx(0.5)  # 20/s -> 10/s at the first 429s
    assert statuses.count(429) <= 40 // 2, statuses


def test_status_shows_the_rate_workers_use_now(redis_server: ServerHandle) -> None:
    from click.testing import CliRunner

    from governor.cli import cli

    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q, governor_queues={q: {"rules": "20/s", "adaptive": True}})
    governor = Governor(app)
    runner = CliRunner(env={"COLUMNS": "160", "GOVERNOR_REDIS_URL": ""})
    status = runner.invoke(cli, ["status"], obj=app, catch_exceptions=False).stdout
    assert "20/s (adaptive, 100% of its rules now)" in status
    decrease(governor.gate.client, governor.settings, f"queue:{q}", gap=30)
    status = runner.invoke(cli, ["status"], obj=app, catch_exceptions=False).stdout
    assert "14/s (adaptive, 70% of its rules now)" in status, status
