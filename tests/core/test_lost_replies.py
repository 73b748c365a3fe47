"""A read timeout after the command was sent (suspicion settled): Redis may have run the
script, so the caller's StorageUnavailable does not mean "nothing changed". Redis is stopped
(SIGSTOP) while a decision is on its way and resumed after the client gave up: the script runs
then, its count stays, and it ran once (neither the lean lane nor redis-py sent it again)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from governor import Limiter, StorageUnavailable
from governor.embedded import EmbeddedRedis
from support.celery_helpers import wait_for

T = 1_700_000_000.0


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    """A server of this test's own: it is stopped for a moment."""
    with EmbeddedRedis() as srv:
        yield srv


def lost(server: EmbeddedRedis, call: Callable[[], object]) -> None:
    """Make ``call`` while Redis is stopped: it is sent, its reply never comes in time."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(StorageUnavailable, match="Timeout"):
            call()
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


@pytest.mark.parametrize("direct", [True, False], ids=["lean lane", "client"])
def test_a_lost_reply_may_have_counted(server: EmbeddedRedis, direct: bool) -> None:
    client = redis.Redis.from_url(server.url(), socket_timeout=0.2)
    lim = Limiter(client, "10/s", name="api", prefix=f"p{uuid.uuid4().hex[:8]}", direct=direct)
    assert lim.acquire("c", now=T).allowed  # scripts loaded, a connection ready
    lost(server, lambda: lim.acquire("c", 3, now=T))
    used = wait_for(lambda: lim.usage("c", now=T).rules[0].used, lambda n: n > 1, timeout=10)
    assert used == 1 + 3  # the lost admission counts, once
    lost(server, lambda: lim.reserve("b", 10, now=T, not_before=T + 5))
    booked = wait_for(lambda: lim.usage("b", now=T).booked, lambda n: n > 0, timeout=10)
    assert booked == 10  # the lost booking holds its room
    client.close()
