"""Parking: long waits are kept in Redis, not in the broker.

A task that must wait longer than ``governor_park_after`` is not re-published with a far ETA.
ETA messages sit unacknowledged in worker memory, and on the Redis broker one held longer than
the visibility timeout is delivered again and runs twice (celery/celery#2599, #3270, #7009).
Instead the message is parked in Redis (a sorted set by due time, survives worker restarts) and
a releaser inside every worker re-publishes it once it is within ``park_after`` of its slot, as
an ordinary short ETA.

Releasing is at least once and running is exactly once: a releaser picks entries up (a *pickup*,
which lapses after ``governor_release_lease``), publishes them, and only then removes them; one that
dies in between leaves its pickup to lapse and another releaser publishes the entries again. Each
released message carries its parking id and a token of its own publication, and the consumer claims
that id before running it: the first copy to claim it runs, another copy is dropped, and the broker
delivering the same copy again (a worker died, a message was requeued) runs it (the token matches).

Keys (one hash tag, so one Redis Cluster slot)::

    <prefix>:{parked}:due      ZSET  parking id -> due (Unix ms, Redis clock)
    <prefix>:{parked}:msgs     HASH  parking id -> envelope (JSON)
    <prefix>:{parked}:lease    ZSET  parking id -> when its pickup lapses (Unix ms)
    <prefix>:{parked}:seen:ID  STRING, 1 day: the release token of the copy that claimed it

With ``governor_parking_shards = N`` (> 1; for a Redis Cluster) parked tasks spread over N such
groups, ``{parked:0}`` ... ``{parked:N-1}``, each its own hash slot: a task's shard is part of
its parking id (``s<K>~...``), so whoever holds the id finds its keys, and releasers take from
every shard (and from ``{parked}``, where tasks parked before sharding wait). Raise N only:
a shard past a lowered N is no longer released.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import zlib
from collections.abc import Iterator
from typing import Any

import redis
from redis.exceptions import RedisClusterException, RedisError

from ...errors import StorageUnavailable
from ...scripts import package_script, run_script
from ...text import as_text
from ..types import HEADER

__all__ = [
    "HEADER",
    "all_shards",
    "claim_first_delivery",
    "forget_released",
    "keys",
    "new_parking_id",
    "park",
    "parked_count",
    "parked_entries",
    "shard_of",
    "stamp_release",
    "take_due",
]

logger = logging.getLogger("governor.celery")
SEEN_TTL_MS = 86_400_000
UNREPLICATED_PAUSE = 30.0
"""After replicas failed to acknowledge a parked task, a process parks without ``WAIT`` for
this long: with no replica left (after a failover) every ``WAIT`` would block its full
timeout, and deferrals that slow keep tasks from starting on their slots."""
_unreplicated_until = 0.0


def keys(prefix: str, shard: int | None = None) -> tuple[str, str, str]:
    head = _head(prefix, shard)
    return head + "due", head + "msgs", head + "lease"


def _head(prefix: str, shard: int | None) -> str:
    return f"{prefix}:{{parked}}:" if shard is None else f"{prefix}:{{parked:{shard}}}:"


def shard_of(parking_id: str) -> int | None:
    """The shard a parking id names (``s<K>~...``), or None: the unsharded ``{parked}``."""
    head, sep, _ = parking_id.partition("~")
    if sep and head[:1] == "s" and head[1:].isdigit():
        return int(head[1:])
    return None


def new_parking_id(base: str, shards: int) -> str:
    """A parking id for ``base`` (task id, wait, random), in one of ``shards`` shards."""
    if shards <= 1:
        return base
    return f"s{zlib.crc32(base.encode()) % shards}~{base}"


def all_shards(shards: int) -> list[int | None]:
    """Every group a releaser looks at: the unsharded one, then shards 0 .. shards-1."""
    return [None] if shards <= 1 else [None, *range(shards)]


def park(
    client: redis.Redis,
    prefix: str,
    parking_id: str,
    due: float,
    text: str | bytes,
    replicas: int = 0,
    timeout: float = 1.0,
) -> int:
    """Park one message (due: Unix seconds, Redis clock). Returns how many are parked.

    ``replicas``: wait (Redis ``WAIT``) until that many replicas hold it, at most ``timeout``
    seconds, before the caller acknowledges the original message; if they do not (no replica
    left after a failover, say), it stays parked with a warning: it is not taken back, since a
    releaser may already be publishing it."""
    due_key, msgs_key, _ = keys(prefix, shard_of(parking_id))
    parked = int(
        run_script(
            client,
            package_script("governor.celery.waiting", "park"),
            [due_key, msgs_key],
            [parking_id, round(due * 1000), text],
        )
    )
    global _unreplicated_until
    if replicas > 0 and time.monotonic() >= _unreplicated_until:
        try:
            held = _wait(client, due_key, replicas, timeout)
            why = f"reached {held} of {replicas} replicas within {timeout:g}s"
        except StorageUnavailable as exc:
            held, why = 0, str(exc)
        if held < replicas:  # kept parked: taking it back would race the releasers
            _unreplicated_until = time.monotonic() + UNREPLICATED_PAUSE
            logger.warning(
                "governor: a parked task %s (governor_park_replicas): it stays parked, and "
                "this process parks without waiting for %.0fs (a failover now could lose what "
                "it parks)",
                why,
                UNREPLICATED_PAUSE,
            )
    return parked


def _wait(client: redis.Redis, key: str, replicas: int, timeout: float) -> int:
    """``WAIT`` on the node that holds ``key`` (a cluster's master for its slot)."""
    args: dict[str, Any] = {}
    node_of = getattr(client, "get_node_from_key", None)
    if node_of is not None:
        args["target_nodes"] = node_of(key)
    try:
        reply = client.execute_command(  # type: ignore[no-untyped-call]
            "WAIT", replicas, round(timeout * 1000), **args
        )
        return int(reply)
    except (RedisError, RedisClusterException) as exc:
        raise StorageUnavailable(f"Redis did not answer WAIT for a parked task: {exc}") from exc


def claim_first_delivery(
    client: redis.Redis, prefix: str, parking_id: str, token: str | None = None
) -> bool:
    """True when this copy of a released message may run: it is the first to claim the parking
    id, or the same copy again (same release ``token``: the broker redelivered or requeued it).
    False for another copy of the same parked task (a second release): drop it."""
    key = f"{_head(prefix, shard_of(parking_id))}seen:{parking_id}"
    mark = token or "1"
    try:
        pipe = client.pipeline(transaction=True)
        pipe.set(key, mark, nx=True, px=SEEN_TTL_MS)
        pipe.get(key)
        first, holder = pipe.execute()
    except (RedisError, RedisClusterException) as exc:
        raise StorageUnavailable(f"Redis did not answer for parked tasks: {exc}") from exc
    if first:
        return True
    if isinstance(holder, bytes):
        holder = holder.decode()
    return token is not None and holder == token


def stamp_release(sig: Any, parking_id: str | None = None) -> str:
    """Mark a signature about to be released with a token of this publication (and, when its
    header does not name it yet, the parking id it claims on arrival: a re-driven dead letter's
    message was not parked by the gate)."""
    token = secrets.token_hex(8)
    headers = dict(sig.options.get("headers") or {})
    carried = dict(headers.get(HEADER) or {}) if isinstance(headers.get(HEADER), dict) else {}
    if parking_id is not None and not carried.get("parked"):
        carried["parked"] = parking_id
    headers[HEADER] = {**carried, "release": token}
    sig.options["headers"] = headers
    return token


def parked_count(
    client: redis.Redis, prefix: str, label: str | None = None, shards: int = 1
) -> int:
    """Parked tasks (all, or those deferred by limit ``label``)."""
    if label is None:
        total = 0
        for shard in all_shards(shards):
            due_key, _, lease_key = keys(prefix, shard)
            total += int(client.zcard(due_key)) + int(client.zcard(lease_key))
        return total
    return sum(1 for env in parked_entries(client, prefix, shards) if env.get("label") == label)


def parked_entries(client: redis.Redis, prefix: str, shards: int = 1) -> Iterator[dict[str, Any]]:
    """Every parked envelope (HSCAN: fine for thousands; for operators, not hot paths)."""
    for shard in all_shards(shards):
        _, msgs_key, _ = keys(prefix, shard)
        for _id, text in client.hscan_iter(msgs_key, count=500):
            try:
                yield json.loads(text)
            except ValueError:
                continue


def take_due(
    client: redis.Redis,
    prefix: str,
    horizon: float,
    pickup: float,
    batch: int,
    shards: int = 1,
    now: float | None = None,
) -> tuple[float, list[tuple[str, bytes | str]]]:
    """Pick up what is due within ``horizon`` seconds (and what a dead releaser left), for
    ``pickup`` seconds, from every shard: (Redis time, [(parking id, envelope)]), at most
    ``batch`` a shard. Publish each one, then :func:`forget_released` it; what is not
    forgotten is picked up again when its pickup lapses (``now``: Unix seconds for tests; None,
    Redis's clock). A shard that does not answer (its cluster
    master is down) is skipped with a warning, so the others keep flowing and what was taken
    from them is published; :class:`StorageUnavailable` only when none answers."""
    redis_now, taken = 0.0, []
    groups, failed = all_shards(shards), []
    for shard in groups:
        try:
            reply = run_script(
                client,
                package_script("governor.celery.waiting", "take_due"),
                list(keys(prefix, shard)),
                [
                    round(horizon * 1000),
                    round(pickup * 1000),
                    batch,
                    "" if now is None else round(now * 1000),
                ],
            )
        except StorageUnavailable as exc:
            failed.append(exc)
            continue
        redis_now = max(redis_now, int(reply[0]) / 1000)
        taken += [(as_text(reply[i]), reply[i + 1]) for i in range(1, len(reply), 2)]
    if len(failed) == len(groups):
        raise failed[0]
    if failed:
        logger.warning(
            "governor: %d of %d groups of parked tasks not released now: %s",
            len(failed),
            len(groups),
            failed[0],
        )
    return redis_now, taken


def forget_released(client: redis.Redis, prefix: str, parking_id: str) -> None:
    """A taken entry was published (or dead-lettered): remove it."""
    _, msgs_key, lease_key = keys(prefix, shard_of(parking_id))
    try:
        pipe = client.pipeline(transaction=True)
        pipe.zrem(lease_key, parking_id)
        pipe.hdel(msgs_key, parking_id)
        pipe.execute()
    except (RedisError, RedisClusterException) as exc:  # taken again after its pickup lapses
        raise StorageUnavailable(f"Redis did not answer for parked tasks: {exc}") from exc
