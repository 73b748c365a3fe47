"""Holder ids and tokens of a concurrency cap (issue 18, findings 7 and 12): a waiter that
reuses a running holder's id waits without spinning and gives up once that holder finished;
a token that would not fit a cap entry is refused at the edge."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_helpers import wait_for
from governor import Concurrency, Limiter, SubjectError
from governor.decision import Hold


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
    wait_for(lambda: r.hexists(cap.limiter.cap_keys("s")[3], "pjob-1"), bool, timeout=5)
    before = scripts_run(r)
    first.release()  # job-1 ran: the copy that waits gives up at once, it does not spin
    waiter.join(5)
    assert not waiter.is_alive() and got == [None]
    assert scripts_run(r) - before <= 10
    assert cap.holders("s").holders == ()


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
