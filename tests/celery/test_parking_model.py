"""The parking / releaser cycle against a small pure-Python model (a hypothesis
``RuleBasedStateMachine``), driving the real scripts (park.lua, take_due.lua, dead_put.lua) on
the suite's redis-server with an explicit clock, the real releaser and a real broker (the
suite's Redis, db 1), and the consumer's claim of each copy that arrives.

Steps: park (readable, pickled while the app accepts JSON only, or not JSON at all), let time
pass, release, a releaser that dies after its pickup or after publishing one entry, deliver a
copy, deliver the same copy again, fix the app (accept pickle), re-drive or drop a dead letter.
After each step, Redis holds what the model says, entry by entry; at the end everything is
released and delivered.

Invariants: every parked entry is released, dead-lettered or still parked, never lost; no two
copies of one entry run (the same copy delivered again may); an entry nobody can read never
holds the releaser up (it is dead-lettered the first time it is taken); and, once the releaser
ran long enough, every readable entry ran exactly once.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

import redis
from celery import Celery
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

from governor.celery.waiting import dead_letters, parking
from governor.celery.waiting.envelope import envelope, open_envelope
from governor.celery.waiting.releaser import Releaser
from support.servers import ServerHandle

T0 = 1_800_000_000_000  # ms
HORIZON, PICKUP, BATCH = 5_000, 2_000, 2  # ms, ms, entries a group per take
KINDS = ("good", "pickled", "junk")


@dataclass
class Model:
    """What Redis should hold: each group's due and picked-up entries (id -> score, ms)."""

    groups: list[int | None]
    due: dict[int | None, dict[str, int]] = field(default_factory=dict)
    picked: dict[int | None, dict[str, int]] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)
    pickle_ok: bool = False
    dead: set[str] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)
    published: set[str] = field(default_factory=set)
    """Entries with at least one copy published."""
    ran: dict[str, str] = field(default_factory=dict)
    """Entry -> the token of the copy that claimed it."""

    def __post_init__(self) -> None:
        for g in self.groups:
            self.due.setdefault(g, {})
            self.picked.setdefault(g, {})

    def readable(self, pid: str) -> bool:
        return self.kind[pid] == "good" or (self.kind[pid] == "pickled" and self.pickle_ok)

    def take(self, now: int) -> list[str]:
        """take_due.lua, group by group: lapsed pickups first, then what is due within the
        horizon, by (score, id), at most BATCH a group; each is picked up until now+PICKUP."""
        out = []
        for g in self.groups:
            due, picked = self.due[g], self.picked[g]
            lapsed = sorted((s, p) for p, s in picked.items() if s <= now)[:BATCH]
            room = BATCH - len(lapsed)
            ready = sorted((s, p) for p, s in due.items() if s <= now + HORIZON)[: max(room, 0)]
            for _, pid in lapsed + ready:
                due.pop(pid, None)
                picked[pid] = now + PICKUP
                out.append(pid)
        return out

    def forget(self, pid: str) -> None:
        for g in self.groups:
            self.picked[g].pop(pid, None)
            self.due[g].pop(pid, None)

    def claim(self, pid: str, token: str) -> bool:
        if pid not in self.ran:
            self.ran[pid] = token
            return True
        return self.ran[pid] == token

    def parked(self) -> set[str]:
        return {p for g in self.groups for p in (*self.due[g], *self.picked[g])}


