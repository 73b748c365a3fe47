"""``governor doctor``: deployment checks on real servers (the suite's, and private ones whose
configuration a test may change)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result

from governor.cli import cli
from governor.deployment import FAIL, OK, WARN, green_connections, visibility
from governor.embedded import EmbeddedRedis
from support.servers import ServerHandle


def doctor(*args: str, obj: Any = None) -> Result:
    """``governor [options] doctor [--json]`` (``--json`` may be given among ``args``)."""
    given = [arg for arg in args if arg != "--json"]
    tail = ["--json"] if "--json" in args else []
    runner = CliRunner(env={"COLUMNS": "120", "GOVERNOR_REDIS_URL": ""})
    return runner.invoke(cli, [*given, "doctor", *tail], obj=obj, catch_exceptions=False)


def report(result: Result) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def statuses(result: Result) -> dict[str, str]:
    return {c["check"]: c["status"] for c in report(result)["checks"]}


@pytest.fixture
def private() -> Iterator[tuple[str, redis.Redis]]:
    """A server of the test's own (its configuration is changed)."""
    server = EmbeddedRedis(appendonly=True).start()
    client = redis.Redis.from_url(server.url())
    try:
        yield server.url(), client
    finally:
        client.close()
        server.close()


def test_doctor_on_the_suite_server(redis_server: ServerHandle) -> None:
    if not redis_server.private:
        pytest.skip("checks the suite's own server (no persistence)")
    text = doctor("--redis-url", redis_server.url())
    assert text.exit_code == 1  # nothing on disk, no replica
    lines = text.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["ok", "redis"],
        ["FAIL", "persistence"],
        ["ok", "eviction"],
        ["ok", "clock"],
    ]
    assert "a restart loses parked tasks" in lines[1]
    as_json = doctor("--redis-url", redis_server.url(), "--json")
    assert as_json.exit_code == 1
    data = report(as_json)
    assert data["ok"] is False and data["app"] is None
    assert statuses(as_json) == {"redis": OK, "persistence": FAIL, "eviction": OK, "clock": OK}


def test_doctor_passes_with_aof_and_noeviction(private: tuple[str, redis.Redis]) -> None:
    url, _ = private
    result = doctor("--redis-url", url, "--json")
    assert result.exit_code == 0 and report(result)["ok"] is True
    assert set(statuses(result).values()) == {OK}


@pytest.mark.parametrize(
    ("config", "check", "status", "mentions"),
    [
        ({"appendonly": "no", "save": "3600 1"}, "persistence", WARN, "RDB snapshots only"),
        ({"appendfsync": "no"}, "persistence", WARN, "appendfsync no"),
        ({"maxmemory": "100mb", "maxmemory-policy": "allkeys-lru"}, "eviction", FAIL, "parked"),
        ({"maxmemory": "100mb", "maxmemory-policy": "volatile-ttl"}, "eviction", FAIL, "TTL"),
        ({"maxmemory": "0", "maxmemory-policy": "allkeys-lru"}, "eviction", OK, "no maxmemory"),
    ],
)
def test_doctor_judges_the_configuration(
    private: tuple[str, redis.Redis], config: dict[str, str], check: str, status: str, mentions: str
) -> None:
    url, client = private
    for name, value in config.items():
        client.config_set(name, value)
    result = doctor("--redis-url", url, "--json")
    found = next(c for c in report(result)["checks"] if c["check"] == check)
    assert found["status"] == status and mentions in found["detail"]
    assert result.exit_code == (1 if status == FAIL else 0)


def test_doctor_refuses_a_replica(private: tuple[str, redis.Redis]) -> None:
    url, client = private
    with EmbeddedRedis() as master:
        client.replicaof("127.0.0.1", master.port)
        result = doctor("--redis-url", url, "--json")
        client.replicaof("NO", "ONE")
    assert result.exit_code == 1 and statuses(result)["redis"] == FAIL


