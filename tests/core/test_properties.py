"""Every algorithm, decision by decision, against its pure-Python reference model (models.py).

Hypothesis drives random sequences of (time step, operation, cost, subject) through the Redis
limiter (explicit clock) and the model; every field of every decision must match exactly.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from governor import Decision, Limiter, Rule, Slot
from support.models import MODELS

US = 1_000_000
WINDOWS_MS = [1, 7, 250, 1000, 1500, 60_000, 3_600_000, 86_400_000]

rules_st = st.lists(
    st.tuples(
        st.integers(1, 9),
        st.one_of(st.sampled_from(WINDOWS_MS), st.integers(1, 120_000)),
    ),
    min_size=1,
    max_size=4,
)


long_rules_st = st.lists(  # logs longer than the first read of the sliding log (64 entries)
    st.tuples(st.integers(50, 150), st.sampled_from(WINDOWS_MS[3:])),
    min_size=1,
    max_size=3,
)


def steps_st(books: bool, big: bool = False) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    ops = ["acquire", "acquire", "acquire", "peek", "refund", "usage"]
    if books:
        ops += ["reserve", "reserve", "claim", "claim", "lease"]
    dt = st.one_of(
        st.just(0),
        st.integers(0, 3_000),
        st.integers(0, 2 * US),
        st.integers(0, 90 * US),
        st.integers(-3_000, 0),  # the clock may step back
        st.sampled_from([3_600 * US, 86_400 * US, 26 * 86_400 * US]),
    )
    step = st.tuples(
        dt,
        st.sampled_from(ops),
        st.one_of(st.just(1), st.integers(1, 4), st.integers(1, 40 if big else 12)),
        st.integers(0, 1),  # subject
        st.sampled_from([0, 20_000, 300_000]),  # tolerance
        st.sampled_from([-1, 0, 500_000, 5 * US]),  # max_wait
        st.sampled_from([0, 1_000_000, 40 * US]),  # not_before offset
        st.integers(0, 100),  # which earlier slot to claim / refund
    )
    return st.lists(step, min_size=1, max_size=40)


def as_tuple(d: Decision, rules: tuple[Rule, ...]) -> tuple[Any, ...]:
    retry = -1 if d.retry_after == math.inf else round(d.retry_after * US)
    rule = 0 if d.rule is None else rules.index(d.rule) + 1
    # a rule may appear twice; the model reports the first index with the same value
    slot = (d.slot.start_us, d.slot.end_us) if d.slot else (0, 0)
    return (d.allowed, retry, rule, d.remaining, round(d.reset_after * US), *slot)


def run_scenario(
    r: redis.Redis,
    prefix: str,
    algo: str,
    rules_spec: list[tuple[int, int]],
    steps: list[tuple[Any, ...]],
    start: int,
) -> None:
    rules = [Rule(limit, ms / 1000) for limit, ms in rules_spec]
    spec = [(rule.limit, rule.period_us) for rule in rules]
    limiter = Limiter(r, rules, algorithm=algo, name="prop", prefix=prefix)
    models = [MODELS[algo](spec), MODELS[algo](spec)]
    slots: list[list[tuple[Slot, int]]] = [[], []]
    now = start
    for i, (dt, op, cost, subj, tol, max_wait, nb, pick) in enumerate(steps):
        now += dt
        model = models[subj]
        t = now / US
        where = f"step {i}: {op} cost={cost} subject={subj} now={now}"
        if op == "usage":
            got = limiter.usage(subj, now=t)
            expected = model.usage(now)
            seen = [
                (u.used, round(u.retry_after * US), round(u.reset_after * US)) for u in got.rules
            ]
            assert seen == expected, where
            continue
        if op in ("claim", "refund"):
            if not slots[subj]:
                continue
            slot, slot_cost = slots[subj][pick % len(slots[subj])]
            if op == "refund":
                limiter.refund(subj, slot, slot_cost, now=t)
                model.refund(slot.start_us, slot.end_us, slot_cost, now)
                slots[subj].remove((slot, slot_cost))
                continue
            d = limiter.claim(subj, slot, slot_cost, now=t, max_wait=None)
            e = model.decide(
                "claim",
                now,
                slot_cost,
                tol=slot.end_us - slot.start_us,
                slot=(slot.start_us, slot.end_us),
            )
            cost = slot_cost
        elif op == "reserve":
            mw = None if max_wait < 0 else max_wait / US
            d = limiter.reserve(
                subj,
                cost,
                now=t,
                not_before=(now + nb) / US if nb else None,
                max_wait=mw,
                tolerance=tol / US,
            )
            e = model.decide(
                "reserve", now, cost, not_before=now + nb if nb else 0, max_wait=max_wait, tol=tol
            )
        elif op == "lease":
            d = limiter.lease(subj, cost, span=tol / US, now=t)
            e = model.decide("lease", now, cost, tol=tol)
        else:
            d = getattr(limiter, op)(subj, cost, now=t)
            e = model.decide(op, now, cost)
        got = as_tuple(d, limiter.rules)
        if got[2] and e[2] and limiter.rules[got[2] - 1] == limiter.rules[e[2] - 1]:
            got = (*got[:2], e[2], *got[3:])
        assert got == e, where
        if d.slot and op != "peek" and not (op == "claim" and d.slot == slot):
            slots[subj].append((d.slot, cost))


@pytest.mark.parametrize("algo", list(MODELS))
@given(data=st.data())
def test_matches_model(r: redis.Redis, prefix: str, algo: str, data: st.DataObject) -> None:
    rules_spec = data.draw(rules_st, label="rules")
    steps = data.draw(steps_st(MODELS[algo].books), label="steps")
    start = data.draw(st.integers(1_600_000_000 * US, 1_900_000_000 * US), label="start")
    run_scenario(r, f"{prefix}{uuid.uuid4().hex[:8]}", algo, rules_spec, steps, start)


@given(data=st.data())
def test_long_sliding_logs_match_model(r: redis.Redis, prefix: str, data: st.DataObject) -> None:
    rules_spec = data.draw(long_rules_st, label="rules")
    steps = data.draw(steps_st(True, big=True), label="steps")
    start = data.draw(st.integers(1_600_000_000 * US, 1_900_000_000 * US), label="start")
    run_scenario(r, f"{prefix}{uuid.uuid4().hex[:8]}", "sliding_log", rules_spec, steps, start)


def assert_windows(starts: list[int], rules: list[tuple[int, int]], where: str) -> None:
    """No window of W microseconds holds more than N of the start times."""
    starts = sorted(starts)
    for limit, window in rules:
        for j in range(len(starts) - limit):
            assert starts[j + limit] - starts[j] >= window, (
                f"{where}: {limit + 1} starts within {starts[j + limit] - starts[j]}us "
                f"under {limit}/{window}us"
            )


@pytest.mark.parametrize("algo", ["sliding_log", "sliding_window"])
@given(data=st.data())
def test_actual_starts_never_exceed_a_window(
    r: redis.Redis, prefix: str, algo: str, data: st.DataObject
) -> None:
    """Whatever happens (refunds, bookings claimed on time, late or never), the moments work
    actually starts never put more than N in any window of W."""
    rules = [Rule(n, ms / 1000) for n, ms in data.draw(rules_st, label="rules")]
    spec = [(rule.limit, rule.period_us) for rule in rules]
    limiter = Limiter(
        r, rules, algorithm=algo, name="inv", prefix=f"{prefix}{uuid.uuid4().hex[:8]}"
    )
    books = algo == "sliding_log"
    now = data.draw(st.integers(1_600_000_000 * US, 1_900_000_000 * US), label="start")
    started: dict[int, tuple[int, int]] = {}  # id -> (start time, cost)
    admitted: list[tuple[int, Slot, int]] = []  # refundable immediate admissions
    pending: list[tuple[Slot, int]] = []  # bookings not yet claimed
    next_id = 0
    ops = ["acquire", "acquire", "refund"] + (
        ["reserve", "reserve", "claim", "claim", "lease"] if books else []
    )
    for i in range(data.draw(st.integers(1, 60), label="length")):
        now += data.draw(
            st.one_of(
                st.just(0), st.integers(0, 5_000), st.integers(0, 3 * US), st.integers(0, 120 * US)
            ),
            label="dt",
        )
        op = data.draw(st.sampled_from(ops), label="op")
        cost = data.draw(st.integers(1, 3), label="cost")
        where = f"step {i} {op}"
        d = None
        if op == "acquire":
            d = limiter.acquire("s", cost, now=now / US)
        elif op == "reserve":
            tol = data.draw(st.sampled_from([0, 1_000, 50_000, 2 * US]), label="tol")
            d = limiter.reserve("s", cost, now=now / US, tolerance=tol / US)
            if d.booked:
                pending.append((d.slot, cost))
                d = None
        elif op == "lease":
            span = data.draw(st.sampled_from([0, 1_000, 50_000, 2 * US]), label="span")
            d = limiter.lease("s", cost, span=span / US, now=now / US)
            if d.allowed:  # each unit starts some time within the span; some never do
                unused = data.draw(st.integers(0, cost), label="unused")
                for _ in range(cost - unused):
                    started[next_id] = (now + data.draw(st.integers(0, span), label="at"), 1)
                    next_id += 1
                if unused:
                    limiter.refund("s", d.slot, unused, now=now / US)
            d = None
        elif op == "claim" and pending:
            j = data.draw(st.integers(0, len(pending) - 1), label="which")
            slot, cost = pending.pop(j)
            # arrive on time, late, or early
            now = max(
                now,
                data.draw(
                    st.sampled_from(
                        [slot.start_us, slot.end_us, slot.end_us + 1, slot.start_us - 1]
                    ),
                    label="arrive",
                ),
            )
            d = limiter.claim("s", slot, cost, now=now / US)
            if d.allowed:
                started[next_id] = (now, cost)
                next_id += 1
                d = None
            elif d.booked and d.slot != slot:
                pending.append((d.slot, cost))  # late: booked again
                d = None
            elif d.booked:
                pending.append((slot, cost))  # early: keep waiting
                d = None
        elif op == "refund":
            if admitted and data.draw(st.booleans(), label="refund admission"):
                ident, slot, c = admitted.pop(data.draw(st.integers(0, len(admitted) - 1)))
                limiter.refund("s", slot, c, now=now / US)
                started.pop(ident)
            elif pending:
                slot, c = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
                limiter.refund("s", slot, c, now=now / US)
        if d is not None and d.allowed:
            started[next_id] = (now, cost)
            admitted.append((next_id, d.slot, cost))
            next_id += 1
        starts = [t for t, c in started.values() for _ in range(c)]
        assert_windows(starts, spec, where)
