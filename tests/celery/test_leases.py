"""A pool process's admission leases (governor.celery.decisions.leases) against a real Redis:
when they are taken, how they grow and shrink, what is given back. The local deadline runs on a
test clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from governor import Limiter, StorageUnavailable
from governor.caps import new_token
from governor.celery.config.limit_config import limit_config
from governor.celery.config.settings import load_settings
from governor.celery.config.store import Store
from governor.celery.decisions.decider import Decider
from governor.celery.decisions.leases import AdmissionLeases
from governor.celery.types import LimitConfig, LimitSpec, WaitState, Who
from governor.embedded import free_port
from governor.rules import parse_rules
from support.servers import ServerHandle

Made = Callable[[AdmissionLeases], AdmissionLeases]


@pytest.fixture
def made() -> Iterator[Made]:
    """AdmissionLeases that give back what they hold and stop their timer when the test ends."""
    every: list[AdmissionLeases] = []

    def make(leases: AdmissionLeases) -> AdmissionLeases:
        every.append(leases)
        return leases

    yield make
    for leases in every:
        leases.release()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def limit(
    r: redis.Redis, prefix: str, name: str, rules: str, algorithm: str = "sliding_log"
) -> tuple[Limiter, LimitSpec]:
    lim = Limiter(r, rules, name=name, prefix=prefix, algorithm=algorithm)
    return lim, LimitSpec("queue", name, LimitConfig(parse_rules(rules), algorithm), "q")


def used(lim: Limiter) -> int:
    return lim.usage("q").rules[0].used


def seen(leases: AdmissionLeases, pair: tuple[Limiter, LimitSpec]) -> None:
    """A decision without a lease, which tells the leases how much room there is."""
    lim, spec = pair
    d = lim.acquire(spec.subject)
    assert d.allowed
    leases.observe([(lim, spec, d)])


def test_leases_need_room_then_grow_while_they_are_used_up(
    r: redis.Redis, prefix: str, made: Made
) -> None:
    clock = Clock()
    leases = made(AdmissionLeases(0.2, clock))
    pair = limit(r, prefix, "roomy", "1000/s")
    lim, _ = pair
    assert leases.take([pair], 1) is None
    assert leases.grant([pair], 1) is None  # no room seen yet
    seen(leases, pair)
    first = leases.grant([pair], 1)
    assert first is not None and first.allowed and first.held[0][2].cost == 3  # 1 + 2 leased
    assert [leases.take([pair], 1) is not None for _ in range(3)] == [True, True, False]
    second = leases.grant([pair], 1)  # the first was used up in time: twice as many
    assert second is not None and second.held[0][2].cost == 1 + 4
    assert used(lim) == 1 + 3 + 5
    assert lim.usage("q").booked == 3 + 5  # counted at the end of their span


def test_an_expired_lease_gives_back_what_it_did_not_use(
    r: redis.Redis, prefix: str, made: Made
) -> None:
    clock = Clock()
    leases = made(AdmissionLeases(0.2, clock))
    pair = limit(r, prefix, "roomy", "1000/s")
    lim, _ = pair
    seen(leases, pair)
    assert leases.grant([pair], 1) is not None  # 1 + 2
    assert leases.take([pair], 1) is not None
    clock.t += 0.2  # past the span: the last leased unit is not used
    assert leases.take([pair], 1) is None
    again = leases.grant([pair], 1)
    assert again is not None and again.held[0][2].cost == 1 + 2  # what was used, at least 2
    assert used(lim) == 1 + (3 - 1) + 3


def test_tight_limits_are_asked_every_time(r: redis.Redis, prefix: str, made: Made) -> None:
    leases = made(AdmissionLeases(0.2, Clock()))
    pair = limit(r, prefix, "tight", "30/s")
    seen(leases, pair)  # 29 left: a lease of 2 would take more than a sixteenth
    assert leases.grant([pair], 1) is None
    off = made(AdmissionLeases(0.0, Clock()))
    roomy = limit(r, prefix, "roomy", "1000/s")
    seen(off, roomy)
    assert off.grant([roomy], 1) is None and off.take([roomy], 1) is None


def test_every_limit_leases_or_none_does(r: redis.Redis, prefix: str, made: Made) -> None:
    leases = made(AdmissionLeases(0.2, Clock()))
    a, b = limit(r, prefix, "a", "1000/s"), limit(r, prefix, "b", "1000/s", "gcra")
    seen(leases, a)
    seen(leases, b)
    b[0].block("q", 60, "maintenance")
    assert leases.grant([a, b], 1) is None  # b denies: a's lease is given back whole
    assert used(a[0]) == 1
    b[0].unblock("q")
    assert leases.grant([a, b], 1) is None  # b's denial left no room to lease from
    seen(leases, b)
    outcome = leases.grant([a, b], 1)
    assert outcome is not None and [d.cost for _, _, d in outcome.held] == [3, 3]
    assert leases.take([a], 1) is not None  # a's lease serves a task under a alone
    assert leases.take([a, b], 1) is not None
    assert leases.take([a, b], 1) is None  # a has none left


def test_shutdown_gives_back_what_is_left(r: redis.Redis, prefix: str, made: Made) -> None:
    leases = made(AdmissionLeases(0.2, Clock()))
    pair = limit(r, prefix, "roomy", "1000/s")
    seen(leases, pair)
    assert leases.grant([pair], 2) is not None  # 2 + 2
    leases.release()
    assert used(pair[0]) == 1 + 2
    assert leases.take([pair], 1) is None


def test_redis_failing_mid_grant_gives_back_what_was_leased(
    r: redis.Redis, prefix: str, made: Made
) -> None:
    leases = made(AdmissionLeases(0.2, Clock()))
    a = limit(r, prefix, "a", "1000/h")
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    b_lim = Limiter(dead, "1000/h", name="b", prefix=prefix)
    b = (b_lim, LimitSpec("queue", "b", a[1].config, "q"))
    seen(leases, a)
    room = a[0].peek("q")  # a decision saying there is room, as b's last one did
    leases.observe([(b_lim, b[1], room)])
    with pytest.raises(StorageUnavailable):
        leases.grant([a, b], 1)
    assert used(a[0]) == 1  # a's lease was given back
    assert leases.take([a], 1) is None


def test_expired_leases_of_other_subjects_are_given_back(
    r: redis.Redis, prefix: str, made: Made
) -> None:
    """Per-key limits see subjects that never come back, and a process may go idle: a timer
    sweeps expired leases and gives back what they did not use."""
    clock = Clock()
    leases = made(AdmissionLeases(0.2, clock))
    lim = Limiter(r, "1000/h", name="per-key", prefix=prefix)
    config = LimitConfig(parse_rules("1000/h"), "sliding_log")
    one = (lim, LimitSpec("key", "per-key", config, "one"))
    two = (lim, LimitSpec("key", "per-key", config, "two"))
    for pair in (one, two):
        seen(leases, pair)
    assert leases.grant([one], 1) is not None  # 1 + 2 for "one", never used
    assert leases._due is not None  # the sweeper looks a span after the lease ends
    clock.t += 0.3
    assert leases.grant([two], 1) is not None
    leases.sweep()  # what the timer runs
    assert lim.usage("one").rules[0].used == 1 + 1  # the 2 leased units came back
    assert lim.usage("two").rules[0].used == 1 + 3  # still leased
    leases.release()
    assert lim.usage("two").rules[0].used == 1 + 1


def test_the_span_follows_the_shortest_window(r: redis.Redis, prefix: str, made: Made) -> None:
    leases = made(AdmissionLeases(0.2, Clock()))
    roomy = limit(r, prefix, "roomy", "1000/s, 20000/h")
    assert leases.span_of(roomy[0]) == 1 / 16  # a sixteenth of a second, not 0.2 s
    seen(leases, roomy)
    outcome = leases.grant([roomy], 1)
    assert outcome is not None
    slot = outcome.held[0][2].slot
    assert slot is not None and slot.end_us - slot.start_us == pytest.approx(62_500, abs=1_000)
    fast = limit(r, prefix, "fast", "100/50ms")  # a sixteenth of 50 ms: too short to lease
    assert leases.span_of(fast[0]) == 0
    seen(leases, fast)
    assert leases.grant([fast], 1) is None


def test_leases_hold_whole_tasks(r: redis.Redis, prefix: str, made: Made) -> None:
    leases = made(AdmissionLeases(0.2, Clock()))
    pair = limit(r, prefix, "roomy", "1000/h")
    seen(leases, pair)
    outcome = leases.grant([pair], 3)
    assert outcome is not None and outcome.held[0][2].cost == 3 + 2 * 3
    assert [leases.take([pair], 3) is not None for _ in range(3)] == [True, True, False]
    again = leases.grant([pair], 3)  # used up: twice as many tasks
    assert again is not None and again.held[0][2].cost == 3 + 4 * 3


def test_a_limit_without_room_keeps_the_other_leases(
    r: redis.Redis, prefix: str, made: Made
) -> None:
    leases = made(AdmissionLeases(0.2, Clock()))
    queue = limit(r, prefix, "queue", "1000/h")
    seen(leases, queue)
    assert leases.grant([queue], 1) is not None  # 1 + 2
    key = limit(r, prefix, "per-key", "5/h")
    seen(leases, key)  # 4 left: no lease from it
    assert leases.take([queue, key], 1) is None
    assert leases.grant([queue, key], 1) is None  # asks Redis as usual ...
    assert leases.take([queue], 1) is not None  # ... and the queue's lease is still there
    assert used(queue[0]) == 1 + 3


def test_a_denied_lease_forgets_the_room(r: redis.Redis, prefix: str, made: Made) -> None:
    leases = made(AdmissionLeases(0.2, Clock()))
    pair = limit(r, prefix, "roomy", "1000/h")
    seen(leases, pair)
    pair[0].block("q", 60)
    assert leases.grant([pair], 1) is None
    pair[0].unblock("q")
    assert leases.grant([pair], 1) is None  # no room known until a decision says so


def _capped_decider(
    redis_server: ServerHandle, prefix: str, cap: int
) -> tuple[Decider, list[LimitSpec]]:
    """A pool process's decider (leases of 0.2 s) and a call's limits: a queue quota that
    never binds, and a concurrency cap of ``cap`` on the task (no rate of its own)."""
    settings = load_settings({"governor_redis_url": redis_server.url(0), "governor_prefix": prefix})
    decider = Decider(settings, Store(settings))
    quota = LimitSpec("queue", "queue", limit_config("100000/s", "gcra", "q"), "q")
    capped = LimitSpec("task", "task", limit_config({"concurrency": cap}, "gcra", "t"), "t")
    return decider, [quota, capped]


def holding(cap: Limiter, spec: LimitSpec) -> set[str]:
    return {h.holder for h in cap.holders(spec.subject).holders}


def _who(n: int) -> Who:
    return Who(f"task-{n}:0", new_token(), "test")


def test_a_capped_call_takes_its_rates_from_leases_and_only_the_slot_from_redis(
    redis_server: ServerHandle, prefix: str
) -> None:
    decider, specs = _capped_decider(redis_server, prefix, cap=3)
    [(quota, _), (cap, capped)] = decider.limiters(specs)
    try:
        outcomes = [
            decider.decide(specs, 1, WaitState(), lease=True, who=_who(n)) for n in range(6)
        ]
        assert [o.allowed for o in outcomes] == [True, True, True, False, False, False]
        assert all(o.decision is not None and o.decision.capped == "full" for o in outcomes[3:])
        assert holding(cap, capped) == {f"task-{n}:0" for n in range(3)}
        # the first call saw the quota's room, the second leased it: the rest took no quota
        # call of their own (one script each, the cap's), and the turned-away calls' units went
        # back to the lease
        leased = decider.leases._held[(quota, "q")]
        assert leased.size - leased.left == 1  # of the three admitted after the first lease
        for o in outcomes[:3]:  # each admitted call holds the quota's decision and its slot
            assert [spec.name for _, spec, _ in o.held] == ["queue", "task"]
            assert o.held[1][2].hold is not None
        decider.refund(outcomes[0].held, 1)  # the body ended: its slot goes back
        again = decider.decide(specs, 1, WaitState(), lease=True, who=_who(9))
        assert again.allowed and holding(cap, capped) == {"task-1:0", "task-2:0", "task-9:0"}
    finally:
        decider.leases.release()


def test_a_full_cap_gives_the_leased_units_back(r: redis.Redis, prefix: str, made: Made) -> None:
    clock = Clock()
    leases = made(AdmissionLeases(0.2, clock))
    pair = limit(r, prefix, "roomy", "1000/s")
    seen(leases, pair)
    granted = leases.grant([pair], 1)
    assert granted is not None
    lease = leases._held[(pair[0], "q")]
    assert lease.left == 2
    assert leases.take([pair], 1) is not None and lease.left == 1
    leases.untake([pair], 1)  # the cap turned the task away: its unit is the lease's again
    assert lease.left == 2
    leases.untake([pair], 5)  # never more than the lease's decision counted
    assert lease.left == lease.decision.cost == 3
