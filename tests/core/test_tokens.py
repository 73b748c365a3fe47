"""Token quotas in the core: meters, costs per meter, reserve then settle, the upstream's counters
charged, money budgets (docs/token-quotas.md). Real Redis, explicit clocks."""

from __future__ import annotations

import asyncio
import math

import pytest
import redis
import redis.asyncio as aioredis

from governor import ConfigError, CostError, Limiter, Prices, RuleError, Settled, Slot, aio
from governor.algorithms import MAX_LOG

T0 = 1_700_000_000.0
ALL = ["sliding_log", "gcra", "token_bucket", "fixed_window", "sliding_window"]
OPENAI = {"requests": "500/m", "tokens": "30000/m, 1000000/d"}


def llm(r: redis.Redis, prefix: str, algorithm: str = "sliding_log", **kw: object) -> Limiter:
    meters = OPENAI if algorithm != "token_bucket" else {"requests": "500/m", "tokens": "30000/m"}
    return Limiter(r, meters, algorithm=algorithm, name="openai", prefix=prefix, **kw)  # type: ignore[arg-type]


def used(lim: Limiter, subject: str, now: float) -> list[tuple[str | None, int]]:
    return [(u.meter, u.used) for u in lim.usage(subject, now=now).rules]


def test_the_issue_example(r: redis.Redis, prefix: str) -> None:
    lim = llm(r, prefix)
    assert lim.meters == ("requests", "tokens")
    d = lim.acquire("org-1", cost={"requests": 1, "tokens": 1800}, now=T0)
    assert d.allowed and dict(d.units) == {"requests": 1, "tokens": 1800} and d.cost == 1800
    s = lim.settle("org-1", d, {"tokens": 950}, now=T0 + 2)
    assert s == Settled("settled", T0 + 2, (0, 850, 850), (0, 0, 0))
    assert used(lim, "org-1", T0 + 2) == [("requests", 1), ("tokens", 950), ("tokens", 950)]
    # a retry or a redelivered copy settling again changes nothing
    assert lim.settle("org-1", d, {"tokens": 100}, now=T0 + 3).status == "duplicate"
    # more than reserved is charged now, admitted or not: later calls wait for it
    big = lim.acquire("org-1", cost={"requests": 1, "tokens": 20_000}, now=T0 + 10)
    s = lim.settle("org-1", big, {"tokens": 35_000}, now=T0 + 20)
    assert s.charged == (0, 15_000, 15_000) and s.given_back == (0, 0, 0)
    d = lim.acquire("org-1", cost={"requests": 1, "tokens": 1}, now=T0 + 21)
    # 950 + 20,000 + 15,000 in the minute: room again when the 20,000 of T0+10 leave it
    assert not d.allowed and d.retry_after == pytest.approx(49.0) and d.rule == lim.rules[1]


@pytest.mark.parametrize("algorithm", ALL)
def test_meters_are_decided_together(r: redis.Redis, prefix: str, algorithm: str) -> None:
    """All meters or none, in one call; the wait is the moment every meter admits it all."""
    lim = llm(r, prefix, algorithm)
    assert lim.acquire("o", {"requests": 1, "tokens": 29_000}, now=T0).allowed
    d = lim.acquire("o", {"requests": 1, "tokens": 2_000}, now=T0)
    assert not d.allowed and d.rule == lim.rules[1] and 0 < d.retry_after <= 61  # (buckets)
    # the denied call counted nothing: one request and 29,000 tokens
    assert [u.used for u in lim.usage("o", now=T0).rules][:2] == [1, 29_000]
    # a call without tokens is not held up by the token meter
    assert lim.acquire("o", {"requests": 1}, now=T0).allowed
    # an integer counts that many of every meter
    e = lim.acquire("o", 2, now=T0)
    assert e.allowed and dict(e.units) == {"requests": 2, "tokens": 2}


