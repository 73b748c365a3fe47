"""An adaptive limit learns the burst with the rate (finding 13), on a real Redis.

Under 10 units a factor used to stretch the period and keep the count: ``10/s`` at 0.5 became
``10/2s``, ten calls at once against an upstream that takes 5 a second. The count now scales.
Two more things kept an adaptive limit off an upstream's quota: the climb back met a refusal
every few seconds (it now holds below where the upstream refused, as CUBIC does), and calls
booked at the old rate all still ran after a decrease (they are now paced at the rate now).
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from governor import Limiter
from governor.celery.config.factors import HOLD_AT, Factor, read_factors, scale_rules
from governor.celery.config.limit_config import limit_config
from governor.celery.config.live import LiveView
from governor.celery.config.settings import Settings, load_settings
from governor.celery.config.store import Store
from governor.celery.decisions.decider import Decider
from governor.celery.feedback.adaptive import decrease
from governor.celery.types import LimitSpec, WaitState
from governor.rules import Rule, parse_rules
from support.servers import ServerHandle

T = 1_700_000_000.0  # explicit clock (Unix seconds)


@pytest.mark.parametrize(
    ("rules", "factor", "algorithm", "expected"),
    [
        ("10/s", 0.5, "sliding_log", "5/s"),  # was 10/2s: the whole burst at once
        ("10/s", 0.59, "sliding_log", "5/s"),  # a whole number of units, rounded down
        ("10/s", 0.3, "gcra", "3/s"),
        ("5/s", 0.5, "sliding_log", "2/s"),
        ("10/s", 0.05, "sliding_log", "1/2s"),  # under one unit: one over a longer period
        ("3/s", 0.1, "gcra", "1/3334ms"),
        ("10/s", 0.05, "fixed_window", "1/s"),  # counts per period: one unit per period
        ("10/s", 0.05, "token_bucket", "1/s"),
        ("100/s, 10/m", 0.5, "sliding_window", "50/s, 5/m"),
        ("1/200d", 0.05, "sliding_log", "1/366d"),  # never past the longest period
    ],
)
def test_a_factor_scales_the_count(
    rules: str, factor: float, algorithm: str, expected: str
) -> None:
    assert scale_rules(parse_rules(rules), factor, algorithm) == parse_rules(expected)


@pytest.mark.parametrize("algorithm", ["sliding_log", "gcra"])
def test_a_learned_rate_has_a_learned_burst(r: redis.Redis, prefix: str, algorithm: str) -> None:
    """``10/s`` at 0.5 against an upstream taking 5 a second: 5 at once, not 10."""
    rules = scale_rules(parse_rules("10/s"), 0.5, algorithm)
    lim = Limiter(r, rules, algorithm=algorithm, name="api", prefix=prefix)
    admitted = [t for t in (T + i / 100 for i in range(300)) if lim.acquire("s", now=t).allowed]
    assert sum(1 for t in admitted if t < T + 0.1) == 5  # 10/2s let 10 in the first 0.1 s
    if algorithm == "sliding_log":  # and at most 5 in any second
        assert all(b - a >= 1.0 - 1e-9 for a, b in zip(admitted, admitted[5:]))


def test_the_climb_holds_below_where_the_upstream_refused() -> None:
    # refused at 0.6, lowered to 0.42: climbs 0.02 a second to 0.54, holds 30 s, climbs on
    f = Factor(0.42, 1000.0, refused=0.6)
    assert f.at(1000.0, 0.02, 30) == pytest.approx(0.42)
    assert f.at(1003.0, 0.02, 30) == pytest.approx(0.48)
    assert f.at(1006.0, 0.02, 30) == pytest.approx(HOLD_AT * 0.6)
    assert f.at(1030.0, 0.02, 30) == pytest.approx(0.54)
    assert f.at(1036.0, 0.02, 30) == pytest.approx(0.54)
    assert f.at(1039.0, 0.02, 30) == pytest.approx(0.60)
    assert f.at(2000.0, 0.02, 30) == 1.0
    assert Factor(0.42, 1000.0).at(1009.0, 0.02, 30) == pytest.approx(0.60)  # none refused
    assert Factor(0.42, 1000.0, 0.6).at(1009.0, 0.02, 0) == pytest.approx(0.60)  # no hold
    held = Factor(0.7, 1000.0, refused=0.75)  # already above the hold: stays, then climbs
    assert held.at(1020.0, 0.02, 30) == pytest.approx(0.7)
    assert held.at(1035.0, 0.02, 30) == pytest.approx(0.8)


def test_a_decrease_remembers_where_the_upstream_refused(r: redis.Redis, prefix: str) -> None:
    settings = Settings(redis_url=None, prefix=prefix, adaptive_hold=30.0)
    key = f"{prefix}:{{live}}:adaptive"
    assert decrease(r, settings, "queue:q", gap=30) == (pytest.approx(0.7), True)
    first = read_factors(r, prefix)["queue:q"]
    assert first.refused == 1.0 and first.value == pytest.approx(0.7)
    # lowered to 0.42 ten seconds ago after a refusal at 0.6: now held at 0.54, where a lone
    # refusal (the quota's edge met a few ms early) pauses but keeps the rate
    ago = round((time.time() - 10) * 1e6)
    r.hset(key, "queue:q", f"0.42:{ago}:0.6")
    factor, changed = decrease(r, settings, "queue:q", gap=1)
    assert not changed and factor == pytest.approx(HOLD_AT * 0.6, abs=1e-3)
    assert read_factors(r, prefix)["queue:q"] == Factor(0.42, ago / 1e6, 0.6)
    # a second one within CONFIRM pauses lowers it, from where adapt.lua and Factor.at agree
    r.hset(key, "queue:q", f"0.42:{ago}:0.6:{round((time.time() - 2) * 1e6)}")
    factor, changed = decrease(r, settings, "queue:q", gap=1)
    assert changed and factor == pytest.approx(0.7 * HOLD_AT * 0.6, abs=1e-3)
    assert read_factors(r, prefix)["queue:q"].refused == pytest.approx(0.54, abs=1e-3)
    # above the hold (probing higher), one refusal is enough
    r.hset(key, "queue:q", f"0.42:{round((time.time() - 100) * 1e6)}:0.6")
    assert decrease(r, settings, "queue:q", gap=1)[1]
    # older stored forms still read
    r.hset(key, "queue:old", "0.5:1000000000")
    assert read_factors(r, prefix)["queue:old"] == Factor(0.5, 1000.0, 0.0)


def _adaptive(redis_server: ServerHandle, prefix: str) -> tuple[Decider, LiveView, LimitSpec]:
    settings = load_settings({"governor_redis_url": redis_server.url(0), "governor_prefix": prefix})
    store = Store(settings)
    live = LiveView(lambda: store.client, settings)
    config = limit_config({"rules": "10/h", "adaptive": True}, "sliding_log", "x")
    spec = LimitSpec("queue", "queue", config, f"q{uuid.uuid4().hex[:6]}")
    return Decider(settings, store, live=live), live, spec


def _book(decider: Decider, spec: LimitSpec, count: int) -> list[WaitState]:
    """``count`` bookings whose slots hold the present: made an hour ago (spaced 6 minutes
    apart under 10/h), each with two hours of tolerance."""
    lim = decider.store.limiter(spec.name, spec.config)
    at = time.time() - 3610
    states = []
    for _ in range(count):
        d = lim.reserve(spec.subject, now=at, not_before=at + 1, tolerance=7200)
        assert d.slot is not None and d.slot.start < time.time() < d.slot.end
        slots = {lim.keys(spec.subject)[0]: [d.slot.start_us, d.slot.end_us]}
        states.append(WaitState(waits=1, since=at, slots=slots, booked=at))
    return states


def test_bookings_made_before_a_decrease_are_paced_at_the_rate_now(
    r: redis.Redis, redis_server: ServerHandle, prefix: str
) -> None:
    decider, live, spec = _adaptive(redis_server, prefix)
    states = _book(decider, spec, 10)  # booked at the first guess
    assert decrease(r, decider.settings, spec.label, gap=1)[1]  # 10/h is now 7/h
    (now,) = live.apply([spec])
    assert now.config.rules == (Rule(7, 3600),) and now.config.ceiling == spec.config.rules
    # one of them booked after the decrease (at the rate now): not paced
    states[0].booked = read_factors(r, prefix)[spec.label].since + 0.001
    assert decider.decide([now], 1, states[0]).allowed
    outcomes = [decider.decide([now], 1, state) for state in states[1:]]
    assert sum(o.allowed for o in outcomes) == 7  # the rate now: not the nine promised
    assert all(o.slots and o.delay > 3000 for o in outcomes if not o.allowed)  # booked again


def test_without_a_decrease_nothing_is_paced(
    r: redis.Redis, redis_server: ServerHandle, prefix: str
) -> None:
    decider, live, spec = _adaptive(redis_server, prefix)
    states = _book(decider, spec, 10)
    assert all(decider.decide(live.apply([spec]), 1, state).allowed for state in states)
    assert not r.keys(f"{prefix}:pace:*")  # no extra call, no pace kept
