"""A governed message that could not be acknowledged is not run or deferred again.

The worker acknowledges a governed message once its fate is known (see :mod:`.request`): it
ran, it failed, or a copy of it was re-published or parked to wait. When the broker connection
is down at that moment the acknowledgement is lost (Celery logs "Couldn't ack") and the broker
delivers the message again (the Redis transport after its visibility timeout, RabbitMQ when
the channel closes): it would run a second time, or wait a second time while its first copy
already waits. So the worker marks such a message in the governor's Redis, which is not the
broker, and a consumer drops a redelivered message that carries a mark. Marks are written only
when an acknowledgement fails, and read only for messages the broker flags as redelivered.

A message is known by its task id, its ``retries`` and its governance ``waits``: each copy of a
task (a deferral, a retry) differs in one of them, and a redelivery has them all the same::

    <prefix>:acked:<task id>:<retries>:<waits>    STRING, a day, or two visibility timeouts
                                                  and an hour when that is longer

A mark must outlive the redelivery: the Redis transport delivers the message again a
``visibility_timeout`` after it delivered it (plus its restore sweep), and long countdowns are
why people raise that timeout past a day (:func:`..config.settings.mark_life`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis
from redis.exceptions import RedisClusterException, RedisError

from ...errors import StorageUnavailable
from ..types import HEADER

__all__ = ["mark", "settled", "waits_of"]

logger = logging.getLogger("governor.celery")


def _key(prefix: str, task_id: str, retries: int, waits: int) -> str:
    return f"{prefix}:acked:{task_id}:{retries}:{waits}"


def waits_of(headers: Mapping[str, Any] | None) -> int:
    """The governance waits a message's headers carry."""
    carried = (headers or {}).get(HEADER)
    return int(carried.get("waits") or 0) if isinstance(carried, Mapping) else 0


def mark(
    client: redis.Redis, prefix: str, task_id: str, retries: int, waits: int, life: float
) -> None:
    """The acknowledgement of this message failed: a redelivery of it within ``life`` seconds
    is dropped."""
    try:
        client.set(_key(prefix, task_id, retries, waits), 1, px=max(1, round(life * 1000)))
    except (RedisError, RedisClusterException) as exc:
        raise StorageUnavailable(f"Redis did not answer for an unacknowledged task: {exc}") from exc


def settled(client: redis.Redis, prefix: str, request: Any, waits: int) -> bool:
    """True for a redelivered message (the running task's ``request``) that this or another
    worker already ran or deferred, but could not acknowledge: drop it."""
    if not (getattr(request, "delivery_info", None) or {}).get("redelivered"):
        return False
    key = _key(prefix, str(request.id), int(request.retries or 0), waits)
    try:
        found = bool(client.exists(key))
    except (RedisError, RedisClusterException) as exc:
        raise StorageUnavailable(f"Redis did not answer for a redelivered task: {exc}") from exc
    if found:
        logger.warning(
            "governor: %s[%s] dropped: delivered again after it ran or was deferred (its "
            "acknowledgement was lost)",
            request.task,
            request.id,
        )
    return found
