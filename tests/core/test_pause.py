"""Limiter.pause on a real Redis with an explicit clock: timed pauses that only grow, capped
exponential pauses that a quiet subject forgets, bookings behind a pause, the asyncio twin."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from governor import ConfigError, Limiter
from governor.aio import Limiter as AioLimiter
from support.servers import ServerHandle

T = 1_000_000.0


@pytest.mark.parametrize("algorithm", ["sliding_log", "gcra", "token_bucket", "fixed_window"])
def test_a_pause_denies_until_its_end(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = Limiter(r, "5/s", algorithm=algorithm, name="api", prefix=prefix)
    p = lim.pause("c", 3, "HTTP 429", now=T)
    assert (p.until, p.now, p.level, p.seconds) == (T + 3, T, 0, 3.0)
    d = lim.acquire("c", now=T + 1)
    assert not d.allowed and d.blocked == "HTTP 429" and d.retry_after == pytest.approx(2.0)
    assert lim.acquire("c", now=T + 3).allowed
    assert lim.acquire("other", now=T + 1).allowed  # one subject only


def test_a_pause_only_grows(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "5/s", name="api", prefix=prefix)
    lim.block("c", 60, "by hand", now=T)
    p = lim.pause("c", 5, "HTTP 429", now=T)
    assert p.until == T + 60  # the longer block stays, and its reason
    assert lim.acquire("c", now=T + 10).blocked == "by hand"
    assert lim.pause("c", 100, "HTTP 503", now=T + 10).until == T + 110
    assert lim.acquire("c", now=T + 70).blocked == "HTTP 503"


def test_exponential_pauses_double_up_to_the_cap_and_are_forgotten(
    r: redis.Redis, prefix: str
) -> None:
    lim = Limiter(r, "5/s", name="api", prefix=prefix)
    pauses = [lim.pause("c", None, now=T, base=0.5, max_pause=3).seconds for _ in range(5)]
    assert pauses == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [lim.pause("c", None, now=T, base=0.5, max_pause=3).level for _ in range(2)] == [6, 7]
    # the level lives twice the last pause (plus a minute under a caller's clock, which
    # Redis expiry cannot follow); once it has expired, the subject starts again at the base
    level_key = lim.keys("c")[1][: -len("block")] + "bo"
    assert 6_000 < r.pttl(level_key) <= 66_000
    r.delete(level_key)
    assert lim.pause("c", None, now=T, base=0.5, max_pause=3).level == 1


def test_bookings_go_behind_a_pause(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "1/s", name="api", prefix=prefix)
    booked = lim.reserve("c", now=T, not_before=T + 2)  # booked at T + 2
    assert booked.slot is not None and booked.slot.start == T + 2
    lim.pause("c", 5, "HTTP 429", now=T + 1)
    inside = lim.reserve("c", now=T + 1, not_before=T + 4)
    assert inside.blocked == "HTTP 429" and inside.slot is None  # cannot start inside it
    behind = lim.reserve("c", now=T + 1, not_before=T + 6)
    assert behind.slot is not None and behind.slot.start == T + 6 and behind.blocked is None
    # the booking made before the pause comes to claim inside it: given back, told to wait
    claim = lim.claim("c", booked.slot, now=T + 2)
    assert not claim.allowed and claim.blocked == "HTTP 429" and claim.retry_after == 4.0
    after = lim.reserve("c", now=T + 6)
    assert after.slot is not None and after.slot.start == T + 7  # behind the paused task's


def test_bad_pauses_are_refused(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "5/s", name="api", prefix=prefix)
    for seconds in (0, -1, float("nan"), float("inf"), "5"):
        with pytest.raises(ConfigError):
            lim.pause("c", seconds)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        lim.pause("c", None, base=10, max_pause=1)
    with pytest.raises(ConfigError):
        lim.pause("c", 1, reason=5)  # type: ignore[arg-type]
    long = lim.pause("c", 1, "x" * 10_000, now=T)
    assert long.until == T + 1
    assert len(lim.usage("c", now=T).blocked or "") == 500  # the reason is cut


def test_the_asyncio_twin(redis_server: ServerHandle, prefix: str) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server.url(0))
        try:
            lim = AioLimiter(client, "5/s", name="api", prefix=prefix)
            p = await lim.pause("c", 2, "HTTP 429", now=T)
            assert p.until == T + 2
            assert (await lim.acquire("c", now=T + 1)).blocked == "HTTP 429"
            assert (await lim.pause("c", None, now=T, base=1, max_pause=9)).level == 1
        finally:
            await client.aclose()

    asyncio.run(main())
