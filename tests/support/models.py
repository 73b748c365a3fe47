"""Small pure-Python reference models of the limiter algorithms.

Each model states what an algorithm means as plainly as possible (counting timestamps rather
than indexing a trimmed log, exact fractions rather than scaled integers) and is compared with
the Lua scripts decision by decision in test_properties.py. Times are integer microseconds.

A decision is (allowed, retry_us, rule, remaining, reset_us, slot_start_us, slot_end_us) with
retry_us == -1 for "never", rule 1-based (0 = none), slot (0, 0) when none.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

Decision = tuple[bool, int, int, int, int, int, int]
Rules = list[tuple[int, int]]  # (limit, window_us)
Cost = int | tuple[int, ...]  # every rule, or units per meter


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Costed:
    """What every model shares: costs per rule, meters, and the settle records.

    ``meter_of`` gives each rule's meter (0-based); a cost is an integer (every rule) or units
    per meter. A settle is answered here when its id was settled before or its lease ended.
    """

    def __init__(self, rules: Rules, meter_of: list[int] | None = None) -> None:
        self.rules = rules
        self.meter_of = meter_of or [0] * len(rules)
        self.meters = max(self.meter_of) + 1
        self.settled: dict[str, int] = {}  # id -> the end of its lease (us)

    def per_rule(self, cost: Cost) -> list[int]:
        if isinstance(cost, int):
            return [cost] * len(self.rules)
        return [cost[m] for m in self.meter_of]

    def per_meter(self, per_rule: list[int]) -> list[int]:
        w = [0] * self.meters
        for i, m in enumerate(self.meter_of):
            w[m] = per_rule[i]
        return w

    def never(self, c: list[int]) -> int:
        return next((i for i, ((n, _), x) in enumerate(zip(self.rules, c), 1) if x > n), 0)

    def settle_check(self, now: int, start: int, lease: int, ident: str) -> str | None:
        """ "duplicate" or "lapsed" (nothing changes), or None: settle it (recorded)."""
        self.settled = {k: v for k, v in self.settled.items() if v >= now}
        if ident in self.settled:
            return "duplicate"
        if now > start + lease:
            return "lapsed"
        self.settled[ident] = start + lease
        return None

    def sync_extra(self, room: Any, meter: int, rule: int, upstream: int) -> list[int]:
        """The units to charge per rule: what the compared room exceeds the upstream's by."""
        mine = [
            room(i)
            for i, m in enumerate(self.meter_of)
            if m == meter and (rule == 0 or rule == i + 1)
        ]
        extra = max(0, min(mine) - upstream) if mine else 0
        return [extra if m == meter else 0 for m in self.meter_of]


