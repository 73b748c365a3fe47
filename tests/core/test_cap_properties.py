"""Concurrency caps (cap.lua, cap_decide.lua, cap_ops.lua) against their reference model
(models.Cap), operation by operation, with an explicit clock: alone, and together with a
sliding log's rules (the cap is asked first; a slot is taken only when the rules admit).
tests/core/test_cap_model.py drives the same scripts as a protocol, with copies and a broker."""

from __future__ import annotations

import uuid
from typing import Any

import redis
from hypothesis import given
from hypothesis import strategies as st

from governor import Decision, Limiter, Rule, Slot
from governor.decision import Hold
from support.models import Cap, SlidingLog

US = 1_000_000
HOLDERS = ["a", "b", "c", "d", "e", "f"]


class NoRules:
    """A cap without rules: a booking (not_before ahead) or an early claim holds nothing."""

    def decide(self, op: str, now: int, cost: int = 1, **kw: Any) -> Any:
        at = kw.get("not_before", 0) if op == "reserve" else kw.get("slot", (0, 0))[0]
        if op in ("reserve", "claim") and at > now:
            return (False, at - now)
        return None

    def refund(self, *_: Any) -> None:
        return None


def step_st() -> st.SearchStrategy[tuple[Any, ...]]:
    ops = ["acquire", "acquire", "peek", "release", "release", "renew", "wait", "wait"]
    ops += ["cancel", "sweep", "refund", "dead", "reserve", "reserve", "claim"]
    dt = st.one_of(
        st.just(0), st.integers(0, 3_000), st.integers(0, 400_000), st.integers(0, 3 * US)
    )
    return st.tuples(
        dt,
        st.sampled_from(ops),
        st.sampled_from(HOLDERS),
        st.integers(0, 100),  # which earlier hold or booking
        st.sampled_from([0, 1_000_000]),  # not_before offset
    )


def run(r: redis.Redis, prefix: str, rules: list[Rule], data: st.DataObject) -> None:
    limit = data.draw(st.integers(1, 3), label="limit")
    lease_ms = data.draw(st.sampled_from([50, 300, 2_000]), label="lease_ms")
    lim = Limiter(
        r, rules or None, concurrency=limit, lease=lease_ms / 1000, name="cp", prefix=prefix
    )
    rate = SlidingLog([(x.limit, x.period_us) for x in rules]) if rules else NoRules()
    model = Cap(limit, lease_ms, rate)
    now = data.draw(st.integers(1_700_000_000 * US, 1_800_000_000 * US), label="start")
    holds: list[Hold] = []  # slots taken (some released, some lapsed)
    taken: list[Decision] = []  # their decisions, until refunded
    bookings: list[tuple[Slot, str]] = []
    steps = data.draw(st.lists(step_st(), min_size=1, max_size=50), label="steps")
    for i, (dt, op, holder, pick, nb) in enumerate(steps):
        now += dt
        t = now / US
        where = f"step {i}: {op} {holder} now={now}"
        token = f"t{i}"
        if op in ("acquire", "peek", "reserve", "claim"):
            kw: dict[str, Any] = {"cost": 1}
            if op == "reserve":
                kw.update(not_before=now + nb if nb else 0, max_wait=-1, tol=0)
            if op == "claim":
                if not bookings:
                    continue
                slot, holder = bookings.pop(pick % len(bookings))
                kw.update(slot=(slot.start_us, slot.end_us), tol=0)
            why, fence, free, handed, rated = model.decide(op, now, holder, token, **kw)
            if op == "peek":
                d = lim.peek("s", now=t, holder=holder)
            elif op == "reserve":
                d = lim.reserve(
                    "s",
                    now=t,
                    holder=holder,
                    token=token,
                    not_before=(now + nb) / US if nb else None,
                )
            elif op == "claim":
                d = lim.claim("s", slot, now=t, holder=holder, token=token)
            else:
                d = lim.acquire("s", now=t, holder=holder, token=token)
            capped = why if why not in ("room", "mine") else None
            assert d.capped == capped, where
            assert (d.hold.fence if d.hold else 0) == fence, where
            assert list(d.handed) == handed, where
            if capped is None:
                assert d.allowed == (rated is None or rated[0]), where
            if d.hold is not None:
                assert d.allowed, where
                holds.append(d.hold)
                taken.append(d)
            if d.booked and op != "peek":
                bookings.append((d.slot, holder))
            if capped is None:
                assert d.remaining <= free, where
        elif op == "refund":  # another limit denied: give back the admission and its slot
            if not taken:
                continue
            d = taken.pop(pick % len(taken))
            assert d.hold is not None and d.slot is not None
            if rules:
                rate.refund(d.slot.start_us, d.slot.end_us, 1, now)
            handed = model.refund(now, d.hold.holder, d.hold.token)
            assert lim.refund("s", d, now=t) == tuple(handed), where
            holds.remove(d.hold)
        elif op in ("release", "dead"):
            if not holds:
                continue
            hold = holds[pick % len(holds)]
            if op == "dead":  # the worker's main process, for a pool process that died
                status, handed = model.release(now, hold.holder, "", "")
                got = lim.release("s", hold.holder, info="", now=t)
            else:
                status, handed = model.release(now, hold.holder, hold.token)
                got = lim.release("s", hold, now=t)
            assert got == (status == 1, tuple(handed)), where
        elif op == "renew":
            if not holds:
                continue
            hold = holds[pick % len(holds)]
            assert lim.renew("s", hold, now=t) == (
                model.renew(now, hold.holder, hold.token) == 1
            ), where
        elif op == "wait":
            why, wait, handed = model.wait(now, holder, f"m{i}")
            w = lim.wait("s", holder, f"m{i}", now=t)
            assert (w.status, list(w.handed)) == (why, handed), where
            if why == "queued":
                assert w.position == wait, where
        elif op == "cancel":
            place, message, handed = model.leave(now, holder)
            got_left = lim.leave("s", holder, now=t)
            assert (got_left.place, got_left.message, list(got_left.handed)) == (
                place,
                message,
                handed,
            ), where
        elif op == "sweep":
            nxt, handed = model.sweep(now)
            got_next, got_handed = lim.sweep("s", now=t)
            assert (round(got_next * 1000), list(got_handed)) == (nxt, handed), where
        seen = lim.holders("s", now=t)
        expected, waiting = model.usage()
        assert seen.waiting == waiting, where
        assert [
            (h.holder, round(h.expires * 1000), h.fence, h.info, h.pending) for h in seen.holders
        ] == expected, where
        assert [(h, round(at * 1000)) for h, at in lim.lapsed("s", now=t)] == (
            model.lapsed_list()
        ), where
        assert sum(1 for h in model.holders.values() if h["expiry"] > now // 1000) <= limit, where


@given(data=st.data())
def test_cap_alone_matches_model(r: redis.Redis, prefix: str, data: st.DataObject) -> None:
    run(r, f"{prefix}{uuid.uuid4().hex[:8]}", [], data)


@given(data=st.data())
def test_cap_with_rules_matches_model(r: redis.Redis, prefix: str, data: st.DataObject) -> None:
    rules = data.draw(
        st.lists(
            st.tuples(st.integers(1, 4), st.sampled_from([5, 250, 1_000, 60_000])),
            min_size=1,
            max_size=2,
        ),
        label="rules",
    )
    run(r, f"{prefix}{uuid.uuid4().hex[:8]}", [Rule(n, ms / 1000) for n, ms in rules], data)