def test_costs_are_checked_at_the_edge(r: redis.Redis, prefix: str) -> None:
    lim = llm(r, prefix)
    with pytest.raises(CostError, match="more than rule '30000/m'"):
        lim.acquire("o", {"tokens": 30_001})
    with pytest.raises(CostError, match="more than rule '500/m'"):
        lim.reserve("o", 501)
    with pytest.raises(CostError, match="unknown meter"):
        lim.acquire("o", {"token": 5})
    with pytest.raises(CostError, match="no units"):
        lim.acquire("o", {"tokens": 0})
    for bad in (-1, True, 1.5, "3", None):
        with pytest.raises(CostError):
            lim.acquire("o", {"tokens": bad})  # type: ignore[dict-item]
    with pytest.raises(CostError, match="has none"):
        Limiter(r, "5/s", name="plain", prefix=prefix).acquire("o", {"tokens": 1})
    # without meters, a cost above a limit is a decision that never admits, as before
    d = Limiter(r, "5/s", name="plain", prefix=prefix).acquire("o", 6)
    assert not d.allowed and d.retry_after == math.inf
    with pytest.raises(RuleError, match="meter 'tokens'"):
        Limiter(r, {"tokens": "x/m"}, name="bad", prefix=prefix)
    with pytest.raises(RuleError, match="meter name"):
        Limiter(r, {"to kens": "5/m"}, name="bad", prefix=prefix)
    with pytest.raises(ConfigError, match="settle_within"):
        llm(r, prefix, settle_within=0)


def test_limits_above_the_log_cap_need_meters(r: redis.Redis, prefix: str) -> None:
    with pytest.raises(RuleError, match="meters"):
        Limiter(r, f"{MAX_LOG + 1}/d", name="plain", prefix=prefix)
    lim = Limiter(r, {"tokens": "1000000/d"}, name="big", prefix=prefix)
    assert lim.acquire("o", {"tokens": 1_000_000}, now=T0).allowed
    assert not lim.acquire("o", {"tokens": 1}, now=T0 + 3600).allowed


