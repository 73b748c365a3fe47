"""The lean lane to Redis (governor.direct) against real servers: same answers, threads, forks,
restarts, and the clients that must keep the client's own path."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from governor import Limiter, StorageUnavailable
from governor.direct import lane_for
from governor.embedded import EmbeddedRedis
from support.servers import ServerHandle

# the versions matrix (noxfile.py) runs this file: the direct lane reads redis-py internals
pytestmark = pytest.mark.compat

T0 = 1_700_000_000.0


def test_a_plain_client_takes_the_lane_and_gets_the_same_answers(
    r: redis.Redis, prefix: str
) -> None:
    lean = Limiter(r, "3/s, 5/m", name="lean", prefix=prefix)
    plain = Limiter(r, "3/s, 5/m", name="plain", prefix=prefix, direct=False)
    assert lean._lane() is not None and plain._lane() is None
    for i in range(12):
        now = T0 + 0.25 * i
        a, b = lean.acquire("s", now=now), plain.acquire("s", now=now)
        assert (a.allowed, a.retry_after, a.remaining, a.rule) == (
            b.allowed,
            b.retry_after,
            b.remaining,
            b.rule,
        )
    assert lean.usage("s", now=T0 + 3).rules == plain.usage("s", now=T0 + 3).rules


def test_clients_that_keep_their_own_path(redis_server: ServerHandle) -> None:
    url = redis_server.url()

    class Traced(redis.Redis):
        pass

    assert lane_for(redis.Redis.from_url(url)) is not None
    assert lane_for(redis.Redis.from_url(url, single_connection_client=True)) is None
    assert lane_for(Traced.from_url(url)) is None  # it may instrument execute_command
    blocking = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url))
    assert lane_for(blocking) is None
    lim = Limiter(redis.Redis.from_url(url, single_connection_client=True), "1/s", name="x")
    assert lim.acquire("s", now=T0).allowed and not lim.acquire("s", now=T0).allowed


def test_decoded_replies(redis_server: ServerHandle, prefix: str) -> None:
    client = redis.Redis.from_url(redis_server.url(), decode_responses=True)
    lim = Limiter(client, "2/s", name="decoded", prefix=prefix)
    assert lim._lane() is not None
    assert [lim.acquire("s", now=T0).allowed for _ in range(3)] == [True, True, False]
    lim.block("s", 10, "why not", now=T0)
    assert lim.peek("s", now=T0).blocked == "why not"


@pytest.mark.parametrize("charset", ["utf-8", "latin-1"])
def test_keys_are_encoded_as_the_client_would(
    redis_server: ServerHandle, prefix: str, charset: str
) -> None:
    client = redis.Redis.from_url(redis_server.url(), encoding=charset)
    lean = Limiter(client, "2/s", name="enc", prefix=prefix)
    plain = Limiter(client, "2/s", name="enc", prefix=prefix, direct=False)
    assert lean._lane() is not None
    subject = "Kunde-\u00df"  # one key name, two byte forms
    assert lean.acquire(subject, now=T0).allowed
    assert plain.acquire(subject, now=T0).allowed  # the same key: the limit is reached
    assert not lean.acquire(subject, now=T0).allowed
    assert client.exists(lean.keys(subject)[0]) == 1


def test_threads_each_get_a_connection_and_the_limit_holds(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "500/m", name="threads", prefix=prefix)
    admitted: list[int] = []

    def hammer() -> None:
        admitted.append(sum(lim.acquire("s", now=T0).allowed for _ in range(200)))

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 500  # 1,600 tries at one instant: exactly the limit


def _child(lim: Limiter, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    out.put([lim.acquire("s", now=T0).allowed for _ in range(3)])


def test_a_forked_child_opens_its_own_connection(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "4/s", name="forked", prefix=prefix)
    assert lim.acquire("s", now=T0).allowed  # the parent's connection exists before the fork
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(lim, out))
    child.start()
    seen = out.get(timeout=20)
    child.join(timeout=20)
    assert seen == [True, True, True]
    assert not lim.acquire("s", now=T0).allowed  # and the parent's still answers, in step


@pytest.fixture
def own_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    try:
        yield server
    finally:
        server.close()


def test_a_restarted_redis_costs_one_slower_call(own_server: EmbeddedRedis) -> None:
    """The lane's connection dies with the server; the call goes through the client (which
    reconnects) and the next one opens a new lane connection."""
    lim = Limiter(redis.Redis.from_url(own_server.url()), "5/s", name="restart")
    assert lim.acquire("s", now=T0).allowed
    own_server.stop()
    own_server.start()
    assert lim.acquire("s", now=T0).allowed  # state was not kept: a fresh server
    assert lim.usage("s", now=T0).rules[0].used == 1


def test_clients_sharing_a_pool_share_a_lane(redis_server: ServerHandle) -> None:
    pool = redis.ConnectionPool.from_url(redis_server.url())
    one, two = redis.Redis(connection_pool=pool), redis.Redis(connection_pool=pool)
    assert lane_for(one) is lane_for(two) is not None


def test_a_sent_decision_is_never_sent_twice(own_server: EmbeddedRedis) -> None:
    """A reply that does not come in time may still come: the script may have run, so the
    limiter raises instead of sending it again (which would count the call twice)."""
    client = redis.Redis.from_url(own_server.url(), socket_timeout=0.3)
    lim = Limiter(client, "5/s", name="once")
    assert lim.acquire("s", now=T0).allowed  # the script is loaded, a lane connection is open
    redis.Redis.from_url(own_server.url()).execute_command("CLIENT", "PAUSE", 1000, "WRITE")
    with pytest.raises(StorageUnavailable):
        lim.acquire("s", now=T0)
    time.sleep(1.2)  # the pause ends: the command died with its connection, none was re-sent
    assert lim.usage("s", now=T0).rules[0].used == 1


def test_the_lane_rests_when_redis_cannot_be_reached() -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from governor.direct import REST
    from governor.embedded import free_port

    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    lim = Limiter(client, "5/s", name="away")
    lane = lim._lane()
    assert lane is not None
    before = time.monotonic()
    with pytest.raises(StorageUnavailable):
        lim.acquire("s")
    assert lane.rest_until >= before + REST  # the next calls take the client's path only


@pytest.mark.parametrize("protocol", [2, 3])
def test_replies_read_off_the_socket_are_the_clients(
    redis_server: ServerHandle, prefix: str, protocol: int
) -> None:
    """The lane reads replies itself: long ones (over several reads), arrays and errors come
    out as the client's own path gives them, on RESP2 and RESP3."""
    from governor.errors import StateError

    client = redis.Redis.from_url(redis_server.url(), protocol=protocol)
    lean = Limiter(client, "3/s, 5/m", name="replies", prefix=prefix)
    plain = Limiter(client, "3/s, 5/m", name="replies", prefix=prefix, direct=False)
    assert lean._lane() is not None
    reason = "maintenance " * 20_000 + "é"  # a 240 kB reply
    lean.block("s", 10, reason, now=T0)
    assert lean.peek("s", now=T0).blocked == plain.peek("s", now=T0).blocked == reason
    lean.acquire("u", now=T0)
    assert lean.usage("u", now=T0) == plain.usage("u", now=T0)
    client.set(lean.keys("wrong")[0], "not a list")
    for lim in (lean, plain):
        with pytest.raises(StateError, match="another type"):
            lim.acquire("wrong", now=T0)
    assert lean.acquire("u", now=T0).allowed  # the lane stayed in step after the error