class SlidingLog(Costed):
    """At most N units in any window: entries (stamp in ms, rounded up; units per meter), one per
    ms, sorted newest first.

    A moment x can take cost_i more units under rule i when the units in
    (x - W, x + W + tolerance + maxtol) leave room for them (maxtol: the largest tolerance a
    booking used). Bookings are stamped at slot + tolerance. Entries at or before now minus the
    longest window are dropped when a write leaves more than KEEP entries, the largest limit or
    32 if less (the newest one dropped is remembered as a floor, and units missing below the log
    count as a full window stamped at the floor). Past CAP entries, the past is merged two by
    two at the newer stamps.

    Headroom: per meter, the latest reading's moment t and A, what syncs found the log had not
    counted, faded by the time between readings (A <- floor(A (T - d) / T) + found, at most L;
    T and L the window and limit of the meter's shortest rule). A moment x then keeps
    H_i(x) = floor(A min(x - t, W_i) / T) free under rule i (at most its limit less the call's
    units), and a moment found later must hold its own (16 steps, then the most, A W_i / T).
    The arithmetic is the script's, in doubles.
    """

    books = True
    CAP = 20_000
    KEEP = 32

    def __init__(self, rules: Rules, meter_of: list[int] | None = None) -> None:
        super().__init__(rules, meter_of)
        self.maxwin = max(w for _, w in rules)
        self.entries: list[list[int]] = []  # [stamp_ms, units per meter...], newest first
        self.floor: int | None = None
        self.maxtol = 0
        self.exists = False
        self.hr = [[0, 0] for _ in range(self.meters)]  # per meter: [t_us, A] (A = 0: none)
        self.short: list[tuple[int, int]] = []  # per meter: (T, L) of its shortest rule
        for m in range(self.meters):
            self.short.append(min((w, n) for (n, w), k in zip(rules, self.meter_of) if k == m))

    def _spare(self, i: int, x: int, c: list[int]) -> int:
        """What rule i keeps free at moment x for what another client spent unseen."""
        t, a = self.hr[self.meter_of[i]]
        return 0 if a == 0 or x <= t else self._keep(i, c, min(x - t, self.rules[i][1]))

    def _most(self, i: int, c: list[int]) -> int:
        """The most rule i keeps free at any moment."""
        return self._keep(i, c, self.rules[i][1])

    def _keep(self, i: int, c: list[int], d: int) -> int:
        """What rule i keeps free ``d`` us after the latest reading (d at most its window)."""
        m = self.meter_of[i]
        a, window = float(self.hr[m][1]), float(self.short[m][0])
        return max(0, min(self.rules[i][0] - c[i], math.floor(a * float(d) / window)))

    def _head(self) -> int | None:
        if self.entries:
            return self.entries[0][0] * 1000
        return None if self.floor is None else self.floor * 1000

    def _far(self, horizon: int) -> int:
        """How many entries are at or after `horizon` (they cannot share a window)."""
        return sum(1 for e in self.entries if e[0] * 1000 >= horizon)

    def _skip(self, window: int, x: int, tol: int) -> int:
        return self._far(x + window + tol + self.maxtol + 1000)

    def _used(self, i: int, x: int, tol: int) -> int:
        limit, window = self.rules[i]
        skip = self._skip(window, x, tol)
        inside = [e for e in self.entries[skip:] if e[0] * 1000 > x - window]
        floor_inside = self.floor is not None and self.floor * 1000 > x - window
        if skip + len(inside) == len(self.entries) and floor_inside:
            return limit
        return min(limit, sum(e[1 + self.meter_of[i]] for e in inside))

    def _cut(self, i: int, x: int, tol: int, room: int) -> int | None:
        """The stamp (us) of the first entry from the horizon down at which rule i's units pass
        `room`; past the entries the floor, or None."""
        _, window = self.rules[i]
        total = 0
        for e in self.entries[self._skip(window, x, tol) :]:
            total += e[1 + self.meter_of[i]]
            if total > room:
                return e[0] * 1000
        return None if self.floor is None else self.floor * 1000

    def _place(self, t0: int, c: list[int], tol: int) -> tuple[int | None, int]:
        x, first = t0, 0
        for round_ in range(8):
            moved = False
            for i, (limit, window) in enumerate(self.rules):
                if c[i] == 0:
                    continue
                # with headroom, the room at the moment found must hold that moment's own
                y = x
                steps = 17 if self.hr[self.meter_of[i]][1] > 0 else 1
                for step in range(steps):
                    h = self._spare(i, y, c) if step < 16 else self._most(i, c)
                    e = self._cut(i, y, tol, limit - c[i] - h)
                    if e is None or e + window <= y:
                        break
                    y = e + window
                if y > x:
                    x, moved = y, True
                    if round_ == 0:
                        first = i + 1
            if not moved:
                return x, first
        return None, first

    def _remaining(self, now: int, c: list[int], after: bool = False) -> int:
        """The smallest room over the rules (after the call's units c when `after`), less
        what each keeps free."""
        return min(
            max(0, limit - self._used(i, now, 0) - (c[i] if after else 0) - self._spare(i, now, c))
            for i, (limit, _) in enumerate(self.rules)
        )

    def _reset(self, now: int) -> int:
        head = self._head()
        return 0 if head is None else max(0, head + self.maxwin - now)

    def _insert(self, stamp_ms: int, w: list[int]) -> None:
        self.exists = True
        at = sum(1 for e in self.entries if e[0] > stamp_ms)
        if at < len(self.entries) and self.entries[at][0] == stamp_ms:
            self.entries[at] = [stamp_ms, *(a + b for a, b in zip(self.entries[at][1:], w))]
        else:
            self.entries.insert(at, [stamp_ms, *w])

    def _trim(self, now: int) -> None:
        if len(self.entries) > min(max(n for n, _ in self.rules), self.KEEP):
            self._drop(sum(1 for e in self.entries if e[0] * 1000 > now - self.maxwin))
        if len(self.entries) > self.CAP:
            self._coarsen(now)

    def _coarsen(self, now: int) -> None:
        """Past CAP entries: the past (stamped up to now) merged two by two from the oldest, each
        pair at its newer stamp; then, if still past CAP, the oldest go below the floor."""
        p = sum(1 for e in self.entries if e[0] * 1000 > now)
        past = self.entries[p:][::-1]  # oldest first
        if len(past) >= 2:
            merged = []
            for j in range(0, len(past), 2):
                pair = past[j : j + 2]
                merged.append([pair[-1][0], *(sum(w) for w in zip(*(e[1:] for e in pair)))])
            self.entries = self.entries[:p] + merged[::-1]
        self._drop(self.CAP)

    def _drop(self, t: int) -> None:
        if t < len(self.entries):
            newest = self.entries[t][0]
            self.floor = newest if self.floor is None else max(self.floor, newest)
            del self.entries[t:]

    def _take_back(self, stamp_us: int, w: list[int]) -> list[int] | None:
        for j, e in enumerate(self.entries):
            if e[0] * 1000 == stamp_us:
                took = [min(a, b) for a, b in zip(w, e[1:])]
                e[1:] = [b - a for a, b in zip(took, e[1:])]
                if not any(e[1:]):
                    del self.entries[j]
                return took
        return None

    def _finish(self) -> None:
        if self.exists and not self.entries and self.floor is None and not self._headroom():
            self.maxtol = 0
            self.exists = False

    def _headroom(self) -> bool:
        return any(a > 0 for _, a in self.hr)

    def _charge(self, now: int, per_rule: list[int], at: int | None = None) -> None:
        w = self.per_meter(per_rule)
        if any(w):
            self._insert(-(-(now if at is None else at) // 1000), w)
            self._trim(now)

    def usage(self, now: int) -> list[tuple[int, int, int]]:
        out = []
        head = self._head()
        for i, (limit, window) in enumerate(self.rules):
            e = self._cut(i, now, 0, limit - 1)
            out.append(
                (
                    self._used(i, now, 0),
                    0 if e is None else max(0, e + window - now),
                    0 if head is None else max(0, head + window - now),
                )
            )
        return out

    def booked(self, now: int) -> int:
        return sum(e[1] for e in self.entries if e[0] * 1000 > now + 1000)

    def refund(self, slot_start: int, slot_end: int, cost: Cost, now: int) -> None:
        self._take_back(slot_end, self.per_meter(self.per_rule(cost)))
        self._finish()

    def settle(
        self,
        now: int,
        slot: tuple[int, int],
        estimate: Cost,
        used: Cost,
        lease: int,
        ident: str,
    ) -> tuple[str, list[int], list[int]]:
        status = self.settle_check(now, slot[0], lease, ident)
        if status:
            return status, [], []
        e, a = self.per_rule(estimate), self.per_rule(used)
        give = [max(0, x - y) for x, y in zip(e, a)]
        charge = [max(0, y - x) for x, y in zip(e, a)]
        took = self._take_back(slot[1], self.per_meter(give))
        back = [
            took[self.meter_of[i]] if took is not None and slot[1] > now - window else 0
            for i, (_, window) in enumerate(self.rules)
        ]
        self._charge(now, charge)
        self._finish()
        return "settled", back, charge

    def _used_as_of(self, i: int, as_of: int, transit: int = 0) -> int:
        """Rule i's units stamped in (as_of - W, as_of], W the rule's window less transit: what
        the log had counted then, over the upstream's window."""
        limit, window = self.rules[i]
        window = max(0, window - transit)
        seen = [e for e in self.entries if e[0] * 1000 <= as_of]
        inside = [e for e in seen if e[0] * 1000 > as_of - window]
        if (
            len(inside) == len(seen)
            and self.floor is not None
            and self.floor * 1000 > as_of - window
        ):
            return limit
        return min(limit, sum(e[1 + self.meter_of[i]] for e in inside))

    def sync(
        self,
        now: int,
        meter: int,
        rule: int,
        upstream: int,
        as_of: int | None = None,
        transit: int = 0,
    ) -> int:
        past = as_of if as_of is not None and as_of < now else None  # else: as of now

        def room(i: int) -> int:
            used = self._used(i, now, 0) if past is None else self._used_as_of(i, past, transit)
            return max(0, self.rules[i][0] - used)

        per_rule = self.sync_extra(room, meter, rule, upstream)
        # the meter's headroom: what this reading found, added to what earlier ones found
        # faded by the time between them; the latest reading's moment
        at = now if past is None else past
        (t0, a0), (w, most) = self.hr[meter], self.short[meter]
        a, t, found = a0, at, max(per_rule)
        if a0 > 0:
            if at <= t0:
                t, found = t0, 0  # an earlier reading, answered late: the latest saw it
            else:
                a = math.floor(float(a0) * float(w - (at - t0)) / float(w)) if at - t0 < w else 0
        a = min(most, a + found)
        self.hr[meter] = [t if a > 0 else 0, a]
        self._charge(now, per_rule, past)
        self._finish()
        return max(per_rule)

    def decide(
        self,
        op: str,
        now: int,
        cost: Cost,
        not_before: int = 0,
        max_wait: int = -1,
        tol: int = 0,
        slot: tuple[int, int] = (0, 0),
    ) -> Decision:
        c = self.per_rule(cost)
        never = self.never(c)
        if never:
            return (False, -1, never, self._remaining(now, c), self._reset(now), 0, 0)
        if op == "claim":
            start, end = slot
            if now < start:
                return (False, start - now, 0, self._remaining(now, c), self._reset(now), *slot)
            if now <= end:
                return (True, 0, 0, self._remaining(now, c), self._reset(now), *slot)
            op = "reserve"  # late: the missed slot stays spent
        span = tol if op == "lease" else 0  # a lease: a booking whose slot is now
        at, rule = self._place(now, c, span)
        w = self.per_meter(c)
        if at is not None and at <= now and (op != "reserve" or not_before <= now):
            stamp = -(-(now + span) // 1000)
            remaining = self._remaining(now, c, True)
            if op == "peek":
                return (True, 0, 0, remaining, self._reset(now), 0, 0)
            self._insert(stamp, w)
            self.maxtol = max(self.maxtol, span)
            self._trim(now)
            return (True, 0, 0, remaining, self._reset(now), now, stamp * 1000)
        if op != "reserve":
            wait = at - now if at is not None else self._reset(now)
            return (False, wait, rule, self._remaining(now, c), self._reset(now), 0, 0)
        gap = math.ceil(min(wi / n * x for (n, wi), x in zip(self.rules, c) if x > 0))

        def spaced(t0: int) -> int | None:
            x: int | None = t0
            for _ in range(8):
                x, _rule = self._place(x, c, tol)  # type: ignore[arg-type]
                if x is None:
                    return None
                mark = -(-(x + tol) // 1000) * 1000
                before = sum(1 for e in self.entries if e[0] * 1000 > mark)
                prev = self.entries[before][0] * 1000 if before < len(self.entries) else None
                if prev is None or prev - tol + gap <= x:
                    return x
                x = prev - tol + gap
            return None

        slot_at = spaced(max(now, not_before))
        if slot_at is None:
            head = self._head()
            behind = max(now, not_before, now if head is None else head - tol + gap)
            slot_at = spaced(behind)
            slot_at = behind if slot_at is None else slot_at
        if max_wait >= 0 and slot_at - now > max_wait:
            return (False, slot_at - now, rule, self._remaining(now, c), self._reset(now), 0, 0)
        stamp = -(-(slot_at + tol) // 1000)
        self._insert(stamp, w)
        self.maxtol = max(self.maxtol, tol)
        self._trim(now)
        return (
            False,
            slot_at - now,
            rule,
            self._remaining(now, c),
            self._reset(now),
            slot_at,
            stamp * 1000,
        )


class Gcra(Costed):
    """GCRA per rule: emission interval T = ceil(W / N), burst N (tolerance B = N * T). A rule
    charged nothing neither decides nor moves; a key whose every tat has passed is deleted."""

    books = True

    def __init__(self, rules: Rules, meter_of: list[int] | None = None) -> None:
        super().__init__(rules, meter_of)
        self.T = [ceil_div(w, n) for n, w in rules]
        self.B = [t * n for t, (n, _) in zip(self.T, rules)]
        self.tat = [0] * len(rules)

    def _remaining(self, now: int, tat: list[int]) -> int:
        return min(
            max(0, min(n, (now + b - max(x, now)) // t))
            for (n, _), t, b, x in zip(self.rules, self.T, self.B, tat)
        )

    def _reset(self, now: int, tat: list[int]) -> int:
        return max([now, *tat]) - now

    def _earliest(self, t0: int, c: list[int]) -> tuple[int, int]:
        at, rule = t0, 0
        for i, (t, b, x) in enumerate(zip(self.T, self.B, self.tat), 1):
            if c[i - 1] > 0 and x + c[i - 1] * t - b > at:
                at, rule = x + c[i - 1] * t - b, i
        return at, rule

    def _advance(self, eff: int, c: list[int]) -> list[int]:
        return [max(x, eff) + n * t if n else x for x, t, n in zip(self.tat, self.T, c)]

    def _store(self, now: int) -> None:
        if max(self.tat) <= now:  # fully replenished: no state is kept
            self.tat = [0] * len(self.tat)

    @staticmethod
    def _first(c: list[int]) -> int:
        return next((i for i, x in enumerate(c) if x > 0), len(c) - 1)

    def usage(self, now: int) -> list[tuple[int, int, int]]:
        return [
            (min(n, ceil_div(max(0, x - now), t)), max(0, x + t - b - now), max(0, x - now))
            for (n, _), t, b, x in zip(self.rules, self.T, self.B, self.tat)
        ]

    def refund(self, slot_start: int, slot_end: int, cost: Cost, now: int) -> None:
        # only the newest admission or booking can be taken back
        c = self.per_rule(cost)
        f = self._first(c)
        if any(self.tat) and self.tat[f] == max(slot_end, 0) + c[f] * self.T[f]:
            self.tat = [x - n * t for x, n, t in zip(self.tat, c, self.T)]
            self._store(now)

    def _charge(self, now: int, units: list[int]) -> None:
        self.tat = [
            min(max(x, now) + u * t, now + 2**52) if u else x
            for x, u, t in zip(self.tat, units, self.T)
        ]

    def settle(
        self,
        now: int,
        slot: tuple[int, int],
        estimate: Cost,
        used: Cost,
        lease: int,
        ident: str,
    ) -> tuple[str, list[int], list[int]]:
        status = self.settle_check(now, slot[0], lease, ident)
        if status:
            return status, [], []
        e, a = self.per_rule(estimate), self.per_rule(used)
        back = []
        for i, (x, y) in enumerate(zip(e, a)):
            ahead = min(slot[0] + x * self.T[i], self.tat[i]) - now
            back.append(min(max(0, x - y), max(0, ahead // self.T[i])))
            self.tat[i] -= back[i] * self.T[i]
        charge = [max(0, y - x) for x, y in zip(e, a)]
        self._charge(now, charge)
        self._store(now)
        return "settled", back, charge

    def sync(
        self,
        now: int,
        meter: int,
        rule: int,
        upstream: int,
        as_of: int | None = None,
        transit: int = 0,
    ) -> int:
        def room(i: int) -> int:
            n, t, b = self.rules[i][0], self.T[i], self.B[i]
            return max(0, min(n, (now + b - max(self.tat[i], now)) // t))

        per_rule = self.sync_extra(room, meter, rule, upstream)
        self._charge(now, per_rule)
        self._store(now)
        return max(per_rule)

    def decide(
        self,
        op: str,
        now: int,
        cost: Cost,
        not_before: int = 0,
        max_wait: int = -1,
        tol: int = 0,
        slot: tuple[int, int] = (0, 0),
    ) -> Decision:
        c = self.per_rule(cost)
        never = self.never(c)
        if never:
            return (
                False,
                -1,
                never,
                self._remaining(now, self.tat),
                self._reset(now, self.tat),
                0,
                0,
            )
        if op == "claim":
            start, end = slot
            rem, reset = self._remaining(now, self.tat), self._reset(now, self.tat)
            if now < start:
                return (False, start - now, 0, rem, reset, *slot)
            if now <= end:
                return (True, 0, 0, rem, reset, *slot)
            op = "reserve"
        at, rule = self._earliest(now, c)
        if at <= now and (op != "reserve" or not_before <= now):
            eff = now + tol if op == "lease" else now  # a lease counts at the end of its span
            tat = self._advance(eff, c)
            if op == "peek":
                return (True, 0, 0, self._remaining(now, tat), self._reset(now, tat), 0, 0)
            before, self.tat = self.tat[self._first(c)], tat
            return (
                True,
                0,
                0,
                self._remaining(now, tat),
                self._reset(now, tat),
                now,
                max(before, eff),
            )
        if op != "reserve":
            return (
                False,
                at - now,
                rule,
                self._remaining(now, self.tat),
                self._reset(now, self.tat),
                0,
                0,
            )
        slot_at, _ = self._earliest(max(now, not_before), c)
        if max_wait >= 0 and slot_at - now > max_wait:
            return (
                False,
                slot_at - now,
                rule,
                self._remaining(now, self.tat),
                self._reset(now, self.tat),
                0,
                0,
            )
        self.tat = self._advance(slot_at + tol, c)
        return (
            False,
            slot_at - now,
            rule,
            self._remaining(now, self.tat),
            self._reset(now, self.tat),
            slot_at,
            slot_at + tol,
        )


class TokenBucket(Costed):
    """N tokens per rule, refilled continuously at N per W (exact fractions). Only admissions,
    refunds and settles write; a missing bucket is full; an overrun may take a bucket below
    zero (at most 2^52 token-microseconds deep, as the script keeps it)."""

    books = False

    def __init__(self, rules: Rules, meter_of: list[int] | None = None) -> None:
        super().__init__(rules, meter_of)
        self.state: list[tuple[Fraction, int]] | None = None  # (tokens, measured at) per rule

    def _view(self, now: int) -> list[tuple[Fraction, int]]:
        if self.state is None:
            return [(Fraction(n), now) for n, _ in self.rules]
        out = []
        for (n, w), (x, seen) in zip(self.rules, self.state):
            if now > seen:
                x, seen = min(Fraction(n), x + Fraction(n * (now - seen), w)), now
            out.append((x, seen))
        return out

    def _store(self, view: list[tuple[Fraction, int]]) -> None:
        full = all(x == n for (n, _), (x, _) in zip(self.rules, view))
        self.state = None if full else view

    @staticmethod
    def _remaining(view: list[tuple[Fraction, int]]) -> int:
        return min(max(0, math.floor(x)) for x, _ in view)

    def _reset(self, view: list[tuple[Fraction, int]]) -> int:
        return max(math.ceil((n - x) * w / n) for (n, w), (x, _) in zip(self.rules, view))

    def usage(self, now: int) -> list[tuple[int, int, int]]:
        return [
            (
                math.ceil(n - x),
                0 if x >= 1 else math.ceil((1 - x) * w / n),
                math.ceil((n - x) * w / n),
            )
            for (n, w), (x, _) in zip(self.rules, self._view(now))
        ]

    def refund(self, slot_start: int, slot_end: int, cost: Cost, now: int) -> None:
        shortest = min(w for _, w in self.rules)
        if self.state is not None and now - slot_start < shortest:
            view = self._view(now)
            c = self.per_rule(cost)
            self._store(
                [(min(Fraction(n), x + k), s) for (n, _), (x, s), k in zip(self.rules, view, c)]
            )

    def _charged(
        self, view: list[tuple[Fraction, int]], units: list[int]
    ) -> list[tuple[Fraction, int]]:
        return [
            (max(Fraction(-(2**52), w), x - u), s)
            for (_, w), (x, s), u in zip(self.rules, view, units)
        ]

    def settle(
        self,
        now: int,
        slot: tuple[int, int],
        estimate: Cost,
        used: Cost,
        lease: int,
        ident: str,
    ) -> tuple[str, list[int], list[int]]:
        status = self.settle_check(now, slot[0], lease, ident)
        if status:
            return status, [], []
        e, a = self.per_rule(estimate), self.per_rule(used)
        view = self._view(now)
        back = []
        for (n, w), (x, _), est, use in zip(self.rules, view, e, a):
            unfilled = (est * w - (now - slot[0]) * n) // w
            headroom = math.floor(n - x)
            back.append(max(0, min(max(0, est - use), unfilled, headroom)))
        view = [(x + b, s) for (x, s), b in zip(view, back)]
        charge = [max(0, y - x) for x, y in zip(e, a)]
        self._store(self._charged(view, charge))
        return "settled", back, charge

    def sync(
        self,
        now: int,
        meter: int,
        rule: int,
        upstream: int,
        as_of: int | None = None,
        transit: int = 0,
    ) -> int:
        view = self._view(now)
        per_rule = self.sync_extra(lambda i: max(0, math.floor(view[i][0])), meter, rule, upstream)
        self._store(self._charged(view, per_rule))
        return max(per_rule)

    def decide(self, op: str, now: int, cost: Cost, **_: object) -> Decision:
        view = self._view(now)
        c = self.per_rule(cost)
        never = self.never(c)
        if never:
            return (False, -1, never, self._remaining(view), self._reset(view), 0, 0)
        wait, rule = 0, 0
        for i, ((n, w), (x, _), k) in enumerate(zip(self.rules, view, c), 1):
            if k > 0 and x < k and math.ceil((k - x) * w / n) > wait:
                wait, rule = math.ceil((k - x) * w / n), i
        if wait:
            return (False, wait, rule, self._remaining(view), self._reset(view), 0, 0)
        view = [(x - k, s) for (x, s), k in zip(view, c)]
        if op == "peek":
            return (True, 0, 0, self._remaining(view), self._reset(view), 0, 0)
        self._store(view)
        return (True, 0, 0, self._remaining(view), self._reset(view), now, now)


class FixedWindow(Costed):
    """A count per rule for the current epoch-aligned window."""

    books = False

    def __init__(self, rules: Rules, meter_of: list[int] | None = None) -> None:
        super().__init__(rules, meter_of)
        self.state: list[tuple[int, int]] | None = None  # (window index, count) per rule

    def _view(self, now: int) -> list[tuple[int, int]]:
        out = []
        for i, (_, w) in enumerate(self.rules):
            cur = now // w
            if self.state and self.state[i][0] >= cur:
                out.append(self.state[i])
            else:
                out.append((cur, 0))
        return out

    @staticmethod
    def _remaining(rules: Rules, view: list[tuple[int, int]]) -> int:
        return min(max(0, n - c) for (n, _), (_, c) in zip(rules, view))

    @staticmethod
    def _reset(rules: Rules, view: list[tuple[int, int]], now: int) -> int:
        return max([0] + [(idx + 1) * w - now for (_, w), (idx, c) in zip(rules, view) if c > 0])

    def _store(self, view: list[tuple[int, int]], now: int) -> None:
        self.state = view if self._reset(self.rules, view, now) > 0 else None

    def usage(self, now: int) -> list[tuple[int, int, int]]:
        view = self._view(now)
        return [
            (c, (idx + 1) * w - now if c >= n else 0, (idx + 1) * w - now if c > 0 else 0)
            for (n, w), (idx, c) in zip(self.rules, view)
        ]

    def refund(self, slot_start: int, slot_end: int, cost: Cost, now: int) -> None:
        if self.state is None:
            return
        view = [
            (idx, max(0, c - k) if idx == slot_start // w else c)
            for (_, w), (idx, c), k in zip(self.rules, self._view(now), self.per_rule(cost))
        ]
        self._store(view, now)

    def settle(
        self,
        now: int,
        slot: tuple[int, int],
        estimate: Cost,
        used: Cost,
        lease: int,
        ident: str,
    ) -> tuple[str, list[int], list[int]]:
        status = self.settle_check(now, slot[0], lease, ident)
        if status:
            return status, [], []
        e, a = self.per_rule(estimate), self.per_rule(used)
        charge = [max(0, y - x) for x, y in zip(e, a)]
        view = self._view(now)
        back = [
            min(max(0, x - y), c) if idx == slot[0] // w else 0
            for (_, w), (idx, c), x, y in zip(self.rules, view, e, a)
        ]
        self._store([(idx, c - b + k) for (idx, c), b, k in zip(view, back, charge)], now)
        return "settled", back, charge

    def sync(
        self,
        now: int,
        meter: int,
        rule: int,
        upstream: int,
        as_of: int | None = None,
        transit: int = 0,
    ) -> int:
        view = self._view(now)
        per_rule = self.sync_extra(
            lambda i: max(0, self.rules[i][0] - view[i][1]), meter, rule, upstream
        )
        self._store([(idx, c + k) for (idx, c), k in zip(view, per_rule)], now)
        return max(per_rule)

    def decide(self, op: str, now: int, cost: Cost, **_: object) -> Decision:
        view = self._view(now)
        c_ = self.per_rule(cost)
        never = self.never(c_)
        if never:
            return (
                False,
                -1,
                never,
                self._remaining(self.rules, view),
                self._reset(self.rules, view, now),
                0,
                0,
            )
        wait, rule = 0, 0
        for i, ((n, w), (idx, c), k) in enumerate(zip(self.rules, view, c_), 1):
            if k > 0 and c + k > n and (idx + 1) * w - now > wait:
                wait, rule = (idx + 1) * w - now, i
        if wait:
            return (
                False,
                wait,
                rule,
                self._remaining(self.rules, view),
                self._reset(self.rules, view, now),
                0,
                0,
            )
        view = [(idx, c + k) for (idx, c), k in zip(view, c_)]
        remaining, reset = self._remaining(self.rules, view), self._reset(self.rules, view, now)
        if op == "peek":
            return (True, 0, 0, remaining, reset, 0, 0)
        self._store(view, now)
        return (True, 0, 0, remaining, reset, now, now)


class SlidingWindow(Costed):
    """Each rule counts admissions in buckets of ceil(W / precision) and counts, in full, every
    bucket that overlaps its window (so it never over-admits)."""

    books = False

    def __init__(
        self, rules: Rules, meter_of: list[int] | None = None, precision: int = 60
    ) -> None:
        super().__init__(rules, meter_of)
        self.P = [ceil_div(w, precision) for _, w in rules]
        self.counts: list[dict[int, int]] = [{} for _ in rules]  # per rule: bucket -> count

    def _buckets(self, i: int, now: int) -> dict[int, int]:
        lo = (now - self.rules[i][1]) // self.P[i]
        return {b: c for b, c in self.counts[i].items() if b >= lo and c > 0}

    def _wait(self, i: int, now: int, cost: int) -> int:
        n, w = self.rules[i]
        buckets = self._buckets(i, now)
        need = sum(buckets.values()) + cost - n
        if need <= 0:
            return 0
        freed = 0
        for b in sorted(buckets):
            freed += buckets[b]
            if freed >= need:
                return (b + 1) * self.P[i] + w - now
        return -1  # pragma: no cover

    def _rule_reset(self, i: int, now: int) -> int:
        buckets = self._buckets(i, now)
        if not buckets:
            return 0
        return max(0, (max(buckets) + 1) * self.P[i] + self.rules[i][1] - now)

    def _remaining(self, now: int) -> int:
        return min(
            max(0, n - sum(self._buckets(i, now).values())) for i, (n, _) in enumerate(self.rules)
        )

    def _reset(self, now: int) -> int:
        return max(self._rule_reset(i, now) for i in range(len(self.rules)))

    def usage(self, now: int) -> list[tuple[int, int, int]]:
        return [
            (
                sum(self._buckets(i, now).values()),
                max(0, self._wait(i, now, 1)),
                self._rule_reset(i, now),
            )
            for i in range(len(self.rules))
        ]

    def _prune(self, now: int) -> None:
        """Writes drop the buckets that left every window (so a clock step back cannot revive
        them)."""
        self.counts = [self._buckets(i, now) for i in range(len(self.rules))]

    def _take_back(self, i: int, t: int, c: int, now: int) -> int:
        b = t // self.P[i]
        took = min(c, self._buckets(i, now).get(b, 0))
        if took:
            self.counts[i][b] -= took
        return took

    def refund(self, slot_start: int, slot_end: int, cost: Cost, now: int) -> None:
        if not any(self.counts):
            return
        for i, k in enumerate(self.per_rule(cost)):
            self._take_back(i, slot_start, k, now)
        self._prune(now)

    def _count(self, now: int, units: list[int]) -> None:
        for i, k in enumerate(units):
            if k:
                b = now // self.P[i]
                self.counts[i][b] = self.counts[i].get(b, 0) + k

    def settle(
        self,
        now: int,
        slot: tuple[int, int],
        estimate: Cost,
        used: Cost,
        lease: int,
        ident: str,
    ) -> tuple[str, list[int], list[int]]:
        status = self.settle_check(now, slot[0], lease, ident)
        if status:
            return status, [], []
        e, a = self.per_rule(estimate), self.per_rule(used)
        back = [
            self._take_back(i, slot[0], max(0, x - y), now) for i, (x, y) in enumerate(zip(e, a))
        ]
        charge = [max(0, y - x) for x, y in zip(e, a)]
        self._prune(now)
        self._count(now, charge)
        return "settled", back, charge

    def sync(
        self,
        now: int,
        meter: int,
        rule: int,
        upstream: int,
        as_of: int | None = None,
        transit: int = 0,
    ) -> int:
        per_rule = self.sync_extra(
            lambda i: max(0, self.rules[i][0] - sum(self._buckets(i, now).values())),
            meter,
            rule,
            upstream,
        )
        self._prune(now)
        self._count(now, per_rule)
        return max(per_rule)

    def decide(self, op: str, now: int, cost: Cost, **_: object) -> Decision:
        c = self.per_rule(cost)
        never = self.never(c)
        if never:
            return (False, -1, never, self._remaining(now), self._reset(now), 0, 0)
        wait, rule = 0, 0
        for i in range(len(self.rules)):
            w = self._wait(i, now, c[i]) if c[i] > 0 else 0
            if w > wait:
                wait, rule = w, i + 1
        if wait:
            return (False, wait, rule, self._remaining(now), self._reset(now), 0, 0)
        before = [dict(x) for x in self.counts]
        if op != "peek":
            self._prune(now)
        self._count(now, c)
        out = (True, 0, 0, self._remaining(now), self._reset(now), now, now)
        if op == "peek":
            self.counts = before
            return (*out[:5], 0, 0)
        return out


MODELS = {
    "sliding_log": SlidingLog,
    "gcra": Gcra,
    "token_bucket": TokenBucket,
    "fixed_window": FixedWindow,
    "sliding_window": SlidingWindow,
}


class Cap:
    """A concurrency cap (cap.lua, cap_decide.lua, cap_ops.lua) over one subject, stated
    plainly: holders with leases, waiters in a line, messages kept for holders (a pending
    hand-over's, a copy's behind its running holder), lapsed hand-overs, copies that finished.
    Times: ``now`` in microseconds, leases and expiries in milliseconds, as the scripts keep
    them.

    ``rate`` (a model above, or None) is asked only when the cap has a slot for the holder;
    the slot is taken only when it admits.
    """

    def __init__(self, limit: int, lease_ms: int, rate: Any = None) -> None:
        self.limit, self.lease, self.rate = limit, lease_ms, rate
        # id -> token, since, expiry, fence (a running holder's) or place (in line), flags, info
        self.holders: dict[str, dict[str, Any]] = {}
        self.kept: dict[str, str] = {}  # pending hand-over or copy behind a holder -> message
        self.waiters: dict[str, int] = {}  # id -> place in line
        self.messages: dict[str, str] = {}
        self.lapsed: dict[str, tuple[int, int, str]] = {}  # id -> (when, place, message)
        self.done: dict[str, int] = {}
        self.fence = 0
        self.seq = 0

    # -- the shared parts (cap.lua) ----------------------------------------------------------

    def _drop(self, holder: str) -> None:
        self.holders.pop(holder, None)
        self.kept.pop(holder, None)

    def _line(self) -> list[str]:
        return sorted(self.waiters, key=lambda k: (self.waiters[k], k))

    def _hand(self, holder: str, msg: str, place: int, now_ms: int, out: list[Any]) -> None:
        self.holders[holder] = dict(
            token="-",
            since=now_ms,
            expiry=now_ms + self.lease,
            fence=place,
            flags="p",
            info="handed over",
        )
        self.kept.pop(holder, None)
        if msg != "":
            self.kept[holder] = msg
            out.append((holder, msg))

    def _hand_over(self, now_ms: int, out: list[tuple[str, str]]) -> None:
        room = self.limit - len(self.holders)
        while room > 0 and self.waiters:
            holder = self._line()[0]
            place = self.waiters.pop(holder)
            msg = self.messages.pop(holder, None)
            if msg is None:
                continue
            self._hand(holder, msg, place, now_ms, out)
            room -= 1

    def _lapse(self, holder: str, now_ms: int) -> None:
        e = self.holders.pop(holder)
        msg = self.kept.pop(holder, None)
        if msg is not None:
            self.lapsed[holder] = (now_ms, e["fence"], msg)

    def _sweep(self, now_ms: int, out: list[tuple[str, str]]) -> None:
        lapsed = sorted((h["expiry"], k) for k, h in self.holders.items() if h["expiry"] <= now_ms)
        for _, holder in lapsed[:100]:
            flags = self.holders[holder]["flags"]
            if flags == "p":
                self._lapse(holder, now_ms)
            elif flags == "u":
                self._hand(holder, self.kept.get(holder, ""), 0, now_ms, out)
            else:
                self._drop(holder)
        self.done = {k: v for k, v in self.done.items() if v > now_ms}
        if self.waiters:
            self._hand_over(now_ms, out)

    def _estimate(self, now_ms: int) -> int:
        if not self.holders:
            return self.lease * 1000
        first = min((h["expiry"], k) for k, h in self.holders.items())[0]
        return max(0, (first - now_ms) * 1000)

    def _verdict(self, holder: str, now_ms: int, live_only: bool) -> tuple[str, int]:
        if self.done.get(holder, -1) > now_ms:
            return "done", -1
        held = (
            sum(1 for h in self.holders.values() if h["expiry"] > now_ms)
            if live_only
            else len(self.holders)
        )
        e = self.holders.get(holder)
        if e is not None and e["flags"] == "p":
            return "mine", 0
        if holder in self.lapsed:
            return ("room", 0) if held < self.limit else ("full", self._estimate(now_ms))
        if e is not None and e["expiry"] > now_ms:
            return "copy", (e["expiry"] - now_ms) * 1000
        if held < self.limit and not self.waiters:
            return "room", 0
        return "full", self._estimate(now_ms)

    def _finish(self) -> None:
        if not (self.holders or self.waiters or self.kept or self.lapsed):
            self.fence = self.seq = 0  # the entries' hash is deleted

    def free(self, now_ms: int) -> int:
        return max(0, self.limit - sum(1 for h in self.holders.values() if h["expiry"] > now_ms))

    # -- decisions (cap_decide.lua) ----------------------------------------------------------

    def decide(
        self, op: str, now: int, holder: str, token: str, info: str = "", **rate_args: Any
    ) -> tuple[str, int, int, list[tuple[str, str]], Any]:
        """(why, fence, free, handed, the rate model's decision or None)."""
        now_ms = now // 1000
        out: list[tuple[str, str]] = []
        if op != "peek":
            self._sweep(now_ms, out)
        why, _wait = self._verdict(holder, now_ms, op == "peek")
        fence, rated = 0, None
        if why in ("room", "mine"):
            rated = self.rate.decide(op, now, **rate_args) if self.rate is not None else None
            allowed = rated is None or rated[0]
            if op != "peek":
                if allowed:
                    self.fence = fence = max(now, self.fence + 1)
                    self.holders[holder] = dict(
                        token=token,
                        since=now_ms,
                        expiry=now_ms + self.lease,
                        fence=fence,
                        flags="-",
                        info=info,
                    )
                    self.kept.pop(holder, None)
                    self.lapsed.pop(holder, None)
                elif why == "mine" and holder in self.kept:
                    self._lapse(holder, now_ms)
                    self._hand_over(now_ms, out)
        else:
            e = self.holders.get(holder)
            if why == "copy" and op != "peek" and e is not None and e["flags"] == "-":
                e["flags"] = "c"
            if op == "claim" and self.rate is not None:
                start, end = rate_args["slot"]
                self.rate.refund(start, end, rate_args["cost"], now)
        if op != "peek":
            self._finish()
        return why, fence, self.free(now_ms), out, rated

    def refund(self, now: int, holder: str, token: str) -> list[tuple[str, str]]:
        now_ms, out = now // 1000, []
        e = self.holders.get(holder)
        if e is not None and e["token"] == token:
            self._drop(holder)
        self._sweep(now_ms, out)
        self._finish()
        return out

    # -- operations (cap_ops.lua) ------------------------------------------------------------

    def release(
        self, now: int, holder: str, token: str = "", info: str = ""
    ) -> tuple[int, list[tuple[str, str]]]:
        now_ms, out = now // 1000, []
        e = self.holders.get(holder)
        if (
            e is None
            or e["flags"] == "p"
            or (token != "" and e["token"] != token)
            or (token == "" and e["info"] != info)
        ):
            self._sweep(now_ms, out)
            self._finish()
            return 0, out
        self._drop(holder)
        if e["flags"] != "-":
            self.done[holder] = now_ms + 2 * self.lease
        self._sweep(now_ms, out)
        self._finish()
        return 1, out

    def renew(self, now: int, holder: str, token: str) -> int:
        e = self.holders.get(holder)
        if e is None or e["token"] != token:
            return 0
        e["expiry"] = now // 1000 + self.lease
        self._finish()
        return 1

    def wait(self, now: int, holder: str, message: str) -> tuple[str, int, list[tuple[str, str]]]:
        now_ms, out = now // 1000, []
        self._sweep(now_ms, out)
        why, wait = self._verdict(holder, now_ms, False)
        if why == "full":
            if holder in self.lapsed:
                self.waiters[holder] = self.lapsed.pop(holder)[1]
            elif holder not in self.waiters:
                self.seq += 1
                self.waiters[holder] = self.seq
            self.messages[holder] = message
            why, wait = "queued", self._line().index(holder)
        elif why == "copy":
            self.holders[holder]["flags"] = "u"
            self.kept[holder] = message
            why, wait = "queued", 0
        self._finish()
        return why, wait, out

    def leave(self, now: int, holder: str) -> tuple[str, str, list[tuple[str, str]]]:
        now_ms, out = now // 1000, []
        where, left = "", ""
        if holder in self.waiters:
            del self.waiters[holder]
            where, left = "waiting", self.messages.get(holder, "")
        self.messages.pop(holder, None)
        e = self.holders.get(holder)
        if e is not None and e["flags"] == "p":
            where, left = "handed", self.kept.get(holder, "")
            self._drop(holder)
        elif holder in self.lapsed:
            where, left = "lapsed", self.lapsed.pop(holder)[2]
        elif e is not None and e["flags"] == "u":
            where, left = "copy", self.kept.pop(holder)
            e["flags"] = "c"
        self._sweep(now_ms, out)
        self._finish()
        return where, left, out

    def sweep(self, now: int) -> tuple[int, list[tuple[str, str]]]:
        now_ms, out = now // 1000, []
        self._sweep(now_ms, out)
        self._finish()
        nxt = 0
        if self.waiters or self.kept:
            nxt = (
                min((h["expiry"], k) for k, h in self.holders.items())[0]
                if self.holders
                else now_ms
            )
        return nxt, out

    def lapsed_list(self) -> list[tuple[str, int]]:
        """The oldest 100 lapsed hand-overs: (id, when it lapsed in ms)."""
        oldest = sorted((when, k) for k, (when, _place, _msg) in self.lapsed.items())
        return [(k, when) for when, k in oldest[:100]]

    def usage(self) -> tuple[list[tuple[str, int, int, str, bool]], int]:
        """(holders as (id, expiry, fence, info, pending), oldest lease first; waiting)."""
        holders = sorted(
            (h["expiry"], k, 0 if h["flags"] == "p" else h["fence"], h["info"], h["flags"] == "p")
            for k, h in self.holders.items()
        )
        return [(k, exp, f, i, p) for exp, k, f, i, p in holders], len(self.waiters)
