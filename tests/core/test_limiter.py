"""Limiter behaviour on a real Redis, with an explicit clock unless the test is about TIME."""

from __future__ import annotations

import math
import struct

import pytest
import redis

from governor import (
    ConfigError,
    CostError,
    Limiter,
    Rule,
    RuleError,
    StateError,
    StorageUnavailable,
)
from governor.algorithms import ALGORITHMS

# the versions matrix (noxfile.py) runs this file: redis.Redis and redis-py errors
pytestmark = pytest.mark.compat

ALL = ["sliding_log", "gcra", "token_bucket", "fixed_window", "sliding_window"]
T0 = 1_700_000_000.0  # a whole day boundary is not needed: fixed windows are tested apart


def make(r: redis.Redis, prefix: str, rules: str, algorithm: str = "sliding_log") -> Limiter:
    return Limiter(r, rules, algorithm=algorithm, name="api", prefix=prefix)


def test_issue_example(r: redis.Redis, prefix: str) -> None:
    partner_api = make(r, prefix, "1/s, 20/m, 200/h, 800/d")
    d = partner_api.acquire("customer-42")
    assert d.allowed and d.retry_after == 0.0 and d.rule is None and d.blocked is None
    assert d.remaining == 0  # the 1/s rule is used up
    d = partner_api.acquire("customer-42")
    assert (
        not d.allowed and d.rule == Rule.parse("1/s") and 0.9 < d.retry_after <= 1.001
    )  # stamps round up to the ms


@pytest.mark.parametrize("algorithm", ["sliding_log", "gcra", "token_bucket", "sliding_window"])
def test_retry_after_waits_for_every_rule(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "1/s, 3/m", algorithm)
    for t in (0, 1.1, 2.2):
        assert lim.acquire("a", now=T0 + t).allowed
    d = lim.acquire("a", now=T0 + 2.5)  # both rules deny: 1/s for 0.7 s, 3/m for much longer
    assert not d.allowed and d.rule == Rule(3, 60) and d.retry_after > 10
    assert not lim.acquire("a", now=T0 + 2.5 + d.retry_after - 0.001).allowed
    again = lim.acquire("a", now=T0 + 2.5 + d.retry_after)
    assert again.allowed, f"{algorithm}: retrying after retry_after must pass"


