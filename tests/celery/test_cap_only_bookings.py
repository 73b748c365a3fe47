"""A limit with only a concurrency cap beside limits that book (issue 18, finding 3): asked
for a moment ahead (``not_before``), it books that moment and takes no slot now; the slot is
taken when the booked task claims its moment."""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

import redis

from governor import Limiter
from governor.celery.decisions.rounds import reserve_all
from governor.celery.types import Who

T0 = 1_800_000_000.0


class Spec(NamedTuple):
    """What reserve_all reads of a limit's spec: its subject (and a label for outcomes)."""

    subject: str
    label: str


def test_a_booking_ahead_takes_no_slot(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, None, concurrency=1, lease=30, name="key", prefix=prefix)
    d = lim.reserve("k", now=T0, not_before=T0 + 5, tolerance=0.1, holder="A:0", token="ta")
    assert not d.allowed and d.booked and d.hold is None
    assert d.slot is not None and (d.slot.start, d.slot.end) == (T0 + 5, T0 + 5.1)
    assert abs(d.retry_after - 5) < 1e-6
    assert lim.holders("k", now=T0).holders == ()
    other = lim.acquire("k", holder="B:0", now=T0 + 1)
    assert other.allowed and other.hold is not None  # nobody runs: the slot is free
    lim.release("k", other.hold, now=T0 + 2)
    early = lim.claim("k", d.slot, holder="A:0", token="ta", now=T0 + 4)
    assert not early.allowed and early.booked and early.slot == d.slot and early.hold is None
    claimed = lim.claim("k", d.slot, holder="A:0", token="ta", now=T0 + 5.05)
    assert claimed.allowed and claimed.hold is not None
    assert [h.holder for h in lim.holders("k", now=T0 + 5.05).holders] == ["A:0"]
    # too far for max_wait: no booking, nothing taken
    far = lim.reserve("k", now=T0 + 6, not_before=T0 + 60, max_wait=10, holder="C:0")
    assert not far.allowed and far.slot is None and far.hold is None


def test_a_queue_rate_beside_a_per_key_cap_leaves_no_phantom_slot(
    r: redis.Redis, prefix: str
) -> None:
    """The setup from the issue: a queue rate plus a per-key ``concurrency=1``. The second
    task is booked by the rate; the key's slot must stay free until it starts."""
    rate = Limiter(r, "1/s", name="queue", prefix=prefix)
    key = Limiter(r, None, concurrency=1, lease=30, name="key", prefix=prefix)
    limiters: list[tuple[Limiter, Any]] = [(rate, Spec("q", "queue:q")), (key, Spec("k", "key"))]
    first = reserve_all(limiters, 1, 0.05, who=Who(f"{uuid.uuid4()}:0", "t1", "node 1"))
    assert first.allowed
    held = next(d.hold for lim, _, d in first.held if lim is key)
    assert held is not None
    key.release("k", held)
    booked = reserve_all(limiters, 1, 0.05, who=Who("booked:0", "t2", "node 1"))
    assert not booked.allowed and booked.slots is not None and len(booked.slots) == 2
    assert key.holders("k").holders == ()  # no phantom slot
    third = key.acquire("k", holder="third:0")
    assert third.allowed  # the key is free while the booked task waits for its moment