def build(redis_server: ServerHandle) -> type[RuleBasedStateMachine]:
    store = redis.Redis.from_url(redis_server.url(2))
    broker = redis.Redis.from_url(redis_server.url(1))
    app = Celery(f"pm-{uuid.uuid4().hex[:6]}", broker=redis_server.url(1), set_as_current=False)

    @app.task(shared=False, name="pm.job")
    def job(n: int) -> None: ...

    class Parking(RuleBasedStateMachine):
        @initialize(shards=st.sampled_from([1, 3]))
        def start(self, shards: int) -> None:
            self.prefix = f"pm{uuid.uuid4().hex[:10]}"
            self.queue = f"pm-{uuid.uuid4().hex[:10]}"
            self.shards = shards
            self.now = T0
            self.n = 0
            app.conf.accept_content = ["json"]
            self.model = Model(parking.all_shards(shards))
            self.releaser = Releaser(
                app, lambda: store, self.prefix, HORIZON / 1000, pickup=PICKUP / 1000,
                batch=BATCH, shards=shards,
            )  # fmt: skip
            self.in_broker: dict[tuple[str, int], tuple[bytes, str]] = {}
            """(parking id, its n-th copy) -> (the message, its release token)."""
            self.seen: set[bytes] = set()
            self.seen_copies: list[tuple[str, str]] = []
            self.delivered: list[tuple[str, str]] = []

        # -- helpers ------------------------------------------------------------------------

        def _new_messages(self) -> list[tuple[str, str]]:
            """Copies the releaser published since the last look: (parking id, token)."""
            fresh = []
            for raw in broker.lrange(self.queue, 0, -1):
                if raw not in self.seen:
                    self.seen.add(raw)
                    carried = json.loads(raw)["headers"]["governor"]
                    pid, token = carried["parked"], carried["release"]
                    copies = sum(1 for p, _ in self.seen_copies if p == pid)
                    self.seen_copies.append((pid, token))
                    self.in_broker[(pid, copies)] = (raw, token)
                    fresh.append((pid, token))
            return fresh

        def _text(self, kind: str, n: int) -> str:
            if kind == "junk":
                return "not-json"
            sig = job.s(n).set(queue=self.queue)
            if kind == "pickled":
                sig = sig.set(serializer="pickle")
            return envelope(app, sig, 0.0, "queue:q")

        # -- rules --------------------------------------------------------------------------

        @rule(kind=st.sampled_from(KINDS), delay=st.integers(-3_000, 20_000))
        def park(self, kind: str, delay: int) -> None:
            self.n += 1
            pid = parking.new_parking_id(f"t{self.n}:1:ab", self.shards)
            due = self.now + delay
            parking.park(store, self.prefix, pid, due / 1000, self._text(kind, self.n))
            self.model.due[parking.shard_of(pid)][pid] = due
            self.model.kind[pid] = kind

        @rule(dt=st.sampled_from([0, 1, 500, 1_000, 2_000, 2_001, 7_000, 30_000]))
        def wait(self, dt: int) -> None:
            self.now += dt

        @rule()
        def release(self) -> None:
            expected = self.model.take(self.now)
            published = self.releaser.release_once(now=self.now / 1000)
            went = [p for p in expected if self.model.readable(p)]
            for pid in expected:
                self.model.forget(pid)
                if self.model.readable(pid):
                    self.model.published.add(pid)
                else:
                    self.model.dead.add(pid)
            assert published == len(went)
            assert sorted(p for p, _ in self._new_messages()) == sorted(went)

        @rule()
        def releaser_dies_after_its_pickup(self) -> None:
            expected = self.model.take(self.now)
            _, taken = parking.take_due(
                store, self.prefix, HORIZON / 1000, PICKUP / 1000, BATCH, self.shards,
                now=self.now / 1000,
            )  # fmt: skip
            assert [p for p, _ in taken] == expected

        @rule()
        def releaser_dies_after_publishing_one(self) -> None:
            """It published its first readable entry, and died before forgetting it."""
            expected = self.model.take(self.now)
            _, taken = parking.take_due(
                store, self.prefix, HORIZON / 1000, PICKUP / 1000, BATCH, self.shards,
                now=self.now / 1000,
            )  # fmt: skip
            assert [p for p, _ in taken] == expected
            for pid, text in taken:
                if self.model.readable(pid):
                    sig, _, _ = open_envelope(app, text)
                    parking.stamp_release(sig, pid)
                    sig.apply_async()
                    self.model.published.add(pid)
                    assert [p for p, _ in self._new_messages()] == [pid]
                    break

        @precondition(lambda self: self.in_broker)
        @rule(data=st.data())
        def deliver(self, data: st.DataObject) -> None:
            which = data.draw(st.sampled_from(sorted(self.in_broker)), label="copy")
            raw, token = self.in_broker.pop(which)
            pid = which[0]
            assert broker.lrem(self.queue, 1, raw) == 1
            expected = self.model.claim(pid, token)
            assert parking.claim_first_delivery(store, self.prefix, pid, token) == expected
            self.delivered.append((pid, token))

        @precondition(lambda self: self.delivered)
        @rule(data=st.data())
        def deliver_the_same_copy_again(self, data: st.DataObject) -> None:
            pid, token = data.draw(st.sampled_from(self.delivered), label="copy")
            expected = self.model.claim(pid, token)
            assert parking.claim_first_delivery(store, self.prefix, pid, token) == expected

        @rule()
        def fix_the_app(self) -> None:
            app.conf.accept_content = ["json", "pickle"]
            self.model.pickle_ok = True

        @precondition(lambda self: self.model.dead)
        @rule(data=st.data(), redrive=st.booleans())
        def handle_a_dead_letter(self, data: st.DataObject, redrive: bool) -> None:
            letters = {d.entry: d for d in dead_letters.entries(store, self.prefix)}
            pid = data.draw(st.sampled_from(sorted(self.model.dead)), label="letter")
            self.model.dead.discard(pid)
            if redrive:
                assert dead_letters.redrive(store, self.prefix, letters[pid]) == pid
                self.model.due[parking.shard_of(pid)][pid] = 0
            else:
                assert dead_letters.drop(store, self.prefix, [letters[pid].id]) == 1
                self.model.dropped.add(pid)

        # -- invariants ---------------------------------------------------------------------

        @invariant()
        def redis_holds_what_the_model_says(self) -> None:
            for g in self.model.groups:
                due_key, _, lease_key = parking.keys(self.prefix, g)
                due = {k.decode(): int(s) for k, s in store.zrange(due_key, 0, -1, withscores=True)}
                picked = {
                    k.decode(): int(s) for k, s in store.zrange(lease_key, 0, -1, withscores=True)
                }
                assert due == self.model.due[g]
                assert picked == self.model.picked[g]
            dead = {d.entry for d in dead_letters.entries(store, self.prefix)}
            assert dead == self.model.dead

        @invariant()
        def nothing_is_lost_and_nothing_runs_twice(self) -> None:
            model = self.model
            for pid in model.kind:
                where = [
                    pid in model.parked(),
                    pid in model.dead,
                    pid in model.dropped,
                    pid in model.published and pid not in model.parked(),
                ]
                assert sum(where) == 1, (pid, where)
            # a copy that ran is the one that claimed its entry: at most one a parking id
            ran = {}
            for pid, token in self.delivered:
                if model.ran.get(pid) == token:
                    ran.setdefault(pid, set()).add(token)
            assert all(len(tokens) == 1 for tokens in ran.values())

        def teardown(self) -> None:
            if not hasattr(self, "model"):
                return
            # the releaser runs long enough: everything parked goes out or to the dead letters
            for _ in range(len(self.model.parked()) + 3):
                if not self.model.parked():
                    break
                self.now += PICKUP + 1 + HORIZON
                self.release()
            assert not self.model.parked()
            assert store.zcard(parking.keys(self.prefix)[0]) == 0
            # every copy arrives: each readable entry that went out runs exactly once
            while self.in_broker:
                which = sorted(self.in_broker)[0]
                raw, token = self.in_broker.pop(which)
                pid = which[0]
                broker.lrem(self.queue, 1, raw)
                assert parking.claim_first_delivery(store, self.prefix, pid, token) == (
                    self.model.claim(pid, token)
                )
            for pid in self.model.published:
                assert pid in self.model.ran
            for pid in self.model.kind:
                if pid not in self.model.published:
                    assert pid in self.model.dead or pid in self.model.dropped
            broker.delete(self.queue)

    return Parking


def test_the_parking_cycle_keeps_every_entry(redis_server: ServerHandle) -> None:
    base = settings()  # the profile loaded (tests/conftest.py): thorough digs deeper
    examples = max(20, base.max_examples // 5)
    steps = 40 if base.max_examples <= 150 else 100
    run_state_machine_as_test(
        build(redis_server),
        settings=settings(base, max_examples=examples, stateful_step_count=steps),
    )
