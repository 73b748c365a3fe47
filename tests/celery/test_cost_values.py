"""What a cost callable may give (suspicion settled): a fraction was truncated (2.9 counted as
2, so calls ran over their limit) and 0 failed the task with a CostError. A fraction now rounds
up, 0 runs at once counted by no limit (an empty batch costs nothing), and anything else fails
the call with an error that names the task."""

from __future__ import annotations

import math
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from governor import ConfigError, Limiter
from governor.celery import Governor
from governor.celery.admission.calls import MAX_COST, units
from support.celery_helpers import Recorder, new_app, worker
from support.servers import ServerHandle

TASK = SimpleNamespace(name="proj.export")


@pytest.mark.parametrize(
    ("value", "counted"),
    [(2.9, 3), (2.0, 2), (2, 2), (0.1, 1), (0, 0), (0.0, 0), (MAX_COST, MAX_COST)],
)
def test_a_fraction_rounds_up(value: float, counted: int) -> None:
    assert units(TASK, value) == counted


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, "3", None, True, MAX_COST + 1])
def test_a_bad_cost_names_the_task(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"task 'proj.export': governor_cost returned"):
        units(TASK, value)


def test_costs_count_as_given(redis_server: ServerHandle, failures: list[BaseException]) -> None:
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q, governor_queues={q: "100/h"})
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False, governor_cost=lambda size, **_: size)
    def export(size: Any) -> None:
        rec.add(size=size)

    store = redis.Redis.from_url(redis_server.url(2))
    limit = Limiter(store, "100/h", name="queue", prefix=app.conf.governor_prefix)
    with worker(app, [q], concurrency=1):
        export.delay(2.9)
        assert len(rec.wait(1, timeout=20)) == 1
        assert limit.usage(q).rules[0].used == 3  # rounded up, never down
        limit.block(q, 3600, "closed for the night")
        export.delay(0)  # costs nothing: runs at once, blocked or not, counted by no limit
        assert [r["size"] for r in rec.wait(2, timeout=20)] == [2.9, 0]
        assert limit.usage(q).rules[0].used == 3
        limit.unblock(q)
        export.delay(-1)
        export.delay(5)
        assert [r["size"] for r in rec.wait(3, timeout=20)] == [2.9, 0, 5]
    assert len(failures) == 1 and isinstance(failures[0], ConfigError)
    assert "governor_cost returned -1" in str(failures[0]) and export.name in str(failures[0])
