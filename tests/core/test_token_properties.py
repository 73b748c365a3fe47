"""Meters, weighted costs, settle and sync: every algorithm against its reference model.

Hypothesis drives random sequences through a limiter with one to three meters (explicit clock,
real Redis) and through the pure-Python models of tests/support/models.py; every decision, usage,
settle and sync must match exactly. A second property checks the promise itself: under the
sliding log and the sliding window, the units calls really used (estimates settled down to
their use) never pass a limit in any window.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from test_properties import WINDOWS_MS, as_tuple

from governor import CostError, Decision, Limiter, Rule
from support.models import MODELS, SlidingLog

US = 1_000_000
ALGORITHMS = list(MODELS)

meters_st = st.lists(
    st.lists(
        st.tuples(
            st.integers(1, 30),
            st.one_of(st.sampled_from(WINDOWS_MS), st.integers(1, 120_000)),
        ),
        min_size=1,
        max_size=3,
    ),
    min_size=1,
    max_size=3,
)
units_st = st.lists(
    st.one_of(st.just(0), st.just(1), st.integers(0, 12), st.integers(10, 30)),
    min_size=3,
    max_size=3,
)
used_st = st.lists(  # per meter: as estimated (None), less by this much (< 0), more (> 0)
    st.one_of(st.none(), st.integers(-30, -1), st.integers(1, 20)), min_size=3, max_size=3
)


def steps_st(books: bool, headroom: bool = False) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    ops = ["acquire", "acquire", "acquire", "peek", "refund", "usage", "settle", "settle", "sync"]
    if books:
        ops += ["reserve", "reserve", "claim", "claim", "lease"]
    dt = st.one_of(
        st.just(0),
        st.integers(0, 3_000),
        st.integers(0, 2 * US),
        st.integers(0, 90 * US),
        st.integers(-3_000, 0),  # the clock may step back
        st.sampled_from([3_600 * US, 86_400 * US]),
    )
    if headroom:  # syncs that find units, and decisions soon after them
        ops += ["sync", "sync", "sync", "acquire", "reserve"]
        dt = st.one_of(
            st.just(0), st.integers(0, 300_000), st.integers(0, 3 * US), st.integers(-3_000, 0)
        )
    step = st.tuples(
        dt,
        st.sampled_from(ops),
        units_st,
        st.booleans(),  # an integer cost (every meter) rather than a mapping
        st.sampled_from([0, 0, 0, 1]),  # subject
        st.sampled_from([0, 20_000, 300_000]),  # tolerance / span
        st.sampled_from([-1, 0, 500_000, 5 * US]),  # max_wait
        st.sampled_from([0, 1_000_000, 40 * US]),  # not_before offset
        st.integers(0, 100),  # which earlier reservation
        used_st,  # settle: units used per meter
        st.sampled_from([None, "a", "b"]),  # settle: the reservation's id (None: its slot)
        st.sampled_from([None, 0.0, 0.5, 30.0, 7_200.0]),  # sync: reset_in
    )
    return st.lists(step, min_size=4, max_size=40)


def sync_rule(limiter: Limiter, meter: int, reset_in: float | None) -> int:
    """The rule sync_remaining compares (1-based; 0: the meter's rule with the least room):
    the shortest window at least reset_in long, else the longest."""
    if reset_in is None:
        return 0
    mine = [(r.period, i) for i, r in enumerate(limiter.rules) if limiter._meter_of[i] == meter]
    longer = [p for p in mine if p[0] >= reset_in]
    return (min(longer) if longer else max(mine))[1] + 1


def run(
    r: redis.Redis,
    prefix: str,
    algo: str,
    meters: list[list[tuple[int, int]]],
    lease_us: int,
    steps: list[tuple[Any, ...]],
    start: int,
) -> None:
    names = [f"m{j}" for j in range(len(meters))]
    spec = {name: [Rule(n, ms / 1000) for n, ms in group] for name, group in zip(names, meters)}
    limiter = Limiter(
        r, spec, algorithm=algo, name="tok", prefix=prefix, settle_within=lease_us / US
    )
    flat = [(rule.limit, rule.period_us) for rule in limiter.rules]
    of = list(limiter._meter_of)
    models = [MODELS[algo](flat, of), MODELS[algo](flat, of)]
    held: list[list[Decision]] = [[], []]
    m = len(names)
    now = start
    for i, step in enumerate(steps):
        dt, op, units, whole, subj, tol, max_wait, nb, pick, used, ident, reset_in = step
        now += dt
        t = now / US
        model = models[subj]
        per_meter = tuple(units[:m])
        cost: Any = {name: u for name, u in zip(names, per_meter)}
        if whole:
            cost, per_meter = units[0], (units[0],) * m
        where = f"step {i}: {op} cost={cost} subject={subj} now={now}"
        if op == "usage":
            got = limiter.usage(subj, now=t)
            seen = [
                (u.used, round(u.retry_after * US), round(u.reset_after * US)) for u in got.rules
            ]
            assert seen == model.usage(now), where
            if algo == "sliding_log":
                assert got.booked == model.booked(now), where
            continue
        if op == "sync":
            j = pick % m
            remaining = units[1] * 3
            rule = sync_rule(limiter, j, reset_in)
            # as of: now, a moment before it (0, 2 or 30 s), or a held reservation's admission
            as_of: int | None = None
            if pick % 3 == 1:
                as_of = now - tol * 100
            elif pick % 3 == 2 and held[subj]:
                slot = held[subj][pick % len(held[subj])].slot
                as_of = None if slot is None else slot.end_us
            got_units = limiter.sync_remaining(
                subj,
                remaining,
                meter=names[j],
                reset_in=reset_in,
                now=t,
                as_of=None if as_of is None else as_of / US,
                transit=tol / US,
            )
            assert got_units == model.sync(now, j, rule, remaining, as_of, tol), where
            continue
        if op in ("refund", "settle", "claim"):
            if not held[subj]:
                continue
            d = held[subj][pick % len(held[subj])]
            assert d.slot is not None
            estimate = tuple(u for _, u in d.units)
            if op == "refund":
                limiter.refund(subj, d, now=t)
                model.refund(d.slot.start_us, d.slot.end_us, estimate, now)
                held[subj].remove(d)
                continue
            if op == "settle":
                actual = tuple(e if u is None else max(0, e + u) for e, u in zip(estimate, used))
                use = {name: a for name, a, u in zip(names, actual, used) if u is not None}
                s = limiter.settle(subj, d, use, id=ident, now=t)
                key = ident or f"slot:{d.slot.start_us}:{d.slot.end_us}"
                status, back, charged = model.settle(
                    now, (d.slot.start_us, d.slot.end_us), estimate, actual, lease_us, key
                )
                assert (s.status, list(s.given_back), list(s.charged)) == (
                    status,
                    back,
                    charged,
                ), where
                continue
            got = limiter.claim(subj, d.slot, dict(d.units), now=t, max_wait=None)
            e = model.decide(
                "claim",
                now,
                estimate,
                tol=d.slot.end_us - d.slot.start_us,
                slot=(d.slot.start_us, d.slot.end_us),
            )
            per_meter = estimate
        else:
            fits = all(per_meter[of[k]] <= rule.limit for k, rule in enumerate(limiter.rules)) and (
                whole or any(per_meter)
            )
            kwargs: dict[str, Any] = {"now": t}
            if op == "reserve":
                kwargs.update(
                    not_before=(now + nb) / US if nb else None,
                    max_wait=None if max_wait < 0 else max_wait / US,
                    tolerance=tol / US,
                )
            elif op == "lease":
                kwargs["span"] = tol / US
            if not fits or (whole and units[0] == 0):
                with pytest.raises(CostError):
                    getattr(limiter, op)(subj, cost, **kwargs)
                continue
            got = getattr(limiter, op)(subj, cost, **kwargs)
            if op == "reserve":
                e = model.decide(
                    "reserve",
                    now,
                    per_meter,
                    not_before=now + nb if nb else 0,
                    max_wait=max_wait,
                    tol=tol,
                )
            elif op == "lease":
                e = model.decide("lease", now, per_meter, tol=tol)
            else:
                e = model.decide(op, now, per_meter)
        seen_d = as_tuple(got, limiter.rules)
        if seen_d[2] and e[2] and limiter.rules[seen_d[2] - 1] == limiter.rules[e[2] - 1]:
            seen_d = (*seen_d[:2], e[2], *seen_d[3:])
        assert seen_d == e, where
        assert dict(got.units) == dict(zip(names, per_meter)), where
        if got.slot and op != "peek" and not (op == "claim" and got.slot == d.slot):
            held[subj].append(got)


@pytest.mark.parametrize("algo", ALGORITHMS)
@given(data=st.data())
def test_meters_match_model(r: redis.Redis, prefix: str, algo: str, data: st.DataObject) -> None:
    meters = data.draw(meters_st, label="meters")
    if algo == "token_bucket":
        meters = [[(n, max(ms, 1)) for n, ms in group] for group in meters]
    steps = data.draw(steps_st(MODELS[algo].books), label="steps")
    lease = data.draw(st.sampled_from([1 * US, 30 * US, 600 * US]), label="lease")
    start = data.draw(st.integers(1_600_000_000 * US, 1_900_000_000 * US), label="start")
    run(r, f"{prefix}{uuid.uuid4().hex[:8]}", algo, meters, lease, steps, start)


@given(data=st.data())
def test_headroom_matches_model(r: redis.Redis, prefix: str, data: st.DataObject) -> None:
    """The sliding log's headroom (header syncs that found another client spending): syncs
    often, decisions soon after them, against the model."""
    meters = data.draw(meters_st, label="meters")
    steps = data.draw(steps_st(True, headroom=True), label="steps")
    lease = data.draw(st.sampled_from([1 * US, 30 * US, 600 * US]), label="lease")
    start = data.draw(st.integers(1_600_000_000 * US, 1_900_000_000 * US), label="start")
    run(r, f"{prefix}{uuid.uuid4().hex[:8]}", "sliding_log", meters, lease, steps, start)


def test_headroom_search_settles_at_its_most(
    r: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the headroom grows as fast as the log empties (a window of one-unit entries, and
    a reading that found another client spending half the limit), the search for a later
    moment stops moving one entry at a time and takes the headroom at its most: a moment whose
    room holds any headroom (here also the earliest: when the reading's charge leaves the
    window), admissible then, as the model says."""
    lim = Limiter(r, "2000/10s", name="most", prefix=prefix)
    model = SlidingLog([(2_000, 10 * US)])
    mosts = []
    real_most = SlidingLog._most
    monkeypatch.setattr(
        SlidingLog, "_most", lambda self, i, c: mosts.append(i) or real_most(self, i, c)
    )
    t0 = 1_700_000_000 * US
    for j in range(1_000):
        d = lim.acquire("s", 1, now=(t0 + j * 10_000) / US)
        assert as_tuple(d, lim.rules) == model.decide("acquire", t0 + j * 10_000, 1)
    reading = t0 + 9_990_000
    got = lim.sync_remaining("s", 1, now=(reading + 5_000) / US, as_of=reading / US)
    assert got == model.sync(reading + 5_000, 0, 0, 1, reading) == 999
    for now in (t0 + 10 * US, t0 + 10 * US + 1, t0 + 10 * US + 1_000):
        d = lim.acquire("s", 1, now=now / US)
        assert as_tuple(d, lim.rules) == model.decide("acquire", now, 1)
    assert not d.allowed and mosts
    then = now + round(d.retry_after * US)
    d = lim.acquire("s", 1, now=then / US)
    assert d.allowed and as_tuple(d, lim.rules) == model.decide("acquire", then, 1)


def assert_weighted_windows(
    starts: list[tuple[int, tuple[int, ...]]], limiter: Limiter, where: str
) -> None:
    """No window of W microseconds holds more than N units of the rule's meter."""
    starts = sorted(starts)
    for rule, m in zip(limiter.rules, limiter._meter_of):
        for j, (t, _) in enumerate(starts):
            inside = sum(u[m] for s, u in starts[j:] if s < t + rule.period_us)
            assert inside <= rule.limit, f"{where}: {inside} units within {rule.text}"


@pytest.mark.parametrize("algo", ["sliding_log", "sliding_window"])
@given(data=st.data())
def test_used_units_never_exceed_a_window(
    r: redis.Redis, prefix: str, algo: str, data: st.DataObject
) -> None:
    """Calls reserve an estimate, start (now, or on a booked slot), and settle with what they
    used (no more than estimated): the units really used never pass a limit in any window."""
    meters = data.draw(meters_st, label="meters")
    names = [f"m{j}" for j in range(len(meters))]
    spec = {name: [Rule(n, ms / 1000) for n, ms in group] for name, group in zip(names, meters)}
    limiter = Limiter(r, spec, algorithm=algo, name="inv", prefix=f"{prefix}{uuid.uuid4().hex[:8]}")
    books = algo == "sliding_log"
    now = data.draw(st.integers(1_600_000_000 * US, 1_900_000_000 * US), label="start")
    started: dict[int, tuple[int, tuple[int, ...]]] = {}  # id -> (start, units used)
    running: list[tuple[int, Decision]] = []  # started, not settled yet
    pending: list[Decision] = []  # bookings not claimed yet
    ops = ["acquire", "acquire", "settle", "settle"] + (["reserve", "claim"] if books else [])
    smallest = [
        min(r.limit for r, k in zip(limiter.rules, limiter._meter_of) if k == j)
        for j in range(len(names))
    ]
    for i in range(data.draw(st.integers(1, 50), label="length")):
        now += data.draw(
            st.one_of(
                st.just(0), st.integers(0, 5_000), st.integers(0, 3 * US), st.integers(0, 120 * US)
            ),
            label="dt",
        )
        op = data.draw(st.sampled_from(ops), label="op")
        where = f"step {i} {op}"
        if op in ("acquire", "reserve"):
            units = [data.draw(st.integers(0, low), label="units") for low in smallest]
            if not any(units):
                continue
            cost = dict(zip(names, units))
            if op == "acquire":
                d = limiter.acquire("s", cost, now=now / US)
            else:
                tol = data.draw(st.sampled_from([0, 1_000, 50_000]), label="tol")
                d = limiter.reserve("s", cost, now=now / US, tolerance=tol / US)
                if d.booked:
                    pending.append(d)
                    continue
            if d.allowed:
                started[i] = (now, tuple(units))
                running.append((i, d))
        elif op == "claim" and pending:
            d = pending.pop(data.draw(st.integers(0, len(pending) - 1), label="which"))
            assert d.slot is not None
            now = max(now, data.draw(st.sampled_from([d.slot.start_us, d.slot.end_us]), label="at"))
            c = limiter.claim("s", d.slot, dict(d.units), now=now / US)
            if c.allowed:
                started[i] = (now, tuple(u for _, u in d.units))
                running.append((i, c))
            elif c.booked:
                pending.append(c)
        elif op == "settle" and running:
            ident, d = running.pop(data.draw(st.integers(0, len(running) - 1), label="which"))
            estimate = started[ident][1]
            used = tuple(data.draw(st.integers(0, e), label="used") for e in estimate)
            limiter.settle("s", d, dict(zip(names, used)), id=str(ident), now=now / US)
            started[ident] = (started[ident][0], used)
        assert_weighted_windows(list(started.values()), limiter, where)


def test_math_inf_is_never_a_wait_of_a_meter_limiter(r: redis.Redis, prefix: str) -> None:
    """(A reservation a rule can never admit raises CostError; one that fits always gets a
    finite wait.)"""
    lim = Limiter(r, {"requests": "2/s", "tokens": "100/m"}, name="x", prefix=prefix)
    d = lim.acquire("s", {"requests": 2, "tokens": 100}, now=1_700_000_000)
    d = lim.acquire("s", {"requests": 1, "tokens": 1}, now=1_700_000_000)
    assert not d.allowed and d.retry_after == 60.0 and not math.isinf(d.retry_after)
    with pytest.raises(CostError, match="more than rule '100/m'"):
        lim.acquire("s", {"tokens": 101})
