"""The fair queue against a small pure-Python model (a hypothesis ``RuleBasedStateMachine``),
driving the real scripts (fair_put, fair_take, fair_claim, fair_drop, dead_put) on the suite's
redis-server with an explicit clock, the real dispatcher's sending (a real broker: the suite's
Redis, db 1) and the gate's claim of each copy that arrives.

Steps: a call waits (tenants a, b, c with weights 1, 2 and 0.5; some unreadable), time passes,
the dispatcher takes what the limit has room for and sends it on, or dies after its take, a copy
arrives (and runs, or is denied again and waits again in its place), the same copy arrives
again, a copy is revoked. After each step Redis holds what the model says, key by key (the
queue, V, tenants' last tags, waiting counts, transit, copies, claims).

Invariants: every call waits, travels, ran, was revoked or is in the dead letters, never lost;
no call runs from two copies; an unreadable call leaves the queue the first time it is taken;
shares follow the weights (two tenants both waiting get n_a / w_a and n_b / w_b within
1 / w_a + 1 / w_b of each other over any stretch of takes).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from governor import Limiter
from governor.celery import Governor
from governor.celery.fair.dispatcher import FairDispatcher
from governor.celery.fair.queue import (
    CLAIMS_LONG_MS,
    CLAIMS_MS,
    TRANSIT_MAX_MS,
    TRANSIT_MS,
    FairQueue,
)
from governor.celery.waiting import dead_letters
from governor.celery.waiting.envelope import envelope
from support.celery_helpers import new_app
from support.servers import ServerHandle

T0 = 1_800_000_000_000  # ms
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 0.5}
MOST = 5


@dataclass
class Copy:
    """A message sent on: which call, its member, token, when sent (ms), which copy."""

    call: int
    member: str
    token: str
    sent: int
    copy: int
    tag: float
    raw: bytes = b""


@dataclass
class Model:
    """What the queue's keys should hold, and where each call is."""

    v: float = 0.0
    seq: int = 0
    fq: dict[str, float] = field(default_factory=dict)
    text: dict[str, tuple[str, float, bool]] = field(default_factory=dict)
    """fm: member -> (tenant, tag, readable)."""
    last: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    transit: dict[str, int] = field(default_factory=dict)
    copies: dict[str, int] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)
    forget_at: dict[str, int] = field(default_factory=dict)
    # the calls
    member_of: dict[int, str] = field(default_factory=dict)
    call_of: dict[str, int] = field(default_factory=dict)
    tenant: dict[int, str] = field(default_factory=dict)
    fate: dict[int, str] = field(default_factory=dict)
    """Calls that left the queue: ran, revoked, dead."""
    ran: dict[int, set[str]] = field(default_factory=dict)
    log: list[tuple[str, bool, frozenset[str]]] = field(default_factory=list)
    """First takes: (tenant, waited again before, tenants waiting just before)."""

    def put(self, member_id: str, tenant: str, tag: float | None, readable: bool) -> str:
        self.seq += 1
        if tag is None:
            tag = max(self.v, self.last.get(tenant, self.v)) + 1.0 / WEIGHTS[tenant]
            self.last[tenant] = tag
        member = f"{self.seq:012d}:{member_id}"
        self.fq[member] = tag
        self.text[member] = (tenant, tag, readable)
        self.waiting[tenant] = self.waiting.get(tenant, 0) + 1
        return member

    def take(self, room: int, now: int) -> list[tuple[str, int]]:
        """fair_take.lua: (member, copy) in order."""
        flying = sum(1 for s in self.transit.values() if s >= now)
        left = min(MOST, room - flying)
        out: list[tuple[str, int]] = []

        def send(member: str) -> bool:
            if member not in self.text:
                self.transit.pop(member, None)
                self.copies.pop(member, None)
                return False
            copy = self.copies.get(member, 0) + 1
            self.copies[member] = copy
            self.transit[member] = now + min(TRANSIT_MAX_MS, TRANSIT_MS * 2 ** (copy - 1))
            out.append((member, copy))
            return True

        for _, member in sorted((s, m) for m, s in self.transit.items() if s <= now):
            if left <= 0:
                break
            if send(member):
                left -= 1
        if left > 0:
            firsts = sorted((t, m) for m, t in self.fq.items())[:left]
            for tag, member in firsts:
                tenant = self.text[member][0]
                self.log.append(
                    (tenant, member.endswith("-again"), frozenset(t for t in self.waiting))
                )
                del self.fq[member]
                self.waiting[tenant] -= 1
                if self.waiting[tenant] <= 0:
                    del self.waiting[tenant]
                self.v = max(self.v, tag)
                if send(member):
                    left -= 1
            self.last = {t: x for t, x in self.last.items() if x > self.v}
        return out

    def claim(self, member: str, token: str, now: int, sent: int, copy: int) -> bool:
        """fair_claim.lua."""
        if member in self.claims:
            return self.claims[member] == token
        copies = max(self.copies.get(member, 1), copy)
        if member not in self.text and member not in self.transit:
            age = now - sent
            if age >= CLAIMS_MS and (copies > 1 or age >= CLAIMS_LONG_MS):
                return False
        keep = CLAIMS_LONG_MS if copies > 1 else CLAIMS_MS
        self.claims[member] = token
        self.forget_at[member] = now + keep
        self.transit.pop(member, None)
        self.text.pop(member, None)
        self.copies.pop(member, None)
        for _, old in sorted((s, m) for m, s in self.forget_at.items() if s <= now)[:20]:
            del self.forget_at[old]
            del self.claims[old]
        return True

    def drop(self, member: str) -> None:
        self.text.pop(member, None)
        self.transit.pop(member, None)
        self.copies.pop(member, None)


