"""A full concurrency cap denies a claim (suspicion settled): every booking the call carries goes
back, those of the limits after the capped one too. They were left booked, and their room
stayed spent for calls that never came (the call waits in the cap's line without them)."""

from __future__ import annotations

import time

import pytest
import redis

from governor import Limiter
from governor.celery.decisions.rounds import claim_all
from governor.celery.types import LimitConfig, LimitSpec, Who
from governor.rules import parse_rules


def _limit(
    r: redis.Redis, prefix: str, name: str, concurrency: int | None = None
) -> tuple[Limiter, LimitSpec]:
    lim = Limiter(r, "10/s", name=name, prefix=prefix, concurrency=concurrency)
    config = LimitConfig(parse_rules("10/s"), "sliding_log", concurrency)
    return lim, LimitSpec("queue", name, config, "q")


@pytest.mark.parametrize("capped_first", [True, False])
def test_a_full_cap_gives_back_every_booking(
    r: redis.Redis, prefix: str, capped_first: bool
) -> None:
    capped, other = _limit(r, prefix, "capped", 1), _limit(r, prefix, "other")
    limiters = [capped, other] if capped_first else [other, capped]
    # bookings whose slot holds the present: made ten seconds ago, an hour's tolerance
    now = time.time()
    slots = {}
    for lim, _spec in limiters:
        d = lim.reserve("q", now=now - 10, not_before=now - 5, tolerance=3600)
        assert d.slot is not None
        slots[lim.keys("q")[0]] = [d.slot.start_us, d.slot.end_us]
    assert capped[0].acquire("q", holder="someone-else").allowed  # the cap is full
    assert capped[0].usage("q").booked == 1 and other[0].usage("q").booked == 1
    outcome = claim_all(limiters, 1, slots, 0.025, 0.0, Who("me", "t", ""))
    assert outcome is not None and not outcome.allowed
    assert outcome.decision is not None and outcome.decision.capped is not None
    assert capped[0].usage("q").booked == 0  # the capped limit's own (in its call)
    assert other[0].usage("q").booked == 0  # and the other's, before or after it
