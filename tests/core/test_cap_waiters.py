"""Processes waiting for a concurrency slot, and holders' tokens (issue 18, findings 7, 10 and
12): a waiter that reuses a running holder's id waits without spinning and gives up once that
holder finished; a waiter whose place in line was lost takes one again; a token that would not
fit a cap entry is refused at the edge."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from governor import Concurrency, Limiter, SubjectError
from governor.decision import Hold
from support.celery_helpers import wait_for


def scripts_run(r: redis.Redis) -> int:
    """Scripts the server ran so far (EVALSHA and EVAL)."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_a_reused_holder_waits_without_spinning(r: redis.Redis, prefix: str) -> None:
    cap = Concurrency(r, 2, name="reuse", prefix=prefix, lease=30)
    first = cap.acquire("s", holder="job-1")
    assert first is not None
    before = scripts_run(r)
    started = time.monotonic()
    assert cap.acquire("s", holder="job-1", timeout=0.4) is None  # a live copy holds it
    assert time.monotonic() - started >= 0.35
    assert scripts_run(r) - before <= 10  # it waited for the lease, it did not ask in a loop
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(cap.acquire("s", holder="job-1")))
    waiter.start()  # timeout=None
    assert wait_for(lambda: r.hexists(cap.limiter.cap_keys("s")[3], "pjob-1"), bool, timeout=5)
    before = scripts_run(r)
    try:
        first.release()  # job-1 ran: the copy that waits gives up at once, it does not spin
    finally:
        waiter.join(5)
    assert not waiter.is_alive() and got == [None]
    assert scripts_run(r) - before <= 10
    assert cap.holders("s").holders == ()


def test_a_waiter_that_lost_its_place_queues_again(r: redis.Redis, prefix: str) -> None:
    """Its place gone (as when its hand-over lapsed before it woke), a waiting process queues
    again when it next looks (by the holder's lease end), instead of waiting outside the
    line until it times out."""
    cap = Concurrency(r, 1, name="lost-place", prefix=prefix, lease=0.5)
    held = cap.acquire("s")
    assert held is not None
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(cap.acquire("s", holder="P", timeout=20)))
    waiter.start()
    try:
        assert wait_for(lambda: cap.holders("s").waiting, bool, timeout=5, every=0.01) == 1
        assert cap.limiter.leave("s", "P").place == "waiting"  # its place is gone
        assert cap.holders("s").waiting == 0
        back = wait_for(lambda: cap.holders("s").waiting, bool, timeout=5, every=0.01)
        assert back == 1  # back in line, by the holder's lease end
    finally:
        held.release()
        waiter.join(10)
    permit = got[0]
    assert permit is not None and permit.holder == "P"  # type: ignore[attr-defined]
    permit.release()  # type: ignore[attr-defined]


def test_tokens_that_do_not_fit_a_cap_entry_are_refused(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, None, concurrency=2, name="tok", prefix=prefix)
    for bad in ("a b", "tab\there", "-", "x" * 300):
        with pytest.raises(SubjectError, match="token"):
            lim.acquire("s", holder="h", token=bad)
    d = lim.acquire("s", holder="h", token="good")
    assert d.hold is not None
    with pytest.raises(SubjectError, match="token"):
        lim.release("s", Hold("h", "a b", d.hold.fence, d.hold.lease))
    with pytest.raises(SubjectError, match="token"):
        lim.renew("s", Hold("h", "", d.hold.fence, d.hold.lease))
    assert [h.holder for h in lim.holders("s").holders] == ["h"]  # readable, untouched
    assert lim.release("s", d.hold) == (True, ())
