"""A lean lane to Redis for decisions: connections of its own, each command sent packed.

redis-py runs every command through its full machinery: a retry wrapper, a pool borrow that
polls the socket, client-side-cache and observability hooks. On the CI machine that is about
45 µs a call, twice what a governor script takes inside Redis. For a plain ``redis.Redis``
over a plain ``ConnectionPool``, the limiter therefore sends its scripts over connections of
its own, made with the pool's connection settings (host, credentials, TLS, timeouts, RESP
version, decoding) and kept in a free list per pool: a call takes one, uses it alone (threads,
greenlets) and puts it back; a forked child starts its own.

The reply is the one ``client.evalsha`` would return. A connection is checked before each use
(one ``poll``: a server that restarted or dropped it left it closed). If connecting or sending
fails, nothing ran: the call goes through the client instead (with redis-py's own retries) and
the lane rests for a few seconds, so an outage is not waited out twice. If reading the reply
fails, the script may have run, so it is not sent again: the error is raised
(``StorageUnavailable`` from the limiter).

Other clients (``RedisCluster``, a Sentinel master, ``BlockingConnectionPool``, client-side
caching, a single-connection client, subclasses that may instrument ``execute_command``) take
the client's path, as does ``Limiter(..., direct=False)``; use that too to keep a tracer that
patches ``redis.Redis.execute_command`` seeing the calls. Lane connections are not counted in the
pool's ``max_connections``, and the pool's ``health_check_interval`` does not apply to them.
"""

from __future__ import annotations

import os
import select
import time
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis

__all__ = ["Lane", "NotSent", "lane_for"]

REST = 5.0
"""After a failed connect or send, the lane is skipped for this long (seconds)."""


class NotSent(Exception):
    """Connecting or sending failed: Redis never saw the command (``__cause__`` says why)."""


class Lane:
    """Connections with a pool's settings, in a free list (see the module docstring)."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._cls = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        self._idle: deque[Any] = deque()
        self._pid = os.getpid()
        self._frames: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
        self.rest_until = 0.0
        """Monotonic time until which callers should use the client instead."""

    def _take(self) -> Any:
        if self._pid != os.getpid():  # forked: the parent's sockets stay the parent's
            self._idle, self._pid = deque(), os.getpid()
        try:
            conn = self._idle.pop()
        except IndexError:
            return self._cls(**self._kwargs)
        if _readable(conn):  # EOF (closed by the server) or stray bytes: not fit to use
            conn.disconnect()  # the send below connects afresh
        return conn

    def evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``EVALSHA sha len(keys) *keys *args``, the reply as redis-py gives it; NotSent if
        Redis never got it. ``args[0]`` and ``args[1]`` (a limiter's packed rules and the
        operation) are the same call after call, so their bytes are packed once."""
        conn = self._take()
        encode = conn.encoder.encode
        frame_key = (sha, len(keys), len(args), type(args[0]), args[0], type(args[1]), args[1])
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
        try:
            conn.send_packed_command([b"".join(parts)], check_health=False)
        except Exception as exc:
            conn.disconnect()
            self.rest_until = time.monotonic() + REST
            raise NotSent(str(exc)) from exc
        except BaseException:
            conn.disconnect()
            raise
        try:
            reply = conn.read_response()
        except redis.ResponseError:
            self._idle.append(conn)  # a whole reply was read: in step
            raise
        except BaseException:
            conn.disconnect()  # sent, perhaps run: never reused half-read, never re-sent
            raise
        self._idle.append(conn)
        return reply


def _readable(conn: Any) -> bool:
    """Whether an idle connection has something to read (one ``poll``; redis-py's
    ``can_read`` takes four times as long)."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return False
    try:
        if _poll is None:
            return bool(conn.can_read(timeout=0))
        poller = _poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except Exception:
        return True


_poll = getattr(select, "poll", None)


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


_lanes: weakref.WeakKeyDictionary[Any, Lane] = weakref.WeakKeyDictionary()


def lane_for(client: Any) -> Lane | None:
    """The lane of the client's pool, or None when the client must be used as it is."""
    if type(client) is not redis.Redis or client.connection is not None:
        return None
    pool = client.connection_pool
    if type(pool) is not redis.ConnectionPool or getattr(pool, "cache", None) is not None:
        return None
    lane = _lanes.get(pool)
    if lane is None:
        lane = _lanes.setdefault(pool, Lane(pool))
    return lane