def test_sliding_log_exact_numbers(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/s, 3/m")
    assert lim.acquire("a", now=T0).allowed
    assert lim.acquire("a", now=T0 + 1).allowed
    assert lim.acquire("a", now=T0 + 2).allowed
    d = lim.acquire("a", now=T0 + 2.5)
    assert (d.allowed, d.retry_after, d.rule) == (False, 57.5, Rule(3, 60))
    assert d.reset_after == 59.5
    d = lim.acquire("a", now=T0 + 60)
    assert d.allowed and d.remaining == 0 and d.reset_after == 60.0


@pytest.mark.parametrize("algorithm", ALL)
def test_cost_above_a_limit_never_passes(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "10/s, 5/m", algorithm)
    d = lim.acquire("a", 6, now=T0)
    assert not d.allowed and d.retry_after == math.inf and d.rule == Rule(5, 60)
    assert lim.usage("a", now=T0).rules[0].used == 0  # nothing was counted
    assert lim.acquire("a", 5, now=T0).allowed


@pytest.mark.parametrize("algorithm", ALL)
def test_a_denial_counts_nothing(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "100/s, 2/h", algorithm)
    assert lim.acquire("a", now=T0).allowed and lim.acquire("a", now=T0).allowed
    before = lim.usage("a", now=T0)
    for _ in range(5):
        assert not lim.acquire("a", now=T0).allowed
    assert lim.usage("a", now=T0) == before
    assert before.rules[0].used == 2


@pytest.mark.parametrize("algorithm", ALL)
def test_weighted_cost_and_peek(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "10/m", algorithm)
    assert lim.peek("a", 10, now=T0).allowed
    assert lim.peek("a", 10, now=T0).remaining == 0
    d = lim.acquire("a", 7, now=T0)
    assert d.allowed and d.remaining == 3
    assert not lim.peek("a", 4, now=T0).allowed
    assert lim.acquire("a", 3, now=T0).allowed
    assert not lim.acquire("a", now=T0).allowed


@pytest.mark.parametrize("algorithm", ALL)
def test_bad_costs(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "10/s", algorithm)
    for bad in (0, -1, 1.5, True, "1", None):
        with pytest.raises(CostError, match="cost"):
            lim.acquire("a", bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="now"):
        lim.acquire("a", now=float("nan"))
    with pytest.raises(ConfigError, match="now"):
        lim.acquire("a", now="soon")  # type: ignore[arg-type]
    assert r.keys(f"{prefix}*") == []  # nothing half-written


@pytest.mark.parametrize("algorithm", ALL)
def test_manual_blocks(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "10/s", algorithm)
    until = lim.block("a", 30, "chargeback fraud", now=T0)
    assert until == T0 + 30
    d = lim.acquire("a", now=T0 + 10)
    assert (d.allowed, d.blocked, d.retry_after) == (False, "chargeback fraud", 20.0)
    assert d.rule is None
    assert lim.acquire("b", now=T0 + 10).allowed  # other subjects are free
    usage = lim.usage("a", now=T0 + 10)
    assert (usage.blocked, usage.blocked_for) == ("chargeback fraud", 20.0)
    assert lim.acquire("a", now=T0 + 30).allowed  # expired on the limiter's clock
    assert 29_000 < r.pttl(lim.keys("a")[1]) <= 30_000 + 60_000
    assert lim.unblock("a") is True and lim.unblock("a") is False
    with pytest.raises(ConfigError, match="duration"):
        lim.block("a", 0)
    with pytest.raises(ConfigError, match="duration"):
        lim.block("a", -5)


def test_block_with_server_time(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "10/s")
    lim.block("a", 2.5)
    assert 2_400 <= r.pttl(lim.keys("a")[1]) <= 2_500
    d = lim.acquire("a")
    assert d.blocked == "" and 2.4 < d.retry_after <= 2.5


@pytest.mark.parametrize("algorithm", ALL)
def test_every_key_expires(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "5/2s, 7/m", algorithm)
    lim.acquire("a")
    lim.acquire("a", 3)
    lim.reserve("a", 4)
    lim.block("a", 1)
    keys = r.keys(f"{prefix}*")
    assert len(keys) == 2
    for key in keys:  # the booking is about a minute ahead; its stamp then lives one window
        assert 0 < r.pttl(key) <= 2 * 60_000 + 2_000, key


def test_ttl_follows_the_longest_window(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "5/2s")
    lim.acquire("a")
    assert 1_900 < r.pttl(lim.keys("a")[0]) <= 2_001
    lim = Limiter(r, "5/2s", algorithm="gcra", name="g", prefix=prefix)
    lim.acquire("a")  # one of five: the bucket is full again after 400 ms
    assert 300 < r.pttl(lim.keys("a")[0]) <= 401


@pytest.mark.parametrize("algorithm", ALL)
def test_reset_forgets_usage_but_not_blocks(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "1/h", algorithm)
    assert lim.acquire("a", now=T0).allowed
    lim.block("a", 10, "hold", now=T0)
    lim.reset("a")
    assert lim.acquire("a", now=T0).blocked == "hold"
    lim.unblock("a")
    assert lim.acquire("a", now=T0).allowed


@pytest.mark.parametrize("algorithm", ALL)
def test_refund_gives_capacity_back(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "2/m", algorithm)
    assert lim.acquire("a", now=T0).allowed
    d = lim.acquire("a", now=T0 + 1)
    assert d.allowed and not lim.acquire("a", now=T0 + 1).allowed
    lim.refund("a", d, now=T0 + 1)
    assert lim.acquire("a", now=T0 + 1).allowed


def test_refund_after_trim_keeps_old_stamps_counted(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/s")
    assert lim.acquire("a", now=T0).allowed
    booked = lim.reserve("a", now=T0)  # trims the first stamp out of the one-entry log
    assert booked.booked and booked.slot is not None and booked.slot.start == T0 + 1
    lim.refund("a", booked, now=T0)
    assert not lim.acquire("a", now=T0 + 0.5).allowed  # the trimmed admission still counts
    assert lim.acquire("a", now=T0 + 1).allowed


def test_bookings_queue_first_come_first_served(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/s")
    assert lim.acquire("a", now=T0).allowed
    first = lim.reserve("a", now=T0 + 0.1, tolerance=0.05)
    second = lim.reserve("a", now=T0 + 0.2, tolerance=0.05)
    assert first.slot and second.slot
    assert (first.slot.start, first.slot.end) == (T0 + 1, T0 + 1.05)
    assert (first.retry_after, second.retry_after) == pytest.approx((0.9, 1.85))
    assert second.slot.start == pytest.approx(T0 + 2.05)  # a whole window after first's latest
    assert not lim.acquire("a", now=T0 + 1.5).allowed  # bookings count for everyone
    early = lim.claim("a", first.slot, now=T0 + 0.99)
    assert (
        not early.allowed and early.retry_after == pytest.approx(0.01) and early.slot == first.slot
    )
    assert lim.claim("a", first.slot, now=T0 + 1.04).allowed
    late = lim.claim("a", second.slot, now=T0 + 2.2)  # 0.1 s after its latest start
    assert late.booked and late.slot and late.slot.start == pytest.approx(T0 + 3.1)
    usage = lim.usage("a", now=T0 + 2.2)
    assert (usage.rules[0].used, usage.booked) == (1, 1)  # the missed slot stays spent


def test_late_claim_goes_behind_the_queue(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/s")
    assert lim.acquire("a", now=T0).allowed
    a = lim.reserve("a", now=T0)
    b = lim.reserve("a", now=T0)
    assert a.slot and b.slot and b.slot.start == T0 + 2
    late = lim.claim("a", a.slot, now=T0 + 1.5)
    assert late.booked and late.slot and late.slot.start == T0 + 3


def test_reserve_respects_max_wait_and_not_before(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/m")
    assert lim.acquire("a", now=T0).allowed
    d = lim.reserve("a", now=T0, max_wait=30)
    assert not d.allowed and d.slot is None and d.retry_after == 60
    d = lim.reserve("a", now=T0, not_before=T0 + 100)
    assert d.slot and d.slot.start == T0 + 100
    free = lim.reserve("b", now=T0, not_before=T0 + 5)
    assert free.booked and free.slot and free.slot.start == T0 + 5


@pytest.mark.parametrize("algorithm", ["token_bucket", "fixed_window", "sliding_window"])
def test_algorithms_without_bookings_reserve_like_acquire(
    r: redis.Redis, prefix: str, algorithm: str
) -> None:
    lim = make(r, prefix, "1/m", algorithm)
    assert lim.reserve("a", now=T0).allowed
    d = lim.reserve("a", now=T0)
    assert not d.allowed and d.slot is None and d.retry_after > 0


def test_sliding_log_stays_small(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "5/s, 8/m")
    for i in range(200):
        lim.acquire("a", now=T0 + i)
    # the window's 8 entries (a stamp and a weight each), meta and base
    assert r.llen(lim.keys("a")[0]) == 2 * 8 + 2


def test_long_idle_gaps_rebase_the_log(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "2/40d")
    day = 86_400
    assert lim.acquire("a", now=T0).allowed
    assert lim.acquire("a", now=T0 + 30 * day).allowed  # 30 days > 2**31 ms: rebased
    d = lim.acquire("a", now=T0 + 31 * day)
    assert not d.allowed and d.retry_after == 9 * day
    assert lim.acquire("a", now=T0 + 40 * day).allowed


def test_fixed_windows_align_to_the_epoch(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "2/m", "fixed_window")
    start = 1_700_000_020.0  # 40 s into a minute
    assert lim.acquire("a", now=start).allowed and lim.acquire("a", now=start).allowed
    d = lim.acquire("a", now=start + 1)
    assert d.retry_after == 19 and d.reset_after == 19
    assert lim.acquire("a", now=start + 20).allowed


def test_sliding_window_holds_back_at_most_one_bucket(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(
        r, "100000/d", algorithm="sliding_window", name="big", prefix=prefix, precision=24
    )
    assert lim.acquire("a", 100_000, now=T0).allowed
    d = lim.acquire("a", now=T0 + 10)
    assert not d.allowed and 86_400 <= d.retry_after <= 86_400 + 3_600


def test_server_clock(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/s")
    d = lim.acquire("a")
    server = r.time()
    assert abs(d.now - (server[0] + server[1] / 1e6)) < 1.0
    assert d.slot is not None


def test_sliding_window_with_thousands_of_buckets(r: redis.Redis, prefix: str) -> None:
    rules = "100000/d, 99999/d, 99998/d"
    lim = Limiter(r, rules, algorithm="sliding_window", name="many", prefix=prefix, precision=1000)
    step = 86.4  # one bucket each
    for j in range(1000):
        assert lim.acquire("a", now=T0 + j * step).allowed
    assert len(r.get(lim.keys("a")[0]) or b"") == 8 * (3 + 3 * 2 * 1000)  # packed in chunks
    assert [u.used for u in lim.usage("a", now=T0 + 999 * step).rules] == [1000] * 3
    used = [u.used for u in lim.usage("a", now=T0 + 1499 * step).rules]
    assert used[0] in (500, 501) and used == [used[0]] * 3  # the oldest half left the window
    assert lim.acquire("a", now=T0 + 1499 * step).allowed
    assert len(r.get(lim.keys("a")[0]) or b"") == 8 * (3 + 3 * 2 * (used[0] + 1))


def test_wrong_key_types_and_corrupt_state(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "5/s")
    state, block = lim.keys("a")
    r.set(state, "not a list")
    with pytest.raises(StateError, match="another type"):
        lim.acquire("a")
    assert r.get(state) == b"not a list"
    r.delete(state)
    r.rpush(state, "1", "f", "garbage")
    with pytest.raises(StateError, match="corrupt"):
        lim.acquire("a")
    assert r.lrange(state, 0, -1) == [b"1", b"f", b"garbage"]
    r.delete(state)
    r.rpush(block, "x")
    with pytest.raises(StateError):
        lim.acquire("a")
    # packed states that do not fit the rules (they changed) start afresh
    gcra = Limiter(r, "5/s, 9/m", algorithm="gcra", name="g", prefix=prefix)
    r.set(gcra.keys("a")[0], "12:abc")
    assert gcra.acquire("a").allowed
    # the sliding window's buckets must add up to the bytes stored
    window = Limiter(r, "5/s, 9/m", algorithm="sliding_window", name="w", prefix=prefix)
    assert window.acquire("a", now=T0).allowed
    raw = r.get(window.keys("a")[0])
    assert raw is not None and len(raw) == 8 * (2 + 2 * 2)  # two rules, one bucket each
    for bad in (raw[:-8], raw + b"x", struct.pack("<2d", -1, 0), struct.pack("<2d", 0.5, 0)):
        r.set(window.keys("a")[0], bad)
        with pytest.raises(StateError, match="corrupt sliding window"):
            window.acquire("a", now=T0)
        assert r.get(window.keys("a")[0]) == bad


def test_algorithm_choice_is_validated() -> None:
    with pytest.raises(ConfigError, match="sliding_window"):
        Limiter(None, "1/s", name="x", algorithm="magic")
    with pytest.raises(RuleError, match="sliding_window"):
        Limiter(None, "100000/d", name="x")
    with pytest.raises(ConfigError, match="precision"):
        Limiter(None, "1/s", name="x", precision=10)
    with pytest.raises(ConfigError, match="precision"):
        Limiter(None, "1/s", name="x", algorithm="sliding_window", precision=0)
    assert Limiter(None, "1/s", name="x", algorithm="leaky_bucket").algorithm is ALGORITHMS["gcra"]


def test_storage_unavailable(redis_server: object) -> None:
    from governor.embedded import free_port

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    with pytest.raises(StorageUnavailable, match="api"):
        Limiter(dead, "1/s", name="api").acquire("a")


def test_decoded_responses_client(redis_server: object, prefix: str) -> None:
    from support.servers import ServerHandle

    assert isinstance(redis_server, ServerHandle)
    client = redis.Redis.from_url(redis_server.url(0), decode_responses=True)
    lim = make(client, prefix, "1/s")
    lim.block("a", 5, "maintenance")
    assert lim.acquire("a").blocked == "maintenance"
    assert list(lim.subjects()) == ["a"]


def test_script_cache_flush_is_survived(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/s")
    assert lim.acquire("a", now=T0).allowed
    r.script_flush()
    assert not lim.acquire("a", now=T0).allowed


def test_a_far_booking_does_not_crowd_the_present(r: redis.Redis, prefix: str) -> None:
    """A booking an hour ahead (made because another limit binds) leaves this minute alone."""
    lim = make(r, prefix, "3/m")
    far = lim.reserve("q", now=T0, not_before=T0 + 3600, tolerance=0.05)
    assert far.booked and far.slot and far.slot.start == T0 + 3600
    assert [lim.acquire("q", now=T0 + i).allowed for i in range(4)] == [True, True, True, False]
    d = lim.reserve("q", now=T0 + 4, tolerance=0.05)  # waits for this minute, not for the hour
    assert d.booked and d.slot and d.slot.start == T0 + 60
    assert lim.usage("q", now=T0 + 4).booked == 2
    assert lim.usage("q", now=T0 + 4).booked_for == pytest.approx(3596.05)  # the far one's end
    # and the far booking is still honoured: the window around it has room for two more only
    assert [lim.acquire("q", now=T0 + 3600 + 0.01 * i).allowed for i in range(3)] == [
        True,
        True,
        False,
    ]


@pytest.mark.parametrize("algorithm", ["gcra", "token_bucket", "fixed_window"])
def test_changed_rules_start_afresh(r: redis.Redis, prefix: str, algorithm: str) -> None:
    """Counters kept under one rule set are never read under another (e.g. 5/s -> 5/m)."""
    for _ in range(3):
        make(r, prefix, "5/s", algorithm).acquire("a", now=T0)
    d = make(r, prefix, "5/m", algorithm).acquire("a", now=T0)
    assert d.allowed and d.remaining == 4
    long_ago = make(r, prefix, "1/d", algorithm)
    assert long_ago.acquire("b", now=T0).allowed
    assert make(r, prefix, "10/s", algorithm).acquire("b", now=T0 + 1).allowed


def test_small_clocks_keep_the_log_intact(r: redis.Redis, prefix: str) -> None:
    """A base near zero (monotonic clocks, simulations) can equal a stamp; refunds by value
    must never remove it."""
    lim = make(r, prefix, "1/s")
    decisions = [lim.acquire("a", now=t) for t in (1, 2, 3)]
    lim.refund("a", decisions[1], now=3)
    assert lim.acquire("a", now=4).allowed
    assert lim.usage("a", now=4).rules[0].used == 1


@pytest.mark.parametrize("algorithm", ALL)
def test_a_peek_holds_nothing_to_refund(r: redis.Redis, prefix: str, algorithm: str) -> None:
    lim = make(r, prefix, "2/m", algorithm)
    peeked = lim.peek("a", now=T0)
    assert peeked.allowed and peeked.slot is None
    assert lim.acquire("a", now=T0).allowed and lim.acquire("a", now=T0).allowed
    lim.refund("a", peeked, now=T0)
    assert not lim.acquire("a", now=T0).allowed


def test_gcra_refunds_only_the_newest(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/s", "gcra")
    assert lim.acquire("a", now=T0).allowed
    first = lim.reserve("a", now=T0)
    second = lim.reserve("a", now=T0)
    assert first.slot and second.slot and second.slot.start == T0 + 2
    lim.refund("a", first, now=T0)  # not the newest: stays spent
    third = lim.reserve("a", now=T0)
    assert third.slot and third.slot.start == T0 + 3
    lim.refund("a", third, now=T0)  # the newest: given back
    again = lim.reserve("a", now=T0)
    assert again.slot and again.slot.start == T0 + 3


@pytest.mark.parametrize("algorithm", ["token_bucket", "fixed_window", "sliding_window"])
def test_not_before_needs_an_algorithm_that_books(
    r: redis.Redis, prefix: str, algorithm: str
) -> None:
    with pytest.raises(ConfigError, match="not_before"):
        make(r, prefix, "1/s", algorithm).reserve("a", not_before=T0 + 100, now=T0)


def test_block_reasons_are_kept_whole(r: redis.Redis, prefix: str) -> None:
    lim = make(r, prefix, "1/s")
    lim.block("a", 10, "chargeback\x00 fraud  x", now=T0)
    assert lim.acquire("a", now=T0).blocked == "chargeback\x00 fraud  x"
    assert lim.usage("a", now=T0).blocked == "chargeback\x00 fraud  x"


def test_glob_characters_in_names_are_listed(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "1/s", name="api[v2]*?\\", prefix=prefix)
    lim.acquire("customer-42")
    assert list(lim.subjects()) == ["customer-42"]


@pytest.mark.parametrize("algorithm", ["sliding_log", "gcra"])
def test_usage_tells_how_far_bookings_reach(r: redis.Redis, prefix: str, algorithm: str) -> None:
    """A backlog of 20 bookings under 5/s reaches 4-5 s ahead, and both count all 20 (the
    sliding log keeps every entry that may still count, up to its cap)."""
    lim = make(r, prefix, "5/s", algorithm=algorithm)
    for _ in range(5):
        assert lim.acquire("q", now=T0).allowed
    slots = [lim.reserve("q", now=T0, tolerance=0.0).slot for _ in range(20)]
    assert all(s is not None for s in slots)
    last = max(s.start for s in slots if s is not None)
    usage = lim.usage("q", now=T0)
    assert usage.booked_for == pytest.approx(last - T0, abs=0.002)
    assert 3.0 <= usage.booked_for <= 5.0  # 20 more at 5/s, spaced W/N apart
    assert usage.booked == 20
    assert lim.usage("fresh", now=T0).booked_for == 0.0