@pytest.mark.parametrize("algorithm", ALL)
def test_a_million_units_are_one_entry(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = Limiter(r, {"tokens": "10000000/m"}, algorithm=algorithm, name="m", prefix=prefix)
    for i in range(5):
        assert lim.acquire("o", {"tokens": 1_000_000}, now=T0 + i).allowed
    state = lim.keys("o")[0]
    if algorithm == "sliding_log":
        assert r.llen(state) == 5 * 2 + 2  # five entries (stamp, weight), meta, base
    else:
        assert r.strlen(state) < 200
    used = lim.usage("o", now=T0 + 4).rules[0].used
    if algorithm in ("gcra", "token_bucket"):  # repaid at 10,000,000 a minute meanwhile
        assert abs(used - (5_000_000 - 4 * 10_000_000 // 60)) <= 1
    else:
        assert used == 5_000_000


def test_settle_per_algorithm(r: redis.Redis, prefix: str) -> None:
    """What a settle gives back depends on where the reservation still counts."""
    back = {}
    for algorithm in ALL:
        lim = Limiter(
            r, {"tokens": "6000/m"}, algorithm=algorithm, name=f"s-{algorithm}", prefix=prefix
        )
        d = lim.acquire("o", {"tokens": 3000}, now=T0 + 30)
        back[algorithm, "soon"] = lim.settle("o", d, {"tokens": 1000}, now=T0 + 30.1).given_back
        d = lim.acquire("o", {"tokens": 3000}, now=T0 + 31)
        back[algorithm, "late"] = lim.settle("o", d, {"tokens": 1000}, now=T0 + 100).given_back
    for algorithm in ("sliding_log", "fixed_window", "sliding_window"):
        assert back[algorithm, "soon"] == (2000,)
        assert back[algorithm, "late"] == (0,)  # its window passed: nothing comes back
    # gcra and the token bucket repay 100 units a second by themselves: after 0.1 s, 10 of
    # the 3,000 are repaid, so at most 2,990 could come back, and all 2,000 unused do
    assert back["gcra", "soon"] == back["token_bucket", "soon"] == (2000,)
    assert back["gcra", "late"] == back["token_bucket", "late"] == (0,)


def test_settle_after_the_short_window_gives_back_to_the_long_one(
    r: redis.Redis, prefix: str
) -> None:
    lim = llm(r, prefix)
    d = lim.acquire("o", {"requests": 1, "tokens": 10_000}, now=T0)
    s = lim.settle("o", d, {"tokens": 4_000}, now=T0 + 90)  # the minute passed, not the day
    assert s.given_back == (0, 0, 6_000)
    assert used(lim, "o", T0 + 90)[2] == ("tokens", 4_000)


def test_the_lease_lapses(r: redis.Redis, prefix: str) -> None:
    lim = llm(r, prefix, settle_within=30)
    d = lim.acquire("o", {"requests": 1, "tokens": 5_000}, now=T0)
    s = lim.settle("o", d, {"tokens": 10}, now=T0 + 31)
    assert s.status == "lapsed" and not s.settled and s.given_back == ()
    assert used(lim, "o", T0 + 31)[1] == ("tokens", 5_000)  # the estimate stands
    e = lim.acquire("o", {"requests": 1, "tokens": 5_000}, now=T0 + 1)
    assert lim.settle("o", e, {"tokens": 10}, now=T0 + 31).settled  # on the lease's last us
    denied = lim.acquire("o", {"tokens": 30_000}, now=T0 + 2)
    assert lim.settle("o", denied, {"tokens": 1}).status == "unreserved"


def test_ids_name_reservations(r: redis.Redis, prefix: str) -> None:
    lim = llm(r, prefix)
    a = lim.acquire("o", {"requests": 1, "tokens": 1_000}, now=T0)
    b = lim.acquire("o", {"requests": 1, "tokens": 1_000}, now=T0)  # the same slot as a
    assert a.slot == b.slot
    assert lim.settle("o", a, {"tokens": 0}, id="task-a", now=T0).given_back[1] == 1_000
    assert lim.settle("o", b, {"tokens": 0}, id="task-b", now=T0).given_back[1] == 1_000
    assert lim.settle("o", b, {"tokens": 0}, id="task-b", now=T0).status == "duplicate"
    assert used(lim, "o", T0)[1] == ("tokens", 0)
    # other subjects keep their own ids
    c = lim.acquire("p", {"requests": 1, "tokens": 1_000}, now=T0)
    assert lim.settle("p", c, {"tokens": 0}, id="task-a", now=T0).settled


def test_bookings_are_settled_too(r: redis.Redis, prefix: str) -> None:
    lim = llm(r, prefix)
    assert lim.acquire("o", {"requests": 1, "tokens": 30_000}, now=T0).allowed
    d = lim.reserve("o", {"requests": 1, "tokens": 20_000}, now=T0, tolerance=1.0)
    assert d.booked and d.slot is not None and d.slot.start == T0 + 60
    claimed = lim.claim("o", d.slot, dict(d.units), now=T0 + 60.5)
    assert claimed.allowed and claimed.slot == d.slot
    assert lim.settle("o", claimed, {"tokens": 5_000}, now=T0 + 70).given_back == (
        0,
        15_000,
        15_000,
    )
    assert used(lim, "o", T0 + 70)[1] == ("tokens", 5_000)
    # refund takes a cost per meter as well
    e = lim.acquire("o", {"requests": 1, "tokens": 100}, now=T0 + 70)
    lim.refund("o", e, {"tokens": 40}, now=T0 + 70)
    assert used(lim, "o", T0 + 70)[1:] == [("tokens", 5_060), ("tokens", 5_060 + 30_000)]


@pytest.mark.parametrize("algorithm", ALL)
def test_sync_charges_what_the_upstream_counted(
    r: redis.Redis, prefix: str, algorithm: str
) -> None:
    lim = llm(r, prefix, algorithm)
    assert lim.acquire("o", {"requests": 1, "tokens": 1_000}, now=T0).allowed
    # others used the same key: the upstream has 20,000 tokens left where governor saw 29,000
    charged = lim.sync_remaining("o", 20_000, meter="tokens", reset_in=12.0, now=T0)
    assert charged == 9_000
    assert not lim.peek("o", {"tokens": 20_001}, now=T0).allowed
    assert lim.peek("o", {"tokens": 20_000}, now=T0).allowed
    # the upstream having more room than governor counted changes nothing
    assert lim.sync_remaining("o", 25_000, meter="tokens", reset_in=12.0, now=T0) == 0
    with pytest.raises(ConfigError, match="which meter"):
        lim.sync_remaining("o", 5, now=T0)
    with pytest.raises(CostError):
        lim.sync_remaining("o", -1, meter="tokens", now=T0)


def test_sync_compares_the_rule_of_the_upstreams_window(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, {"tokens": "30000/m, 100000/h"}, name="w", prefix=prefix)
    assert lim.acquire("o", {"tokens": 25_000}, now=T0).allowed
    # a counter that resets within a minute is the minute's: 5,000 left here too, nothing owed
    assert lim.sync_remaining("o", 5_000, meter="tokens", reset_in=40, now=T0) == 0
    # one that resets within the hour is the hour's: governor saw 75,000 left
    assert lim.sync_remaining("o", 60_000, meter="tokens", reset_in=1_800, now=T0) == 15_000
    # without reset_in, the rule with least room: the minute's 0 left after the charge
    assert lim.sync_remaining("o", 0, meter="tokens", now=T0) == 0


def test_sync_as_of_the_upstreams_reading_sees_past_calls_in_flight(
    r: redis.Redis, prefix: str
) -> None:
    """The upstream read its counter when call A arrived; governor has admitted B and C since.
    Compared with governor's room now, B and C would hide the 6,000 another client spent; as of
    A's admission the sliding log counts what the upstream had seen (the others: room now)."""
    lim = Limiter(r, {"tokens": "30000/m"}, name="asof", prefix=prefix)
    a = lim.acquire("o", {"tokens": 4_000}, now=T0)
    lim.acquire("o", {"tokens": 5_000}, now=T0 + 0.5)
    lim.acquire("o", {"tokens": 5_000}, now=T0 + 0.8)
    assert a.slot is not None
    # upstream at A's arrival: A's 4,000 and the other client's 6,000 => 20,000 left
    now_only = Limiter(r, {"tokens": "30000/m"}, name="asof-now", prefix=prefix)
    for t, n in ((T0, 4_000), (T0 + 0.5, 5_000), (T0 + 0.8, 5_000)):
        now_only.acquire("o", {"tokens": n}, now=t)
    assert now_only.sync_remaining("o", 20_000, meter="tokens", now=T0 + 1) == 0  # hidden
    assert lim.sync_remaining("o", 20_000, meter="tokens", now=T0 + 1, as_of=a.slot.end) == 6_000
    assert lim.usage("o", now=T0 + 1).rules[0].used == 20_000
    # B's answer (arrived at T0 + 0.5, after A's): the upstream had seen A, B and the 6,000;
    # the charge stands at A's reading, so B's reading counts it and charges nothing again
    b_at = T0 + 0.5
    assert lim.sync_remaining("o", 15_000, meter="tokens", now=T0 + 1.1, as_of=b_at) == 0
    # a reading from the future (another host's clock) is taken as now
    assert lim.sync_remaining("o", 10_000, meter="tokens", now=T0 + 1, as_of=T0 + 9) == 0


def test_sync_as_of_counts_over_the_upstreams_window_under_transit(
    r: redis.Redis, prefix: str
) -> None:
    """Rules lengthened by a transit of 0.5 s (60.5 s for the upstream's minute): what the
    upstream dropped from its minute, governor's longer window still holds; as of a reading,
    the sliding log counts over the upstream's minute."""
    lim = Limiter(r, {"tokens": "30000/60500ms"}, name="transit", prefix=prefix)
    lim.acquire("o", {"tokens": 8_000}, now=T0)  # out of the upstream's minute at T0 + 60
    d = lim.acquire("o", {"tokens": 2_000}, now=T0 + 60.2)
    assert d.slot is not None
    # the upstream at d's arrival: d's 2,000 and another client's 3,000 => 25,000 left
    got = lim.sync_remaining(
        "o", 25_000, meter="tokens", now=T0 + 60.3, as_of=d.slot.end, transit=0.5
    )
    assert got == 3_000
    # without transit it counts the 8,000 the upstream no longer does: 5,000 hidden
    other = Limiter(r, {"tokens": "30000/60500ms"}, name="transit-0", prefix=prefix)
    other.acquire("o", {"tokens": 8_000}, now=T0)
    e = other.acquire("o", {"tokens": 2_000}, now=T0 + 60.2)
    assert e.slot is not None
    assert other.sync_remaining("o", 25_000, meter="tokens", now=T0 + 60.3, as_of=e.slot.end) == 0


# -- headroom: the other client's spending since the latest reading --------------------------

QUOTA = {"tokens": "16000/4s"}


def headroom(lim: Limiter, subject: str, now: float) -> int:
    """The tokens a limiter keeps free at ``now`` beyond what its log counts (for a call of one
    token): the room the log leaves less the room a decision sees."""
    used_now = lim.usage(subject, now=now).rules[0].used
    seen = lim.peek(subject, {"tokens": 1}, now=now)
    assert seen.allowed
    return 16_000 - used_now - 1 - seen.remaining


def state(r: redis.Redis, lim: Limiter, subject: str) -> bytes:
    """The log's meta element (where the headroom's state lives, after ':h')."""
    return bytes(r.lrange(lim.keys(subject)[0], -2, -2)[0])


class Upstream:
    """The provider's exact sliding window of 4 s over governor's calls and another client's."""

    def __init__(self) -> None:
        self.spent: list[tuple[float, int]] = []

    def spend(self, at: float, tokens: int) -> None:
        self.spent.append((at, tokens))

    def remaining(self, at: float) -> int:
        return 16_000 - sum(n for t, n in self.spent if at - 4 < t <= at)


def steady(
    r: redis.Redis, lim: Limiter, up: Upstream, start: float, seconds: float, other: int
) -> float:
    """Governor calls of 1,000 tokens every 0.5 s, each answered (and synced as of its
    admission) 0.2 s later; the other client spends ``other`` tokens every 0.25 s. Returns the
    latest reading's moment."""
    reading = start
    for step in range(round(seconds / 0.25)):
        t = start + step * 0.25
        if other:
            up.spend(t, other)
        if step % 2 == 0:
            d = lim.acquire("o", {"tokens": 1_000}, now=t)
            assert d.allowed and d.slot is not None
            up.spend(t, 1_000)
            reading = d.slot.end
            lim.sync_remaining(
                "o", up.remaining(reading), meter="tokens", now=t + 0.2, as_of=reading
            )
    return reading


def test_headroom_none_without_a_sync_that_finds_units(r: redis.Redis, prefix: str) -> None:
    """A limit never synced, or whose syncs find nothing the log did not count, decides as
    before: the same decisions as a limiter that never synced, and no state kept."""
    synced = Limiter(r, OPENAI, name="hr-synced", prefix=prefix)
    alone = Limiter(r, OPENAI, name="hr-alone", prefix=prefix)
    for step in range(60):
        now = T0 + step * 0.7
        cost = {"requests": 1, "tokens": 2_000 + 337 * step % 1_500}
        a, b = synced.acquire("o", cost, now=now), alone.acquire("o", cost, now=now)
        assert a == b
        if a.slot is not None:  # the upstream has seen all of it and no more
            room = synced.usage("o", now=now).rules[1]
            left = room.rule.limit - room.used
            assert synced.sync_remaining("o", left, meter="tokens", now=now + 0.1) == 0
        booked = synced.reserve("o", cost, now=now), alone.reserve("o", cost, now=now)
        assert booked[0] == booked[1]
        synced.refund("o", booked[0], now=now)
        alone.refund("o", booked[1], now=now)
    assert b":h" not in state(r, synced, "o")


def test_headroom_grows_from_the_latest_reading_and_restarts_at_the_next(
    r: redis.Redis, prefix: str
) -> None:
    """Another client spends 1,200 tokens a second (30 % of 16,000 per 4 s): readings find it,
    and a decision keeps free what it has spent since the latest reading, at the rate found, a
    window's worth at most; the next reading counts it in the log and restarts from 0."""
    lim = Limiter(r, QUOTA, name="hr-steady", prefix=prefix)
    up = Upstream()
    last = steady(r, lim, up, T0, 12, other=300)
    # what the readings found: close to the other client's 4,800 tokens per window
    t, a = (int(x) for x in state(r, lim, "o").split(b":h")[1].split(b"/"))
    assert t == round(last * 1e6) and 3_600 <= a <= 4_800
    rate = a / 4
    for since in (0.0, 0.1, 0.25, 0.5, 1.0):
        assert headroom(lim, "o", last + since) == int(rate * since)
    # a window's worth at most (beyond, the rate times the window)
    assert headroom(lim, "o", last + 6) == a
    # the next reading (as of 0.5 s later: the other client's 600 tokens since, at + 0.25 s
    # and + 0.5 s) counts them in the log, and the headroom restarts from there
    d = lim.acquire("o", {"tokens": 1_000}, now=last + 0.5)
    assert d.allowed and d.slot is not None
    up.spend(last + 0.5, 300)
    up.spend(last + 0.5, 1_000)
    got = lim.sync_remaining(
        "o", up.remaining(last + 0.5), meter="tokens", now=last + 0.7, as_of=d.slot.end
    )
    assert 0 < got <= 600
    assert headroom(lim, "o", last + 0.5) == 0
    assert 0 < headroom(lim, "o", last + 0.7) < headroom(lim, "o", last + 1.2)


def test_headroom_fades_when_the_other_client_stops(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, QUOTA, name="hr-fades", prefix=prefix)
    up = Upstream()
    last = steady(r, lim, up, T0, 8, other=300)
    before = headroom(lim, "o", last + 0.5)
    assert before > 400
    # it stops: readings every 0.5 s find nothing, and what they found fades
    last = steady(r, lim, up, last + 0.5, 4, other=0)
    after = headroom(lim, "o", last + 0.5)
    assert 0 < after < before / 2
    # a reading a whole window after the previous one forgets it: no state, as never synced
    d = lim.acquire("o", {"tokens": 1_000}, now=last + 4.5)
    assert d.slot is not None
    up.spend(last + 4.5, 1_000)
    lim.sync_remaining(
        "o", up.remaining(last + 4.5), meter="tokens", now=last + 4.6, as_of=d.slot.end
    )
    assert b":h" not in state(r, lim, "o")
    assert headroom(lim, "o", last + 5.5) == 0


def test_headroom_leaves_out_a_reading_older_than_the_latest(r: redis.Redis, prefix: str) -> None:
    """Answers come out of order: a reading older than the latest finds again what the latest
    found (its comparison leaves out the charge made at the later moment). The log is charged
    as before; the headroom's state does not take it twice."""
    lim = Limiter(r, QUOTA, name="hr-order", prefix=prefix)
    a = lim.acquire("o", {"tokens": 2_000}, now=T0)
    b = lim.acquire("o", {"tokens": 2_000}, now=T0 + 0.5)
    assert a.slot is not None and b.slot is not None
    # b's answer first: the upstream had a, b and the other client's 3,000 (1,000 before a)
    assert lim.sync_remaining("o", 9_000, meter="tokens", now=T0 + 0.6, as_of=b.slot.end) == 3_000
    assert state(r, lim, "o").endswith(b":h%d/3000" % b.slot.end_us)
    # a's answer, late: the upstream had a and 1,000 of the other client's
    assert lim.sync_remaining("o", 13_000, meter="tokens", now=T0 + 0.7, as_of=a.slot.end) == 1_000
    assert state(r, lim, "o").endswith(b":h%d/3000" % b.slot.end_us)


def test_headroom_makes_decisions_stricter_and_keeps_retries_admissible(
    r: redis.Redis, prefix: str
) -> None:
    """A call denied for the headroom is told a moment whose room holds that moment's own
    (larger) headroom, and is admitted then; a booking goes to such a moment too. The log
    (what syncs compare, what usage shows) counts only what was charged."""
    lim = Limiter(r, QUOTA, name="hr-retry", prefix=prefix)
    up = Upstream()
    last = steady(r, lim, up, T0, 8, other=300)
    counted = lim.usage("o", now=last + 1).rules[0].used
    kept = headroom(lim, "o", last + 1)
    assert kept > 0
    room = 16_000 - counted - kept
    d = lim.acquire("o", {"tokens": room + 1}, now=last + 1)
    assert not d.allowed and d.retry_after > 0
    at = last + 1 + d.retry_after
    assert headroom(lim, "o", at) > kept  # (it grew meanwhile)
    assert not lim.peek("o", {"tokens": room + 1}, now=at - 0.001).allowed
    booked = lim.reserve("o", {"tokens": room + 1}, now=last + 1)
    assert booked.booked and booked.slot is not None and booked.slot.start >= at - 1e-6
    lim.refund("o", booked, now=last + 1)
    assert lim.usage("o", now=last + 1).rules[0].used == counted  # the log: what was charged
    assert lim.acquire("o", {"tokens": room + 1}, now=at).allowed


def test_plain_limiters_settle_and_sync(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "100/m", name="plain", prefix=prefix)
    d = lim.acquire("o", 10, now=T0)
    assert lim.settle("o", d, 4, now=T0).given_back == (6,)
    assert lim.sync_remaining("o", 50, now=T0) == 46
    assert lim.usage("o", now=T0).rules[0].used == 50
    with pytest.raises(ConfigError, match="no meters"):
        lim.sync_remaining("o", 5, meter="tokens")


def test_a_capped_limiter_with_meters(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, OPENAI, name="capped", prefix=prefix, concurrency=2)
    d = lim.acquire("o", {"requests": 1, "tokens": 5_000}, now=T0, holder="h1")
    assert d.allowed and d.hold is not None and dict(d.units)["tokens"] == 5_000
    assert lim.settle("o", d, {"tokens": 1_000}, now=T0 + 1).given_back == (0, 4_000, 4_000)
    assert lim.release("o", d.hold, now=T0 + 1)[0]
    assert used(lim, "o", T0 + 1)[1] == ("tokens", 1_000)


def test_the_first_layout_of_a_log_is_read_once(r: redis.Redis, prefix: str) -> None:
    """A subject counted by an earlier governor (one stamp per unit under ':sl') keeps its
    counts: the new log reads them into its entries; reset forgets both."""
    lim = Limiter(r, "5/m", name="old", prefix=prefix)
    old = lim.keys("o")[0][: -len("lg")] + "sl"
    base = int(T0 * 1000)
    r.rpush(old, "2000", "2000", "0", "f:0", f"b{base}")  # 3 stamps: two at +2 s, one at 0
    r.pexpire(old, 60_000)
    usage = lim.usage("o", now=T0 + 3)
    assert usage.rules[0].used == 3
    assert lim.acquire("o", 2, now=T0 + 3).allowed and not lim.acquire("o", now=T0 + 3).allowed
    assert r.lrange(lim.keys("o")[0], -1, -1) == [f"b{base}".encode()]
    lim.reset("o")
    assert r.exists(old, lim.keys("o")[0]) == 0
    assert lim.acquire("o", 5, now=T0 + 3).allowed


def test_past_max_log_entries_the_past_is_merged(r: redis.Redis, prefix: str) -> None:
    """Past the cap the log halves the resolution of its past (entries merged two by two at the
    newer stamp): every unit is still counted, a little later at worst, never earlier."""
    lim = Limiter(r, {"calls": "100000/h"}, name="cap", prefix=prefix)
    lim.peek("o", now=T0)  # loads the script
    pipe = r.pipeline(transaction=False)
    for i in range(MAX_LOG + 5):
        keys, args = lim._call("acquire", "o", (1,), T0 + i / 1000)
        pipe.evalsha(lim._script.sha, len(keys), *keys, *args)
    assert all(reply.startswith(b"1 ") for reply in pipe.execute())
    assert r.llen(lim.keys("o")[0]) == 2 * (MAX_LOG // 2 + 5) + 2
    usage = lim.usage("o", now=T0 + 30)
    assert usage.rules[0].used == MAX_LOG + 5
    # all counted until an hour after the newest of each merged pair, not a moment less
    assert lim.usage("o", now=T0 + 3600.0015).rules[0].used == MAX_LOG + 5 - 2
    assert lim.acquire("o", 100_000 - MAX_LOG - 5, now=T0 + 30).allowed
    assert not lim.acquire("o", now=T0 + 30).allowed


def test_money_budgets(r: redis.Redis, prefix: str) -> None:
    prices = Prices({"input_tokens": "3", "output_tokens": "15"})  # $ per million tokens
    budget = Limiter(r, {"usd_micro": "1000000/d"}, name="spend", prefix=prefix)  # $1 a day
    estimate = prices.micro_dollars({"input_tokens": 2_000, "output_tokens": 4_000})
    d = budget.acquire("tenant-7", {"usd_micro": estimate}, now=T0)
    assert d.allowed and estimate == 66_000
    real = prices.micro_dollars({"input_tokens": 2_000, "output_tokens": 1_000})
    assert budget.settle("tenant-7", d, {"usd_micro": real}, now=T0 + 5).given_back == (45_000,)


def test_asyncio_meters_settle_and_sync(redis_server: object, prefix: str) -> None:
    url = redis_server.url(0)  # type: ignore[attr-defined]
    sync = Limiter(redis.Redis.from_url(url), OPENAI, name="s", prefix=prefix)

    async def run() -> None:
        client = aioredis.Redis.from_url(url)
        lim = aio.Limiter(client, OPENAI, name="a", prefix=prefix)
        for step in range(6):
            now = T0 + step
            cost = {"requests": 1, "tokens": 4_000 + step}
            a, b = await lim.acquire("x", cost, now=now), sync.acquire("x", cost, now=now)
            assert a == b
            assert await lim.settle("x", a, {"tokens": 100}, now=now) == sync.settle(
                "x", b, {"tokens": 100}, now=now
            )
        assert await lim.sync_remaining("x", 100, meter="tokens", now=T0 + 6) == (
            sync.sync_remaining("x", 100, meter="tokens", now=T0 + 6)
        )
        d = await lim.reserve("x", {"tokens": 30_000}, now=T0 + 6)
        assert d == sync.reserve("x", {"tokens": 30_000}, now=T0 + 6) and d.booked
        assert isinstance(d.slot, Slot)
        await lim.refund("x", d, now=T0 + 6)
        sync.refund("x", d, now=T0 + 6)
        assert (await lim.usage("x", now=T0 + 6)).rules == sync.usage("x", now=T0 + 6).rules
        await client.aclose()

    asyncio.run(run())


def test_asyncio_headroom(redis_server: object, prefix: str) -> None:
    """The asyncio limiter runs the same script: the same charges, state and decisions."""
    url = redis_server.url(0)  # type: ignore[attr-defined]
    sync = Limiter(redis.Redis.from_url(url), QUOTA, name="hs", prefix=prefix)

    async def run() -> None:
        client = aioredis.Redis.from_url(url)
        lim = aio.Limiter(client, QUOTA, name="ha", prefix=prefix)
        for step in range(16):
            now = T0 + step * 0.5
            a = await lim.acquire("x", {"tokens": 1_500}, now=now)
            assert a == sync.acquire("x", {"tokens": 1_500}, now=now)
            if a.slot is None:
                continue
            left = 16_000 - 1_500 * min(step + 1, 8) - 600 * min(step + 1, 8)
            got = await lim.sync_remaining(
                "x", max(0, left), meter="tokens", now=now + 0.2, as_of=a.slot.end
            )
            assert got == sync.sync_remaining(
                "x", max(0, left), meter="tokens", now=now + 0.2, as_of=a.slot.end
            )
        for since in (0.1, 0.3, 2.0):
            cost = {"tokens": 3_000}
            now = T0 + 7.5 + since
            assert await lim.peek("x", cost, now=now) == sync.peek("x", cost, now=now)
            assert await lim.acquire("x", cost, now=now) == sync.acquire("x", cost, now=now)
        assert headroom(sync, "x", T0 + 9.6) > 0
        await client.aclose()

    asyncio.run(run())


def test_a_slot_and_its_estimate_settle_as_the_decision(r: redis.Redis, prefix: str) -> None:
    """What a task message carries (its slot and what it reserved) is enough to settle."""
    lim = llm(r, prefix)
    d = lim.acquire("o", {"requests": 1, "tokens": 3_000}, now=T0)
    assert d.slot is not None
    with pytest.raises(CostError, match="estimate"):
        lim.settle("o", d.slot, {"tokens": 1_000}, now=T0)
    s = lim.settle("o", d.slot, {"tokens": 1_000}, estimate=dict(d.units), id="t1", now=T0)
    assert s.given_back == (0, 2_000, 2_000)
    assert lim.settle("o", d, {"tokens": 1_000}, id="t1", now=T0).status == "duplicate"


@pytest.mark.parametrize("algorithm", ALL)
def test_huge_overruns_stay_in_range(r: redis.Redis, prefix: str, algorithm: str) -> None:
    """A use of 10^12 units (the most a call may report) is charged without breaking the state
    (an expiry Redis refuses, inexact sums): the subject simply waits."""
    lim = Limiter(r, {"tokens": "10/d"}, algorithm=algorithm, name="huge", prefix=prefix)
    d = lim.acquire("o", {"tokens": 1}, now=T0)
    assert lim.settle("o", d, {"tokens": 10**12}, now=T0).charged == (10**12 - 1,)
    later = lim.acquire("o", {"tokens": 1}, now=T0 + 3_600)
    assert not later.allowed and later.retry_after > 0
    with pytest.raises(CostError):
        lim.settle("o", d, {"tokens": 10**12 + 1}, id="other", now=T0)


def test_a_cap_alone_has_nothing_to_settle(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, None, concurrency=2, name="cap-only", prefix=prefix)
    d = lim.acquire("o", now=T0, holder="h")
    assert d.allowed and lim.settle("o", d, 5).status == "settled"