class _Chunks:
    """A socket's reads, one given chunk per recv (how TCP may split a reply)."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    def recv(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


@pytest.mark.parametrize(
    ("chunks", "reply"),
    [
        ((b"$12\r\nhello world!\r\n",), b"hello world!"),
        ((b"$", b"12\r\nhello", b" world!\r", b"\n"), b"hello world!"),
        ((b"$1", b"2\r\nhello world!\r\n"), b"hello world!"),
        ((b"$-1\r\n",), None),
        ((b"*2\r\n:7\r\n*1\r\n$1\r\nx\r\n",), [7, [b"x"]]),
        # a RESP3 push before the reply goes to redis-py's handlers; the reply follows
        ((b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n", b"$2\r\nok\r\n"), b"ok"),
    ],
)
def test_the_reply_reader_takes_replies_in_any_pieces(
    chunks: tuple[bytes, ...], reply: object
) -> None:
    from governor.direct import _Reply

    conn = redis.Connection(protocol=3)
    assert _Reply(conn, _Chunks(*chunks)).read() == reply


def test_the_reply_reader_is_out_of_step_on_garbage() -> None:
    from governor.direct import _Reply

    conn = redis.Connection()
    for chunks in ((b"$x\r\n",), (b"!3\r\nabc\r\n",), (b"$5\r\nab",)):
        with pytest.raises(redis.ConnectionError):
            _Reply(conn, _Chunks(*chunks)).read()
    with pytest.raises(redis.exceptions.NoScriptError):
        _Reply(conn, _Chunks(b"-NOSCRIPT No matching script.\r\n")).read()
