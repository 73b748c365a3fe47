"""How several limits give one answer (governor.celery.decide), on a real Redis."""

from __future__ import annotations

import redis

from governor import Limiter
from governor.celery.decide import reserve_all
from governor.celery.limits import LimitSpec
from governor.celery.settings import LimitConfig
from governor.rules import parse_rules


def test_a_booking_is_named_after_the_limit_that_denies(r: redis.Redis, prefix: str) -> None:
    """Several limits book one common slot; the one that merely admits at that slot (booked
    there only to start with the others) has no rule and is never the one named."""

    def limit(name: str, rules: str) -> tuple[Limiter, LimitSpec]:
        lim = Limiter(r, rules, name=name, prefix=prefix)
        return lim, LimitSpec("queue", name, LimitConfig(parse_rules(rules), "sliding_log"), "q")

    roomy, tight = limit("roomy", "3/s"), limit("tight", "1/s")
    assert tight[0].acquire("q").allowed
    outcome = reserve_all([roomy, tight], 1, tolerance=0.025)  # roomy first: it admits now
    assert not outcome.allowed and outcome.slots is not None and len(outcome.slots) == 2
    assert outcome.spec is tight[1]
    assert outcome.decision is not None and str(outcome.decision.rule) == "1/s"
    assert 0.9 < outcome.delay <= 1.001  # stamps round up to the ms: up to 1 ms more
