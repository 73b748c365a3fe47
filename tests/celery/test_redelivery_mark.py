"""A failed acknowledgement's mark outlives the redelivery (finding 17).

The Redis transport delivers an unacknowledged message again a ``visibility_timeout`` after it
delivered it; people raise that past a day for long countdowns. A mark kept for a fixed day
expired first, and the redelivered message ran a second time. The mark's life now comes from
the transport: read in Redis (PTTL), against the timeout."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from governor.celery import Governor
from governor.celery.config.settings import mark_life
from governor.celery.waiting import redelivery
from support.celery_helpers import new_app
from support.servers import ServerHandle

DAY = 86_400.0


@pytest.mark.parametrize(
    ("broker", "options", "at_least"),
    [
        ("redis://h:6379/0", {"visibility_timeout": 3 * DAY}, 2 * 3 * DAY),
        ("rediss://h:6379/0", {"visibility_timeout": 30 * DAY}, 2 * 30 * DAY),
        ("sentinel://h:26379", {"visibility_timeout": 2 * DAY, "master_name": "m"}, 4 * DAY),
        ("sqs://", {"visibility_timeout": 43_200}, DAY),
        ("redis://h:6379/0", {}, DAY),  # the default timeout, an hour: a day is plenty
        ("amqp://guest@h//", {"visibility_timeout": 5 * DAY}, 10 * DAY),
        ("amqp://guest@h//", {}, DAY),  # redelivered when the channel closes
    ],
)
def test_the_mark_lives_past_the_redelivery(
    broker: str, options: dict[str, Any], at_least: float
) -> None:
    life = mark_life(broker, options)
    assert life >= at_least and life >= DAY
    timeout = options.get("visibility_timeout")
    if timeout is not None:
        assert life > 2 * timeout  # a second redelivery is dropped too


def test_a_redelivery_after_a_long_visibility_timeout_is_still_dropped(
    redis_server: ServerHandle,
) -> None:
    timeout = 3 * DAY  # long countdowns: a Redis broker keeps them unacknowledged this long
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: "10/s"},
        broker_transport_options={"visibility_timeout": timeout},
    )
    governor = Governor(app)
    app.finalize()
    settings, conf = governor.settings, app.conf
    client = redis.Redis.from_url(redis_server.url(2))
    task_id = uuid.uuid4().hex
    # the worker could not acknowledge the message (the path request.py takes)
    life = mark_life(conf.get("broker_url"), conf.get("broker_transport_options"))
    redelivery.mark(client, settings.prefix, task_id, 0, 2, life)
    key = f"{settings.prefix}:acked:{task_id}:0:2"
    assert client.pttl(key) / 1000 > 2 * timeout  # there when the broker delivers it again
    again = SimpleNamespace(id=task_id, retries=0, task="t", delivery_info={"redelivered": True})
    assert redelivery.settled(client, settings.prefix, again, 2)
    first = SimpleNamespace(id=task_id, retries=0, task="t", delivery_info={})
    assert not redelivery.settled(client, settings.prefix, first, 2)
    client.delete(key)
