"""The asyncio limiter runs the same scripts and gives the same answers as the sync one."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from governor import Limiter, StateError, aio

# the versions matrix (noxfile.py) runs this file: the redis.asyncio client path
pytestmark = pytest.mark.compat

ALL = ["sliding_log", "gcra", "token_bucket", "fixed_window", "sliding_window"]
T0 = 1_700_000_000.0


@pytest.mark.parametrize("algorithm", ALL)
def test_same_answers_as_sync(redis_server: object, prefix: str, algorithm: str) -> None:
    url = redis_server.url(0)  # type: ignore[attr-defined]
    sync = Limiter(
        redis.Redis.from_url(url), "3/s, 5/m", algorithm=algorithm, name="s", prefix=prefix
    )

    async def run() -> None:
        client = aioredis.Redis.from_url(url)
        lim = aio.Limiter(client, "3/s, 5/m", algorithm=algorithm, name="a", prefix=prefix)
        for step in range(12):
            now = T0 + step * 0.3
            cost = 1 + step % 2
            assert await lim.acquire("x", cost, now=now) == sync.acquire("x", cost, now=now)
            assert await lim.peek("x", now=now) == sync.peek("x", now=now)
            b1 = await lim.reserve("x", now=now, tolerance=0.01)
            b2 = sync.reserve("x", now=now, tolerance=0.01)
            assert b1 == b2
            if b1.slot and b2.slot:
                later = b1.slot.start
                assert await lim.claim("x", b1.slot, now=later) == sync.claim(
                    "x", b2.slot, now=later
                )
        assert (await lim.usage("x", now=T0 + 4)).rules == sync.usage("x", now=T0 + 4).rules
        await lim.block("x", 10, "why", now=T0)
        assert (await lim.acquire("x", now=T0 + 5)).blocked == "why"
        assert await lim.unblock("x") is True
        assert [s async for s in lim.subjects()] == ["x"]
        d = await lim.acquire("y", now=T0)
        await lim.refund("y", d, now=T0)
        await lim.reset("x")
        assert (await lim.usage("x", now=T0 + 4)).rules[0].used == 0
        await client.set(lim.keys("z")[1], "not:a:number:x")
        await client.delete(lim.keys("z")[1])
        await client.rpush(lim.keys("z")[1], "x")
        with pytest.raises(StateError):
            await lim.acquire("z")
        await client.aclose()

    asyncio.run(run())
