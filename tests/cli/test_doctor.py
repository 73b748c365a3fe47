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
from governor.deployment import FAIL, OK, WARN, visibility
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
