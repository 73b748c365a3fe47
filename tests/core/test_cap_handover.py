"""Hand-overs of a concurrency cap on the real scripts, with an explicit clock: a waiter's
message is published once, a hand-over nobody starts frees its slot after one lease, a copy of
a running holder waits in Redis (not in the broker), and a waiter keeps its place when a block
meets its hand-over (issue 18, findings 1, 2 and 10).

``Broker`` stands for the broker: every message a script hands over is "published" into it,
and a test delivers them as a Celery worker would (see governor/celery/waiting.py)."""

from __future__ import annotations

import redis

from governor import Limiter

T0 = 1_800_000_000.0
LEASE = 30.0


class Broker:
    """What the scripts handed over, in order: (holder, message)."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str]] = []

    def publish(self, handed: tuple[tuple[str, str], ...]) -> None:
        self.published += handed

    def copies(self, holder: str) -> int:
        return sum(1 for h, _ in self.published if h == holder)


def cap(r: redis.Redis, prefix: str, limit: int = 1) -> Limiter:
    return Limiter(r, None, concurrency=limit, lease=LEASE, name="ho", prefix=prefix)


def run(lim: Limiter, broker: Broker, holder: str, at: float, ran: list[str]) -> bool:
    """A copy of ``holder`` arrives at ``at``: it runs if admitted (and is recorded)."""
    d = lim.acquire("s", holder=holder, now=at)
    broker.publish(d.handed)
    if d.allowed:
        ran.append(holder)
    return d.allowed


def test_a_handed_over_task_runs_once_however_late_its_message(r: redis.Redis, prefix: str) -> None:
    """Finding 1's repro: cap 1, lease 30 s; A holds, B waits; A releases at +1 s (B is handed
    the slot). B's message is late in the broker: governor must not publish it again, so no
    second copy can run after the first one ran and released."""
    lim, broker, ran = cap(r, prefix), Broker(), []
    assert run(lim, broker, "A", T0, ran)
    assert lim.wait("s", "B", "MSG-B", now=T0 + 0.5).status == "queued"
    a = lim.holders("s", now=T0 + 0.5).holders[0]
    released, handed = lim.release("s", "A", info=a.info, now=T0 + 1)
    assert released and handed == (("B", "MSG-B"),)
    broker.publish(handed)
    broker.publish(lim.sweep("s", now=T0 + 31.01)[1])  # B's hand-over lapses unstarted
    assert broker.copies("B") == 1  # not published again
    # every copy the broker holds arrives, late, one after the other
    at = T0 + 41
    for holder, _message in list(broker.published):
        if run(lim, broker, holder, at, ran):
            lim.release("s", holder, info="", now=at + 4)
        at += 30
    assert ran.count("B") == 1


def test_a_copy_of_a_running_holder_waits_in_redis_and_is_dropped_when_it_ends(
    r: redis.Redis, prefix: str
) -> None:
    """A redelivered copy of a running task is not sent back through the broker (where it
    could outlive any memory of the original): it waits in Redis behind the original and is
    dropped when the original releases, however long after."""
    lim, broker = cap(r, prefix, 2), Broker()
    first = lim.acquire("s", holder="X", now=T0)
    assert first.hold is not None
    copy = lim.acquire("s", holder="X", now=T0 + 1)
    assert copy.capped == "copy"
    w = lim.wait("s", "X", "COPY-X", now=T0 + 1)
    assert w.status == "queued"  # kept in Redis: the caller acknowledges the copy
    assert lim.renew("s", first.hold, now=T0 + 20)
    released, handed = lim.release("s", first.hold, now=T0 + 45)
    assert released and handed == ()
    broker.publish(lim.sweep("s", now=T0 + 500)[1])
    assert broker.copies("X") == 0  # the copy never runs: the original did


def test_a_copy_takes_over_when_its_original_dies(r: redis.Redis, prefix: str) -> None:
    """The original's lease lapses (its worker died): the copy that waits behind it is handed
    the slot, as a redelivered task should be."""
    lim, broker, ran = cap(r, prefix), Broker(), []
    assert run(lim, broker, "X", T0, ran)
    assert lim.acquire("s", holder="X", now=T0 + 1).capped == "copy"
    assert lim.wait("s", "X", "COPY-X", now=T0 + 1).status == "queued"
    assert lim.wait("s", "Y", "MSG-Y", now=T0 + 2).status == "queued"
    nxt, handed = lim.sweep("s", now=T0 + LEASE + 0.001)
    assert handed == (("X", "COPY-X"),) and nxt > 0
    assert run(lim, broker, "X", T0 + 32, ran)  # the copy starts on the slot kept for it
    assert ran == ["X", "X"]


def test_a_hand_over_nobody_starts_frees_its_slot_after_one_lease(
    r: redis.Redis, prefix: str
) -> None:
    """Finding 2: a handed-over waiter whose message never arrives (revoked, expired, or
    unreadable) does not hold the slot past one lease: the sweep passes it on, once, and
    never re-hands it to the same waiter."""
    lim, broker, ran = cap(r, prefix), Broker(), []
    assert run(lim, broker, "A", T0, ran)
    for i, holder in enumerate("BC"):
        assert lim.wait("s", holder, f"MSG-{holder}", now=T0 + 0.1 + i).status == "queued"
    a = lim.holders("s", now=T0 + 3).holders[0]
    broker.publish(lim.release("s", "A", info=a.info, now=T0 + 3)[1])
    assert broker.published == [("B", "MSG-B")]
    # B never comes: one lease later its slot goes to C
    _, handed = lim.sweep("s", now=T0 + 3 + LEASE + 0.001)
    assert handed == (("C", "MSG-C"),)
    assert [h.holder for h in lim.holders("s", now=T0 + 34).holders] == ["C"]
    for k in range(2, 6):  # later sweeps never hand anything to B (or C, who never came) again
        assert lim.sweep("s", now=T0 + 3 + k * LEASE + 1)[1] == ()
    lapsed = lim.lapsed("s", now=T0 + 200)
    assert [(h, round(at - T0, 3)) for h, at in lapsed] == [("B", 33.001), ("C", 64.0)]
    assert lim.holders("s", now=T0 + 200).holders == ()


def test_a_lapsed_waiter_whose_copy_comes_back_keeps_its_place(r: redis.Redis, prefix: str) -> None:
    """B's hand-over lapsed while its message was late; when the message arrives B goes back to
    the head of the line (before C, who came later), with the message it brought."""
    lim, broker, ran = cap(r, prefix), Broker(), []
    assert run(lim, broker, "A", T0, ran)
    assert lim.wait("s", "B", "MSG-B", now=T0 + 1).status == "queued"
    a = lim.holders("s", now=T0 + 2).holders[0]
    lim.release("s", "A", info=a.info, now=T0 + 2)
    assert run(lim, broker, "D", T0 + 40, ran)  # B lapsed, the slot was free for D
    assert lim.wait("s", "C", "MSG-C", now=T0 + 41).status == "queued"
    assert not run(lim, broker, "B", T0 + 50, ran)  # B's late copy: full
    w = lim.wait("s", "B", "MSG-B2", now=T0 + 50)
    assert (w.status, w.position) == ("queued", 0)  # ahead of C
    d = lim.holders("s", now=T0 + 51).holders[0]
    assert lim.release("s", "D", info=d.info, now=T0 + 51)[1] == (("B", "MSG-B2"),)
    assert lim.lapsed("s", now=T0 + 51) == ()


def test_leave_takes_a_gone_task_out_of_every_place(r: redis.Redis, prefix: str) -> None:
    """What the Celery layer calls for a revoked or expired task (or an unreadable message):
    leave() takes it out of the line, gives back a slot handed to it, forgets a lapsed
    hand-over, and drops a copy waiting behind a running holder; it never touches a running
    holder's own slot. It returns where the task was and its message (for a dead letter)."""
    lim, broker, ran = cap(r, prefix), Broker(), []
    assert run(lim, broker, "A", T0, ran)
    for i, holder in enumerate("BCD"):
        assert lim.wait("s", holder, f"MSG-{holder}", now=T0 + 1 + i).status == "queued"
    left = lim.leave("s", "C", now=T0 + 5)
    assert (left.place, left.message, left.handed) == ("waiting", "MSG-C", ())
    a = lim.holders("s", now=T0 + 6).holders[0]
    assert lim.release("s", "A", info=a.info, now=T0 + 6)[1] == (("B", "MSG-B"),)
    left = lim.leave("s", "B", now=T0 + 7)  # revoked after it was handed the slot
    assert (left.place, left.message, left.handed) == ("handed", "MSG-B", (("D", "MSG-D"),))
    assert lim.sweep("s", now=T0 + 7 + LEASE + 1)[1] == ()  # D's hand-over lapses
    left = lim.leave("s", "D", now=T0 + 100)
    assert (left.place, left.message) == ("lapsed", "MSG-D")
    assert run(lim, broker, "E", T0 + 101, ran)
    assert lim.acquire("s", holder="E", now=T0 + 102).capped == "copy"
    assert lim.wait("s", "E", "COPY-E", now=T0 + 102).status == "queued"
    left = lim.leave("s", "E", now=T0 + 103)
    assert (left.place, left.message) == ("copy", "COPY-E")
    assert [h.holder for h in lim.holders("s", now=T0 + 103).holders] == ["E"]  # still runs
    assert lim.leave("s", "E", now=T0 + 104).place == ""  # nothing more to leave
    assert lim.sweep("s", now=T0 + 101 + LEASE + 1)[1] == ()  # E died: no copy takes over


def test_a_waiting_process_keeps_its_place_when_a_block_meets_its_hand_over(
    r: redis.Redis, prefix: str
) -> None:
    """Finding 10: process P waits; the slot is handed to it, but the subject is blocked when
    P asks for it. P must not lose its place: a newcomer after the block is still refused,
    and P gets the slot."""
    lim = cap(r, prefix)
    a = lim.acquire("s", holder="A", now=T0)
    assert a.hold is not None
    assert lim.wait("s", "P", now=T0 + 1).status == "queued"  # "" message: a process
    lim.release("s", a.hold, now=T0 + 2)
    lim.block("s", 5, "maintenance", now=T0 + 2)
    denied = lim.acquire("s", holder="P", now=T0 + 2.5)
    assert not denied.allowed and denied.blocked == "maintenance"
    newcomer = lim.acquire("s", holder="N", now=T0 + 8)
    assert not newcomer.allowed and newcomer.capped == "full"
    assert lim.acquire("s", holder="P", now=T0 + 8.5).allowed
