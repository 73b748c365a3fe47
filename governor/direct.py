"""A lean lane to Redis for decisions: one connection per thread, each command sent packed.

redis-py runs every command through its full machinery: a retry wrapper, a pool borrow that
polls the socket, client-side-cache and observability hooks. On the CI machine that is about
45 µs a call, twice what a governor script takes inside Redis. For a plain ``redis.Redis``
over a plain ``ConnectionPool``, the limiter therefore sends its scripts over a connection of
its own per thread (and per process: a forked child opens its own), made with the pool's own
connection settings (host, credentials, TLS, timeouts, RESP version, decoding).

Nothing else changes: the reply is the one ``client.evalsha`` would return, and a connection
that fails is dropped and the call goes through the client instead, with redis-py's own retries
(so a restarted Redis costs nothing but that one slower call). Other clients (``RedisCluster``,
a Sentinel master, client-side caching, a single-connection client, subclasses that instrument
``execute_command``) always take the client's path, as does ``Limiter(..., direct=False)``.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import redis

__all__ = ["Lane", "lane_for"]


class Lane:
    """Per-thread connections with a client's settings (see the module docstring)."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._cls = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        self._local = threading.local()
        self._frames: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}

    def _connection(self) -> Any:
        local = self._local
        conn = getattr(local, "conn", None)
        pid = os.getpid()
        if conn is None or local.pid != pid:  # after a fork the parent's socket stays its own
            conn = local.conn = self._cls(**self._kwargs)
            local.pid = pid
        return conn

    def evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``EVALSHA sha len(keys) *keys *args``, the reply as redis-py gives it. ``args[0]``
        and ``args[1]`` (a limiter's packed rules and the operation) are the same call after
        call, so their bytes are packed once; the rest is encoded as redis-py encodes it."""
        conn = self._connection()
        encode = conn.encoder.encode
        frame_key = (sha, len(keys), len(args), args[0], args[1])
        frame = self._frames.get(frame_key)
        if frame is None:
            head = b"*%d\r\n" % (3 + len(keys) + len(args)) + _bulk(b"EVALSHA")
            head += _bulk(encode(sha)) + _bulk(encode(len(keys)))
            frame = (head, _bulk(encode(args[0])) + _bulk(encode(args[1])))
            if len(self._frames) < 4096:
                self._frames[frame_key] = frame
        parts = [frame[0]]
        parts += [_bulk(encode(k)) for k in keys]
        parts.append(frame[1])
        parts += [_bulk(encode(a)) for a in args[2:]]
        return self._send(conn, [b"".join(parts)])

    def _send(self, conn: Any, packed: list[bytes]) -> Any:
        """A Redis error reply is raised as redis-py raises it; any other failure drops the
        connection (the next call opens a new one)."""
        try:
            conn.send_packed_command(packed, check_health=False)
            return conn.read_response()
        except redis.ResponseError:
            raise  # a whole reply was read: the connection is in step
        except BaseException:
            self._local.conn = None
            conn.disconnect()
            raise


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


_lanes: weakref.WeakKeyDictionary[Any, Lane] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def lane_for(client: Any) -> Lane | None:
    """The client's lane, or None when the client must be used as it is."""
    if type(client) is not redis.Redis or client.connection is not None:
        return None
    pool = client.connection_pool
    if type(pool) is not redis.ConnectionPool or getattr(pool, "cache", None) is not None:
        return None
    lane = _lanes.get(client)
    if lane is None:
        with _lock:
            lane = _lanes.get(client)
            if lane is None:
                lane = _lanes[client] = Lane(pool)
    return lane
