"""A fork of the worker's main process waits for the round of governor's threads there (the
releaser, the fair dispatcher): a pool process is never forked while one of them holds a lock
(governor/celery/fork_guard.py). A private Redis pauses its clients (``CLIENT PAUSE``) so a
round is held inside Redis; the fork must come after the pause, not during it."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest
import redis
from celery import Celery

from governor.celery.config.settings import load_settings
from governor.celery.config.store import Store
from governor.celery.fair.dispatcher import FairDispatcher
from governor.celery.waiting.releaser import Releaser
from governor.embedded import EmbeddedRedis
from support.celery_helpers import wait_for

PAUSE = 1.5


def in_use(client: redis.Redis) -> int:
    """Commands this client has in flight (connections taken from its pool)."""
    return len(client.connection_pool._in_use_connections)  # type: ignore[attr-defined]


def start_thread(kind: str, url: str) -> tuple[Any, redis.Redis]:
    app = Celery(f"fork-{uuid.uuid4().hex[:6]}", set_as_current=False)
    if kind == "releaser":
        client = redis.Redis.from_url(url)
        thread: Any = Releaser(app, lambda: client, f"gt{uuid.uuid4().hex[:8]}", 5.0, interval=0.05)
    else:
        app.conf.governor_redis_url = url
        app.conf.governor_prefix = f"gt{uuid.uuid4().hex[:8]}"
        store = Store(load_settings(app.conf))
        client = store.client
        thread = FairDispatcher(app, store, store.settings)
    thread.start()
    return thread, client


@pytest.mark.parametrize("kind", ["releaser", "dispatcher"])
def test_a_fork_waits_for_the_round_in_progress(kind: str) -> None:
    with EmbeddedRedis() as server:
        admin = redis.Redis.from_url(server.url())
        thread, client = start_thread(kind, server.url())
        try:
            admin.execute_command("CLIENT", "PAUSE", int(PAUSE * 1000), "ALL")
            paused = time.monotonic()
            busy = wait_for(lambda: in_use(client), bool, timeout=PAUSE / 2, every=0.005)
            assert busy, "no round started during the pause"
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            forked = time.monotonic()
            os.waitpid(pid, 0)
        finally:
            thread.stop()
            admin.close()
    # the round was held inside Redis until the pause ended: the fork came after it
    assert forked - paused >= PAUSE - 0.2, forked - paused
