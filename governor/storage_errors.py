"""Which redis-py errors mean what to governor: "not now" (:class:`StorageUnavailable`), a key
that is not governor's (:class:`StateError`), or a bug to raise as it is."""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import StateError, StorageUnavailable

__all__ = ["REFUSING", "UNAVAILABLE", "storage_error"]

UNAVAILABLE = (
    RedisConnectionError,  # also BusyLoadingError: a replica or restart still loading
    RedisTimeoutError,
    ClusterDownError,  # also MasterDownError
    TryAgainError,
    RedisClusterException,
    ReadOnlyError,  # a replica after failover, before the client follows the new master
    OutOfMemoryError,  # maxmemory reached under noeviction
)
"""Redis errors that mean "not now": the caller got no answer. A connection refused or a send
that failed changed nothing; a read timeout may come after Redis ran the script (the reply was
lost; tests/core/test_lost_replies.py): what it counted stays counted, an admission or booking
the caller never learned of, a concurrency slot held until its lease ends. So a lost reply only
makes limits stricter for a while; nothing is sent twice (the lean lane never resends after
sending, and redis-py does not retry a timeout by default)."""
REFUSING = ("MISCONF", "BUSY", "NOREPLICAS", "LOADING", "MASTERDOWN", "READONLY", "OOM")
"""Error replies of a server that refuses writes for a while (prefixes)."""


def storage_error(exc: Exception, name: str, algorithm: str, keys: Sequence[str]) -> Exception:
    """Translate a redis-py error of limiter ``name`` into a governor error (or return it)."""
    if isinstance(exc, UNAVAILABLE) or (
        isinstance(exc, ResponseError) and str(exc).startswith(REFUSING)
    ):
        return StorageUnavailable(f"Redis did not answer for limiter {name!r}: {exc}")
    if isinstance(exc, ResponseError):
        text = str(exc)
        if "WRONGTYPE" in text:
            return StateError(
                f"Redis key {keys[0]!r} or {keys[-1]!r} holds a value of another type than "
                f"governor's {algorithm} state: is limiter name {name!r} used "
                "by another program, or by a limiter with another algorithm and prefix?"
            )
        if "governor: corrupt" in text:
            return StateError(text[text.index("governor: ") :])
    return exc