def build(redis_server: ServerHandle) -> type[RuleBasedStateMachine]:
    broker = redis.Redis.from_url(redis_server.url(1))
    holder = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), holder, governor_queues={holder: {"rules": "1/s"}})
    governor = Governor(app)
    store, prefix = governor.gate.client, governor.settings.prefix
    dispatcher = FairDispatcher(app, governor.gate.store, governor.settings)

    @app.task(shared=False, name="fm.job")
    def job(customer: str, n: int) -> None: ...

    class Fair(RuleBasedStateMachine):
        @initialize()
        def start(self) -> None:
            store.delete(*dead_letters.keys(prefix))
            self.subject = f"s-{uuid.uuid4().hex[:10]}"
            self.queue_name = f"fm-{uuid.uuid4().hex[:10]}"
            lim = Limiter(store, "10/s", name="fairmodel", prefix=prefix)
            self.fq = FairQueue(lim, self.subject)
            self.now = T0
            self.n = 0
            self.model = Model()
            self.in_broker: dict[tuple[int, int], Copy] = {}
            self.delivered: list[Copy] = []
            self.seen: set[bytes] = set()
            self.checked = 0

        def _text(self, tenant: str, n: int, readable: bool) -> str:
            if not readable:
                return "not-json"
            return envelope(app, job.s(tenant, n).set(queue=self.queue_name), 0.0, "fair")

        def _arrivals(self) -> list[Copy]:
            fresh = []
            for raw in broker.lrange(self.queue_name, 0, -1):
                if raw in self.seen:
                    continue
                self.seen.add(raw)
                carried = json.loads(raw)["headers"]["governor"]
                member = carried["fair"]
                copy = Copy(
                    self.model.call_of[member],
                    member,
                    carried["release"],
                    round(carried["sent"] * 1000),
                    int(carried["copy"]),
                    float(carried["tag"]),
                    raw,
                )
                self.in_broker[(copy.call, len(self.seen))] = copy
                fresh.append(copy)
            return fresh

        def _claim(self, c: Copy) -> bool:
            expected = self.model.claim(c.member, c.token, self.now, c.sent, c.copy)
            got = self.fq.claim(
                store, c.member, c.token, now=self.now / 1000, sent=c.sent / 1000, copy=c.copy
            )
            assert got == expected, (c, got)
            return got

        # -- rules --------------------------------------------------------------------------

        @rule(
            tenant=st.sampled_from(sorted(WEIGHTS)),
            readable=st.sampled_from([True, True, True, False]),
            count=st.integers(1, 4),
        )
        def wait_in_the_queue(self, tenant: str, readable: bool, count: int) -> None:
            for _ in range(count):
                self._put(tenant, readable)

        def _put(self, tenant: str, readable: bool) -> None:
            self.n += 1
            member = self.model.put(str(self.n), tenant, None, readable)
            tag, waiting = self.fq.put(
                store, str(self.n), tenant, 1.0 / WEIGHTS[tenant], None,
                self._text(tenant, self.n, readable),
            )  # fmt: skip
            assert (tag, waiting) == (self.model.fq[member], len(self.model.fq))
            self.model.member_of[self.n] = member
            self.model.call_of[member] = self.n
            self.model.tenant[self.n] = tenant

        @rule(dt=st.sampled_from([0, 1_000, 5_000, 10_000, 11_000, 30_000, 700_000, 3_700_000]))
        def time_passes(self, dt: int) -> None:
            self.now += dt

        @rule(long=st.booleans())
        def claims_are_swept(self, long: bool) -> None:
            """An hour or a day passes, and a claim sweeps the claims due (here the claim of a
            copy whose call Redis does not know, young: it runs)."""
            self.now += (CLAIMS_LONG_MS if long else CLAIMS_MS) + 1
            self.n += 1
            member = f"{0:012d}:sweep{self.n}"
            c = Copy(-self.n, member, "sweep", self.now, 1, 0.0)
            assert self._claim(c)

        @rule(room=st.integers(0, 3), dies=st.booleans())
        def dispatch(self, room: int, dies: bool) -> None:
            expected = self.model.take(room, self.now)
            taken = self.fq.take(store, room, MOST, now=self.now / 1000)
            assert [(c.member, c.copy) for c in taken.calls] == expected
            assert (taken.waiting, taken.flying) == (len(self.model.fq), len(self.model.transit))
            if dies:  # the dispatcher died before publishing: they stay in transit
                return
            sent = dispatcher.send_on(self.fq, taken)
            went = []
            for member, _ in expected:
                _, _, readable = self.model.text[member]
                if readable:
                    went.append(member)
                else:
                    self.model.drop(member)
                    self.model.fate[self.model.call_of[member]] = "dead"
            assert sent == len(went)
            assert sorted(c.member for c in self._arrivals()) == sorted(went)

        @precondition(lambda self: self.in_broker)
        @rule(data=st.data(), denied=st.booleans())
        def a_copy_arrives(self, data: st.DataObject, denied: bool) -> None:
            which = data.draw(st.sampled_from(sorted(self.in_broker)), label="copy")
            c = self.in_broker.pop(which)
            assert broker.lrem(self.queue_name, 1, c.raw) == 1
            if not self._claim(c):
                return  # a second copy: dropped
            if denied:  # sent on just before its room: it waits again, in its place
                self.n += 1
                tenant = self.model.tenant[c.call]
                member = self.model.put(f"{c.call}-again", tenant, c.tag, True)
                tag, _ = self.fq.put(
                    store, f"{c.call}-again", tenant, 1.0 / WEIGHTS[tenant], c.tag,
                    self._text(tenant, c.call, True),
                )  # fmt: skip
                assert tag == c.tag
                self.model.member_of[c.call] = member
                self.model.call_of[member] = c.call
                return
            self.model.ran.setdefault(c.call, set()).add(c.token)
            self.model.fate[c.call] = "ran"
            self.delivered.append(c)

        @precondition(lambda self: self.delivered)
        @rule(data=st.data())
        def the_same_copy_arrives_again(self, data: st.DataObject) -> None:
            c = data.draw(st.sampled_from(self.delivered), label="copy")
            if self._claim(c):
                self.model.ran[c.call].add(c.token)

        @precondition(lambda self: self.in_broker)
        @rule(data=st.data())
        def a_copy_is_revoked(self, data: st.DataObject) -> None:
            which = data.draw(st.sampled_from(sorted(self.in_broker)), label="copy")
            c = self.in_broker.pop(which)
            broker.lrem(self.queue_name, 1, c.raw)
            expected = self.model.claim(c.member, c.token, self.now, c.sent, c.copy)
            carried = {"fair": c.member, "release": c.token, "sent": c.sent / 1000}
            carried.update(copy=c.copy, fq=self.fq.describe())
            dispatcher.forget_revoked(
                request=SimpleNamespace(id=str(c.call), governor=carried), now=self.now / 1000
            )
            if expected and c.call not in self.model.fate:
                self.model.fate[c.call] = "revoked"

        # -- invariants ---------------------------------------------------------------------

        @invariant()
        def redis_holds_what_the_model_says(self) -> None:
            model = self.model
            fq, fm, ft, fv, fn, fl, fs, fx, fc = self.fq.key_names(
                "fq", "fm", "ft", "fv", "fn", "fl", "fs", "fx", "fc"
            )

            def zset(key: str) -> dict[str, float]:
                return {k.decode(): s for k, s in store.zrange(key, 0, -1, withscores=True)}

            def hash_(key: str) -> dict[str, str]:
                return {k.decode(): v.decode() for k, v in store.hgetall(key).items()}

            assert zset(fq) == model.fq
            assert set(hash_(fm)) == set(model.text)
            assert zset(ft) == model.last
            v, seq = (store.get(fv) or b"0:0").decode().split(":")
            assert (float(v), int(seq)) == (model.v, model.seq)
            assert {t: int(n) for t, n in hash_(fn).items()} == model.waiting
            assert zset(fl) == model.transit
            assert {m: int(n) for m, n in hash_(fc).items()} == model.copies
            assert hash_(fs) == model.claims
            assert zset(fx) == model.forget_at
            dead = {d.entry for d in dead_letters.entries(store, prefix)}
            assert dead == {m for m, n in model.call_of.items() if model.fate.get(n) == "dead"}

        @invariant()
        def every_call_is_somewhere_and_runs_once(self) -> None:
            model = self.model
            for call, member in model.member_of.items():
                places = [
                    member in model.fq,
                    member in model.transit,
                    call in model.fate,
                ]
                assert sum(places) == 1, (call, member, places)
            for call, tokens in model.ran.items():
                assert len(tokens) == 1 and model.fate[call] == "ran", (call, tokens)

        @invariant()
        def shares_follow_the_weights(self) -> None:
            """Over any stretch of first takes while tenants a and b both had calls waiting
            (and none of them waited again after being sent on), n_a / w_a and n_b / w_b stay
            within 1 / w_a + 1 / w_b (self-clocked fair queuing's bound)."""
            log = self.model.log
            for end in range(self.checked, len(log)):
                for a in WEIGHTS:
                    for b in WEIGHTS:
                        if a >= b:
                            continue
                        bound = 1 / WEIGHTS[a] + 1 / WEIGHTS[b] + 1e-9
                        n = {a: 0, b: 0}
                        for start in range(end, -1, -1):
                            tenant, again, waiting = log[start]
                            if again or not {a, b} <= waiting:
                                break
                            if tenant in n:
                                n[tenant] += 1
                            gap = abs(n[a] / WEIGHTS[a] - n[b] / WEIGHTS[b])
                            assert gap <= bound, (a, b, start, end, log[start : end + 1])
            self.checked = len(log)

        def teardown(self) -> None:
            if hasattr(self, "queue_name"):
                broker.delete(self.queue_name)

    return Fair


def test_the_fair_queue_keeps_every_call_and_the_shares(redis_server: ServerHandle) -> None:
    base = settings()  # the profile loaded (tests/conftest.py): thorough digs deeper
    examples = max(20, base.max_examples // 5)
    steps = 40 if base.max_examples <= 150 else 100
    run_state_machine_as_test(
        build(redis_server),
        settings=settings(base, max_examples=examples, stateful_step_count=steps),
    )
