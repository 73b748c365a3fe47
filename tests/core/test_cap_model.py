"""The concurrency cap as a protocol: a hypothesis state machine drives the real scripts on the
real redis-server with an explicit clock, the way the Celery layer does (governor/celery/
waiting.py and handover.py), against a small model of the world around them: a broker holding
messages, workers running bodies (renewed every third of the lease, as the renewer does),
workers that die, copies, revoked tasks, lost messages, blocks, and a slot carried from a
task that ended to the next one of its process (given back in that task's own decision, by the
carrier when none follows, or left to lapse when the process dies meanwhile).

Invariants: never more holders than the cap; no holder id runs twice (a run cut short by a
dead worker may run again; a finished one never); at most one message of a holder is out at a
time (so a late copy cannot run a finished task); and once everything in flight has arrived and
every lease has lapsed, every task that waited was handed a slot or left with a reason
(revoked, or a lapsed hand-over whose message was lost, listed by ``Limiter.lapsed``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from governor import Limiter
from governor.decision import Hold

T0 = 1_800_000_000.0
TASKS = [f"t{i}:0" for i in range(6)]
S = "s"
TICKS = (0.01, 0.3, 0.5, 1.0, 1.01, 4.0, 4.01, 12.0)
ACTIONS = (
    ["deliver"] * 5
    + ["release"] * 3
    + ["tick"] * 4
    + ["arrive"] * 2
    + ["sweep"] * 2
    + ["kill", "copy_arrives", "block", "revoke", "lose"]
    + ["linger_ends", "kill_lingering"]
)


@dataclass
class Run:
    hold: Hold
    state: str = "live"  # live | ended (its slot lingers) | done | killed
    redelivered: bool = False  # the broker gave its message again (at most once per delivery)


@dataclass
class World:
    """What is true outside Redis."""

    broker: list[tuple[str, str]] = field(default_factory=list)  # (holder, message), in order
    runs: dict[str, list[Run]] = field(default_factory=dict)
    submitted: set[str] = field(default_factory=set)
    revoked: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)  # holders a message of which the broker lost
    kept: dict[str, str] = field(default_factory=dict)  # the message a holder left in Redis
    lingering: tuple[str, Run] | None = None  # a slot carried to the process's next task
    messages: int = 0

    def message(self, holder: str) -> str:
        self.messages += 1
        return f"{holder}#{self.messages}"

    def live(self) -> list[tuple[str, Run]]:
        return [(h, run) for h, runs in self.runs.items() for run in runs if run.state == "live"]

    def out(self, holder: str) -> int:
        return sum(1 for h, _ in self.broker if h == holder)


class CapMachine(RuleBasedStateMachine):
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        super().__init__()
        self.client, self.prefix = client, prefix
        self.world = World()
        self.now = T0
        self.lim: Limiter | None = None

    @initialize(
        limit=st.integers(1, 3),
        lease=st.sampled_from([1.0, 4.0]),
        first=st.lists(st.sampled_from(TASKS), min_size=1, max_size=len(TASKS), unique=True),
    )
    def setup(self, limit: int, lease: float, first: list[str]) -> None:
        self.limit, self.lease = limit, lease
        name = f"m{uuid.uuid4().hex[:8]}"
        self.lim = Limiter(
            self.client, None, concurrency=limit, lease=lease, name=name, prefix=self.prefix
        )
        for holder in first:
            self.submit(holder)

    @property
    def cap(self) -> Limiter:
        assert self.lim is not None
        return self.lim

    # -- what the Celery layer does ---------------------------------------------------------

    def publish(self, handed: tuple[tuple[str, str], ...]) -> None:
        """Handover.publish: each handed message goes to the broker."""
        for holder, message in handed:
            assert self.world.kept.get(holder) == message, (holder, message, self.world.kept)
            assert self.world.out(holder) == 0, f"a second message of {holder} goes out"
            del self.world.kept[holder]
            self.world.broker.append((holder, message))

    def gate(self, holder: str, message: str) -> None:
        """A message of ``holder`` reaches the gate (Gate._decide, Waiting.wait); the process
        it reaches gives back the slot its previous task left lingering, in the same call
        (governor/celery/decisions/carried.py)."""
        for _attempt in range(3):
            given = self.world.lingering
            self.world.lingering = None
            d = self.cap.acquire(
                S,
                holder=holder,
                token=uuid.uuid4().hex[:8],
                info="node 1",
                now=self.now,
                give_back=None if given is None else given[1].hold,
            )
            if given is not None:  # given back as a release: a copy behind it is dropped
                given[1].state = "done"
                self.world.kept.pop(given[0], None)
            self.publish(d.handed)
            if d.allowed:
                assert d.hold is not None
                runs = self.world.runs.setdefault(holder, [])
                assert not any(r.state == "live" for r in runs), f"{holder} runs twice at once"
                assert not any(r.state in ("done", "ended") for r in runs), f"{holder} ran again"
                runs.append(Run(d.hold))
                return
            if d.blocked is not None:  # re-published to come back after the block
                self.world.broker.append((holder, self.world.message(holder)))
                return
            if d.capped == "done":  # a copy of a task that ran: dropped
                return
            w = self.cap.wait(S, holder, message, now=self.now)
            self.publish(w.handed)
            if w.status == "queued":  # in line, or behind its running copy: acknowledged
                self.world.kept[holder] = message
                return
            if w.status == "done":
                return
        self.world.broker.append((holder, self.world.message(holder)))  # come back soon

    # -- rules ------------------------------------------------------------------------------

    @rule(action=st.sampled_from(ACTIONS), pick=st.integers(0, 100), flag=st.booleans())
    def act(self, action: str, pick: int, flag: bool) -> None:
        """One thing happens (weighted: arrivals and endings more often than faults)."""
        getattr(self, action)(pick, flag)

    def submit(self, holder: str) -> None:
        if holder not in self.world.submitted:
            self.world.submitted.add(holder)
            self.world.broker.append((holder, self.world.message(holder)))

    def arrive(self, pick: int, _flag: bool) -> None:
        """A new task is published (or one already published: nothing new)."""
        self.submit(TASKS[pick % len(TASKS)])

    def deliver(self, pick: int, _flag: bool = False) -> None:
        if self.world.broker:
            self.reach(*self.world.broker.pop(pick % len(self.world.broker)))

    def reach(self, holder: str, message: str) -> None:
        """A message reaches a worker."""
        if holder in self.world.revoked:  # Celery drops it; the lead's wiring: leave()
            left = self.cap.leave(S, holder, now=self.now)
            self.world.kept.pop(holder, None)
            self.publish(left.handed)
            return
        self.gate(holder, message)

    def release(self, pick: int, linger: bool = False) -> None:
        """A body ends: its slot is given back, or lingers for the process's next task."""
        live = self.world.live()
        if not live:
            return
        holder, run = live[pick % len(live)]
        if linger and self.world.lingering is None:
            run.state = "ended"
            self.world.lingering = (holder, run)
            return
        self.give_back(holder, run)

    def give_back(self, holder: str, run: Run) -> None:
        released, handed = self.cap.release(S, run.hold, now=self.now)
        assert released, f"{holder} renewed in time but lost its slot"
        run.state = "done"
        self.world.kept.pop(holder, None)  # a copy that waited behind it is dropped
        self.publish(handed)

    def linger_ends(self, _pick: int, _flag: bool) -> None:
        """No task followed: the carrier gives the lingering slot back."""
        if self.world.lingering is not None:
            holder, run = self.world.lingering
            self.world.lingering = None
            self.give_back(holder, run)

    def kill_lingering(self, _pick: int, _flag: bool) -> None:
        """The process dies while its slot lingers: the slot lapses after its lease (a copy
        behind it may then run: as for a process killed during the body)."""
        if self.world.lingering is not None:
            self.world.lingering[1].state = "killed"
            self.world.lingering = None

    def kill(self, pick: int, redeliver: bool) -> None:
        """The worker running it dies; the broker may deliver its message again."""
        live = self.world.live()
        if not live:
            return
        holder, run = live[pick % len(live)]
        run.state = "killed"
        if redeliver and not run.redelivered:
            run.redelivered = True
            assert self.world.out(holder) == 0
            self.world.broker.append((holder, self.world.message(holder)))

    def copy_arrives(self, pick: int, _flag: bool) -> None:
        """A copy of a running task arrives now (its message redelivered: visibility timeout)."""
        live = [(h, r) for h, r in self.world.live() if not r.redelivered]
        if live:
            holder, run = live[pick % len(live)]
            run.redelivered = True
            self.reach(holder, self.world.message(holder))

    def tick(self, pick: int, _flag: bool = False) -> None:
        """Time passes; live bodies renew every third of the lease (the renewer)."""
        end = self.now + TICKS[pick % len(TICKS)]
        while self.now < end:
            self.now = min(end, self.now + self.lease / 3)
            renewed = self.world.live()
            if self.world.lingering is not None:  # renewed until given back
                renewed.append(self.world.lingering)
            for holder, run in renewed:
                assert self.cap.renew(S, run.hold, now=self.now), f"{holder} lost its slot"

    def sweep(self, _pick: int = 0, _flag: bool = False) -> None:
        self.publish(self.cap.sweep(S, now=self.now)[1])

    def block(self, pick: int, _flag: bool) -> None:
        self.cap.block(S, (0.5, 2.0, 5.0)[pick % 3], "maintenance", now=self.now)

    def revoke(self, pick: int, _flag: bool) -> None:
        """revoke(): a running body goes on; later messages of it are dropped on arrival."""
        self.world.revoked.add(TASKS[pick % len(TASKS)])

    def lose(self, pick: int, _flag: bool) -> None:
        """A message never arrives (the broker lost it, or Celery dropped it unannounced)."""
        if not self.world.broker:
            return
        holder, _ = self.world.broker.pop(pick % len(self.world.broker))
        self.world.lost.add(holder)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def within_the_cap(self) -> None:
        if self.lim is None:
            return
        usage = self.cap.holders(S, now=self.now)
        assert len(usage.holders) <= self.limit
        assert len(self.world.live()) <= self.limit
        running = {h.holder: h.fence for h in usage.holders if not h.pending}
        for holder, run in self.world.live():
            assert running.get(holder) == run.hold.fence, f"{holder} runs without its slot"
        for holder in {h for h, _ in self.world.broker}:
            assert self.world.out(holder) <= 1, f"two messages of {holder} are out"

    def teardown(self) -> None:
        if self.lim is None:
            return
        try:
            self.drain()
        finally:
            keys = self.cap.cap_keys(S)
            self.client.delete(*keys, *(self.cap.wake_key(S, h) for h in TASKS))

    def drain(self) -> None:
        """Everything in flight arrives, bodies end, blocks end and leases lapse."""
        self.cap.unblock(S)
        self.linger_ends(0, False)
        for _ in range(500):
            if self.world.broker:
                self.deliver(0)
            elif self.world.live():
                self.release(0)
            elif (
                self.cap.holders(S, now=self.now).holders
                or self.cap.holders(S, now=self.now).waiting
            ):
                self.tick(TICKS.index(12.0))
                self.sweep()
            else:
                break
        usage = self.cap.holders(S, now=self.now)
        assert usage.holders == () and usage.waiting == 0, usage
        assert not self.world.broker and not self.world.live()
        lapsed = {h for h, _ in self.cap.lapsed(S, now=self.now)}
        for holder in self.world.submitted:
            runs = self.world.runs.get(holder, [])
            if any(r.state == "done" for r in runs):
                assert holder not in lapsed
                continue
            # it never finished: it left with a reason
            assert (
                holder in self.world.revoked
                or holder in self.world.lost
                or any(r.state == "killed" for r in runs)
            ), f"{holder} neither ran nor left: {runs}"
        for holder in lapsed:  # a hand-over stays lapsed only when its message was lost
            assert holder in self.world.lost, holder


def test_the_cap_protocol(r: redis.Redis, prefix: str) -> None:
    """100 runs of 40 steps by default (a few seconds); GOVERNOR_HYPOTHESIS=thorough runs the
    profile's 3000."""
    current = settings()
    run_state_machine_as_test(
        lambda: CapMachine(r, prefix),
        settings=settings(
            current,
            max_examples=current.max_examples if current.max_examples > 150 else 100,
            stateful_step_count=40,
        ),
    )