def test_doctor_with_an_app_checks_the_visibility_timeout(
    redis_server: ServerHandle, prefix: str
) -> None:
    app = Celery(f"doctor-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.broker_url = redis_server.url(1)
    app.conf.broker_transport_options = {"visibility_timeout": 600}
    app.conf.governor_redis_url = redis_server.url(2)
    app.conf.governor_prefix = prefix
    found = next(
        c for c in report(doctor("--json", obj=app))["checks"] if c["check"] == "visibility"
    )
    assert found["status"] == OK and "governor_park_after 300s" in found["detail"]

    app.conf.governor_park_after = False
    lines = doctor(obj=app).stdout.splitlines()
    assert any(line.startswith("FAIL  visibility") for line in lines)


@pytest.mark.parametrize(
    ("broker", "options", "park_after", "max_wait", "status"),
    [
        ("redis://h/0", None, 300.0, None, OK),  # the default: half of 3600, at most 300
        ("redis://h/0", {"visibility_timeout": 600}, 400.0, None, WARN),
        ("sentinel://h1;sentinel://h2", {"visibility_timeout": 600}, 600.0, None, FAIL),
        ("redis://h/0", {"visibility_timeout": 600}, None, None, FAIL),
        ("redis://h/0", {"visibility_timeout": 600}, None, 120.0, OK),
    ],
)
def test_visibility_against_park_after(
    broker: str,
    options: dict[str, Any] | None,
    park_after: float | None,
    max_wait: float | None,
    status: str,
) -> None:
    found = visibility(broker, options, park_after, max_wait)
    assert found is not None and found.status == status
    assert visibility("amqp://guest@localhost//", None, None, None) is None


@pytest.mark.parametrize(
    ("broker", "options", "pool", "concurrency", "acks_from_tasks", "status"),
    [
        ("redis://h/0", None, "gevent", 100, True, FAIL),  # kombu's 10 connections
        ("redis://h/0", {"max_connections": 110}, "gevent", 100, True, OK),
        ("sentinel://h1;sentinel://h2", {"max_connections": 50}, "eventlet", 100, True, FAIL),
        ("redis://h/0", None, "gevent", 100, False, None),  # Celery < 5.7 acks on its loop
        ("redis://h/0", None, "prefork", 4, True, None),
        ("amqp://guest@localhost//", None, "gevent", 100, True, None),
    ],
)
def test_green_pool_against_the_broker_connections(
    broker: str,
    options: dict[str, Any] | None,
    pool: str,
    concurrency: int,
    acks_from_tasks: bool,
    status: str | None,
) -> None:
    found = green_connections(broker, options, pool, concurrency, acks_from_tasks)
    assert (found.status if found else None) == status
    if status == FAIL:
        assert f"'max_connections': {concurrency + 10}" in found.detail  # type: ignore[union-attr]


def test_a_gevent_worker_warns_of_too_few_broker_connections(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The warning a worker logs at start (its bootstep), with the setting that fixes it."""
    pytest.importorskip("gevent")
    from celery.concurrency.gevent import TaskPool
    from celery.worker.consumer import Consumer

    from governor.celery.bootstep import check_green_pool

    app = Celery(f"green-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.broker_url = "redis://127.0.0.1:1/0"
    worker = type("Worker", (), {"app": app, "pool_cls": TaskPool, "concurrency": 100})()
    with caplog.at_level("WARNING", logger="governor.celery"):
        check_green_pool(worker)
    warned = [r.getMessage() for r in caplog.records if "max_connections" in r.getMessage()]
    expected = 1 if hasattr(Consumer, "call_soon_ack") else 0  # Celery 5.7 acks from tasks
    assert len(warned) == expected, warned
    assert all("'max_connections': 110" in w for w in warned)
    caplog.clear()
    app.conf.broker_transport_options = {"max_connections": 110}
    with caplog.at_level("WARNING", logger="governor.celery"):
        check_green_pool(worker)
    assert not [r for r in caplog.records if "max_connections" in r.getMessage()]
