"""How several limits give one answer (governor.celery.decisions.rounds), on a real Redis."""

from __future__ import annotations

import redis

from governor import Limiter
from governor.celery.decisions.rounds import acquire_all, claim_all, refund, reserve_all
from governor.celery.types import LimitConfig, LimitSpec, Who
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


# -- what a round gives back when it does not admit -------------------------------------------


def _limits(r: redis.Redis, prefix: str, **rules: str) -> list[tuple[Limiter, LimitSpec]]:
    out = []
    for name, text in rules.items():
        lim = Limiter(r, text, name=name, prefix=prefix)
        out.append(
            (lim, LimitSpec("queue", name, LimitConfig(parse_rules(text), "sliding_log"), "q"))
        )
    return out


def _used(lim: Limiter) -> int:
    return lim.usage("q").rules[0].used


def test_acquire_all_gives_back_what_earlier_limits_took(r: redis.Redis, prefix: str) -> None:
    """A later limit denies: the units the earlier limits admitted go back, and the call is told
    the longest wait of the limits from the denying one on (the rest are only peeked)."""
    a, b, c = _limits(r, prefix, a="5/h", b="1/s", c="1/h")
    assert b[0].acquire("q").allowed and c[0].acquire("q").allowed
    outcome = acquire_all([a, b, c], 1)
    assert not outcome.allowed and outcome.held == []
    assert _used(a[0]) == 0  # given back
    assert outcome.spec is c[1] and outcome.delay > 3000  # c's hour, not b's second
    assert _used(c[0]) == 1  # c was only peeked


def test_acquire_all_gives_back_what_a_full_cap_denies(r: redis.Redis, prefix: str) -> None:
    """A full concurrency cap denies like a block: the rules' units go back, no one else's slot
    is touched, and the outcome names the cap."""
    (a,) = _limits(r, prefix, a="5/h")
    cap = Limiter(r, None, concurrency=1, name="cap", prefix=prefix)
    cap_spec = LimitSpec("key", "cap", LimitConfig((), "sliding_log", concurrency=1), "q")
    held = cap.acquire("q", holder="someone:0", token="t0")
    assert held.allowed
    outcome = acquire_all([a, (cap, cap_spec)], 1, Who("me:0", "t1", "test"))
    assert not outcome.allowed and outcome.decision is not None
    assert outcome.decision.capped == "full" and outcome.spec is cap_spec
    assert _used(a[0]) == 0
    assert [h.holder for h in cap.holders("q").holders] == ["someone:0"]


def test_reserve_all_keeps_one_booking_per_limit_when_the_target_moves(
    r: redis.Redis, prefix: str
) -> None:
    """The first limit books the earliest moment it admits; a later limit can only admit later:
    the first booking goes back and both book that later moment, once each."""
    early, late = _limits(r, prefix, early="1/s", late="1/h")
    assert early[0].acquire("q").allowed and late[0].acquire("q").allowed
    outcome = reserve_all([early, late], 1, tolerance=0.025)
    assert not outcome.allowed and outcome.slots is not None
    assert len(set(map(tuple, outcome.slots.values()))) == 1  # one common moment
    assert outcome.delay > 3000
    # one booking each: the first limit's earlier booking went back when the target moved
    assert early[0].usage("q").booked == 1 and late[0].usage("q").booked == 1


def test_reserve_all_gives_back_bookings_when_a_cap_is_full(r: redis.Redis, prefix: str) -> None:
    (a,) = _limits(r, prefix, a="1/s")
    cap = Limiter(r, None, concurrency=1, name="cap", prefix=prefix)
    cap_spec = LimitSpec("key", "cap", LimitConfig((), "sliding_log", concurrency=1), "q")
    assert a[0].acquire("q").allowed
    assert cap.acquire("q", holder="someone:0", token="t0").allowed
    outcome = reserve_all([a, (cap, cap_spec)], 1, 0.025, who=Who("me:0", "t1", "test"))
    assert not outcome.allowed and outcome.decision is not None
    assert outcome.decision.capped == "full"
    assert a[0].usage("q").booked == 0  # the booking made for this call went back


def test_claim_all_on_bookings_of_other_limits_starts_afresh(r: redis.Redis, prefix: str) -> None:
    """Bookings for a different set of limits (the configuration changed meanwhile) are not
    claimed: None, and nothing is counted."""
    a, b = _limits(r, prefix, a="5/h", b="5/h")
    assert claim_all([a, b], 1, {"elsewhere": [0, 1]}, 0.025, 0.5) is None
    assert _used(a[0]) == 0 and _used(b[0]) == 0


def test_claim_all_late_gives_back_the_late_claims_only(r: redis.Redis, prefix: str) -> None:
    """One booking claimed on time and one long past whose limit is full now: what the late
    claim took (a new booking) goes back, the on-time booking stays spent (a duplicate delivery
    may already have run on it), and the caller starts afresh (None)."""
    a, b = _limits(r, prefix, a="5/h", b="1/h")
    assert b[0].acquire("q").allowed
    now = float(r.time()[0])
    on_time = a[0].reserve("q", not_before=now)
    assert on_time.slot is not None
    stale_start = round((now - 3600) * 1e6)
    slots = {
        a[0].keys("q")[0]: [on_time.slot.start_us, on_time.slot.end_us],
        b[0].keys("q")[0]: [stale_start, stale_start + 1_000_000],
    }
    assert claim_all([a, b], 1, slots, tolerance=0.025, early_sleep=0.0) is None
    assert _used(a[0]) == 1  # the booking, spent
    assert _used(b[0]) == 1 and b[0].usage("q").booked == 0  # the late claim's booking, back


def test_refund_hands_a_freed_slot_to_the_oldest_waiter(r: redis.Redis, prefix: str) -> None:
    """What a refund frees goes to the oldest waiter in the cap's line, whose message comes
    back for the caller to publish, with the cap whose slot it got."""
    cap = Limiter(r, None, concurrency=1, name="cap", prefix=prefix)
    cap_spec = LimitSpec("key", "cap", LimitConfig((), "sliding_log", concurrency=1), "q")
    mine = cap.acquire("q", holder="me:0", token="t0")
    assert mine.allowed
    assert cap.wait("q", "waiter:0", "MSG").status == "queued"
    handed = refund([(cap, cap_spec, mine)], 1)
    assert handed == [("waiter:0", "MSG", (cap, "q"))]
