"""A lean lane to Redis for decisions: connections of its own, each command sent packed.

redis-py runs every command through its full machinery: a retry wrapper, a pool borrow that
polls the socket, client-side-cache and observability hooks. On the CI machine that is about
30-50 µs a call, more than a governor script takes inside Redis. For a plain ``redis.Redis``
over a plain ``ConnectionPool``, the limiter therefore sends its scripts over connections of
its own, made with the pool's connection settings (host, credentials, TLS, timeouts, RESP
version, decoding) and kept in a free list per pool: a call takes one, uses it alone (threads,
greenlets) and puts it back; a forked child starts its own.

The reply is the one ``client.evalsha`` would return, read straight off the socket (a
decision's reply is one short string, parsed in a few steps; errors map to redis-py's own
exceptions). A connection is checked before each use
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

import contextlib
import logging
import os
import select
import sys
import time
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis

from .pids import pid

__all__ = ["Lane", "NotSent", "lane_for"]

logger = logging.getLogger("governor")
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
        if self._pid != pid():  # forked: the parent's sockets stay the parent's
            self._idle, self._pid = deque(), pid()
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
        encoder = conn.encoder
        encode = encoder.encode
        frame_key = (sha, len(keys), len(args), type(args[0]), args[0], type(args[1]), args[1])
        frame = self._frames.get(frame_key)
        if frame is None:
            head = b"*%d\r\n" % (3 + len(keys) + len(args)) + _bulk(b"EVALSHA")
            head += _bulk(encode(sha)) + _bulk(encode(len(keys)))
            frame = (head, _bulk(encode(args[0])) + _bulk(encode(args[1])))
            if len(self._frames) < 4096:
                self._frames[frame_key] = frame
        # redis-py's encoding (str in the connection's encoding, int in decimal), done inline
        charset, errors = encoder.encoding, encoder.encoding_errors
        parts = [frame[0]]
        for key in keys:
            data = key.encode(charset, errors) if type(key) is str else encode(key)
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        parts.append(frame[1])
        for arg in args[2:]:
            kind = type(arg)
            if kind is int:
                data = b"%d" % arg
            elif kind is str:
                data = arg.encode(charset, errors)
            else:
                data = encode(arg)
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        try:
            sock = conn._sock
            if sock is None:
                conn.connect()
                sock = conn._sock
            sock.sendall(b"".join(parts))
        except Exception as exc:
            conn.disconnect()
            self.rest_until = time.monotonic() + REST
            raise NotSent(str(exc)) from exc
        except BaseException:
            conn.disconnect()
            raise
        try:
            reply = _Reply(conn, sock).read()
        except redis.ResponseError:
            self._idle.append(conn)  # a whole reply was read: in step
            raise
        except BaseException:
            conn.disconnect()  # sent, perhaps run: never reused half-read, never re-sent
            raise
        self._idle.append(conn)
        return reply


class _Reply:
    """Reads one RESP reply straight from the socket, as redis-py would return it.

    A decision's reply is one short bulk string that arrives in one ``recv``: that case is
    parsed in a few steps. Scripts reply only with bulk and simple strings, integers, nulls,
    arrays of those, and errors; a RESP3 push message before the reply goes to redis-py's
    handlers, as its own parser does; anything else is a protocol error (the connection is
    out of step: a ConnectionError, and the connection is dropped).
    """

    __slots__ = ("buf", "conn", "pos", "sock")

    def __init__(self, conn: Any, sock: Any) -> None:
        self.conn, self.sock, self.buf, self.pos = conn, sock, b"", 0

    def read(self) -> Any:
        self._fill()
        buf = self.buf
        if buf[:1] == b"$":  # the usual decision reply: "$<n>\r\n<data>\r\n", all here
            end = buf.find(b"\r\n")
            if end > 1 and buf[1:end].isdigit():
                size = int(buf[1:end])
                if len(buf) == end + size + 4:
                    return self._text(buf[end + 2 : end + 2 + size])
        try:
            value = self._value()
            while isinstance(value, _Push):  # RESP3 out-of-band message: the reply follows
                value = self._value()
        except ValueError as exc:  # a length that is not a number: out of step
            raise redis.ConnectionError(f"Protocol error in a script reply: {exc}") from exc
        if isinstance(value, Exception):  # an error reply (LOADING and the like are
            raise value  # ConnectionErrors in redis-py, as its own parser raises them)
        return value

    def _fill(self) -> None:
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError as exc:  # socket.timeout
            raise redis.TimeoutError("Timeout reading from socket") from exc
        except OSError as exc:
            raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
        if not chunk:
            raise redis.ConnectionError("Connection closed by server.")
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n", self.pos)) < 0:
            self._fill()
        line = self.buf[self.pos : end]
        self.pos = end + 2
        return line

    def _value(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self.buf) - self.pos < size + 2:
                self._fill()
            data = self.buf[self.pos : self.pos + size]
            self.pos += size + 2
            return self._text(data)
        if kind == b":":
            return int(rest)
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._value() for _ in range(size)]
        if kind == b"+":
            return self._text(rest)
        if kind == b"_":
            return None
        if kind == b"-":  # redis-py's own mapping (NOSCRIPT, READONLY, WRONGTYPE, ...)
            text = rest.decode("utf-8", "replace")
            parse = getattr(self.conn._parser, "parse_error", None)
            return parse(text) if parse is not None else redis.ResponseError(text)
        if kind == b">":  # a push (RESP3: maintenance or invalidation notices), as redis-py
            push = [self._value() for _ in range(int(rest))]  # hands it to its handlers
            handle = getattr(self.conn._parser, "handle_push_response", None)
            if handle is not None:
                try:
                    handle(push)
                except Exception as exc:  # a notice must never cost a decision its reply
                    logger.debug("governor: a push message's handler failed: %r", exc)
            return _Push()
        raise redis.ConnectionError(f"Protocol error in a script reply: {line[:80]!r}")

    def _text(self, data: bytes) -> Any:
        encoder = self.conn.encoder
        return encoder.decode(data) if encoder.decode_responses else data


class _Push:
    """Marks a push message read in place of a reply."""

    __slots__ = ()


def _readable(conn: Any) -> bool:
    """Whether an idle connection has something to read (one ``poll``; redis-py's
    ``can_read`` takes four times as long)."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return False
    try:
        poll = _os_poll()
        if poll is None:
            return bool(conn.can_read(timeout=0))
        poller = poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except Exception:
        return True


_polls: list[Any] = []


def _os_poll() -> Any:
    """The operating system's ``select.poll`` (None without it), also under gevent or eventlet:
    a check that does not wait needs no event loop, and theirs cost many times more."""
    if not _polls:
        poll = getattr(select, "poll", None)
        with contextlib.suppress(Exception):
            if "gevent.monkey" in sys.modules:
                poll = sys.modules["gevent.monkey"].get_original("select", "poll")
            elif "eventlet.patcher" in sys.modules:
                poll = sys.modules["eventlet.patcher"].original("select").poll
        _polls.append(poll)
    return _polls[0]


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
