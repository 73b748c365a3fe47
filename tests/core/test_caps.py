"""governor.Concurrency and capped limiters on a real Redis: slots, waiting without polling,
renewal, lost slots, dead holders, fencing tokens, the asyncio twin, and several processes
hammering one cap."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from governor import Concurrency, ConfigError, GovernorTimeout, Limiter, SlotLost
from governor.aio import Concurrency as AioConcurrency
from governor.aio import Limiter as AioLimiter
from governor.caps import _spaced
from governor.decision import Hold
from support.celery_helpers import wait_for
from support.servers import ServerHandle


def test_slots_are_taken_and_given_back(r: redis.Redis, prefix: str) -> None:
    cap = Concurrency(r, 2, name="warehouse", prefix=prefix)
    first = cap.acquire("export", info="node-1")
    second = cap.acquire("export")
    assert first is not None and second is not None
    assert second.fence > first.fence
    assert cap.acquire("export", blocking=False) is None
    usage = cap.holders("export")
    assert usage.held == 2 and usage.waiting == 0
    assert {h.holder for h in usage.holders} == {first.holder, second.holder}
    assert next(h.info for h in usage.holders if h.holder == first.holder) == "node-1"
    assert first.release() == (True, ())
    assert first.release() == (False, ())  # once only
    with cap.hold("export") as third:
        assert third.fence > second.fence
        assert cap.holders("export").held == 2
    assert cap.holders("export").held == 1
    second.release()
    assert cap.holders("export").holders == ()


@pytest.mark.compat
def test_a_waiter_is_woken_when_a_slot_frees(r: redis.Redis, prefix: str) -> None:
    cap = Concurrency(r, 1, name="one", prefix=prefix)
    held = cap.acquire("s")
    assert held is not None
    got: list[float] = []

    def wait() -> None:
        with cap.hold("s", timeout=10):
            got.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: cap.holders("s").waiting, bool, timeout=5, every=0.005)
    assert cap.holders("s").waiting == 1
    released_at = time.monotonic()
    held.release()
    thread.join(10)
    assert got, "the waiter never got the slot"
    assert got[0] - released_at < 0.5  # woken by Redis, not by a poll interval


def test_waits_time_out_and_leave_the_line(r: redis.Redis, prefix: str) -> None:
    cap = Concurrency(r, 1, name="busy", prefix=prefix)
    held = cap.acquire("s")
    assert held is not None
    started = time.monotonic()
    assert cap.acquire("s", timeout=0.3) is None
    assert 0.25 < time.monotonic() - started < 3
    assert cap.holders("s").waiting == 0
    with pytest.raises(GovernorTimeout, match=r"within 0\.2s"), cap.hold("s", timeout=0.2):
        pass
    held.release()
    assert cap.holders("s").holders == ()


def test_a_slot_is_renewed_while_held(r: redis.Redis, prefix: str) -> None:
    cap = Concurrency(r, 1, name="long", prefix=prefix, lease=0.3)
    with cap.hold("s") as permit:
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:  # four leases long
            assert cap.acquire("s", blocking=False) is None
            time.sleep(0.05)
        assert not permit.lost
        permit.check()
    after = cap.acquire("s", blocking=False)
    assert after is not None
    after.release()


def test_a_lost_slot_is_reported(r: redis.Redis, prefix: str) -> None:
    lost: list[object] = []
    cap = Concurrency(r, 1, name="lost", prefix=prefix, lease=0.3, on_lost=lost.append)
    permit = cap.acquire("s")
    assert permit is not None
    r.delete(*cap.limiter.cap_keys("s"))  # as if its lease lapsed and a sweep removed it
    wait_for(lambda: permit.lost, bool, timeout=3, every=0.02)
    assert permit.lost and lost == [permit]
    with pytest.raises(SlotLost):
        permit.check()
    assert permit.release() == (False, ())


def test_a_cap_that_keeps_a_message_never_expires(r: redis.Redis, prefix: str) -> None:
    """A cap's state lives as long as its last lease, unless it keeps a message (a waiter's, a
    copy's behind its running holder): then it never expires. The usual call on a cap with
    nobody waiting skips what only matters otherwise, so the first message on such a cap must
    still make it persistent."""
    lim = Limiter(r, None, concurrency=1, name=f"keep{uuid.uuid4().hex[:6]}", prefix=prefix)
    for subject, waiter in (("line", "w:0"), ("copy", "a:0")):  # a waiter; a copy of a:0
        assert lim.acquire(subject, holder="a:0", now=T).allowed
        holders, entries = lim.cap_keys(subject)[2:4]
        assert r.pttl(holders) > 0 and r.pttl(entries) > 0  # as long as the lease
        assert lim.wait(subject, waiter, f"message of {waiter}", now=T).status == "queued"
        assert r.pttl(holders) == -1 and r.pttl(entries) == -1, subject


def test_a_lingering_slot_lost_after_its_task_ended_is_no_alarm(
    r: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A slot kept for the process's next task (its body ended: ``ended``) that is lost lets
    nothing run over the cap: logged at INFO, no ``on_lost`` (no slot_lost signal)."""
    lost: list[object] = []
    cap = Concurrency(r, 1, name="ended", prefix=prefix, lease=30.0, on_lost=lost.append)
    permit = cap.acquire("s")
    assert permit is not None
    permit.ended = True
    r.delete(*cap.limiter.cap_keys("s"))
    with caplog.at_level("INFO", logger="governor"):
        assert not permit.renew()
    assert permit.lost and lost == []
    [record] = [x for x in caplog.records if "lingering slot" in x.getMessage()]
    assert record.levelname == "INFO" and "its task ended" in record.getMessage()
    assert not [x for x in caplog.records if x.levelname == "ERROR"]


def test_a_dead_holder_frees_its_slot_when_its_lease_lapses(
    redis_server: ServerHandle, r: redis.Redis, prefix: str
) -> None:
    """A holder killed with SIGKILL renews no more: its slot goes to the waiter one lease
    later, and never earlier."""
    code = (
        "import sys, time, redis\n"
        "from governor import Concurrency\n"
        "cap = Concurrency(redis.Redis.from_url(sys.argv[1]), 1, name='dead', prefix=sys.argv[2],"
        " lease=1.0)\n"
        "cap.acquire('s')\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, redis_server.url(0), prefix],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"held"
        cap = Concurrency(r, 1, name="dead", prefix=prefix, lease=1.0)
        os.killpg(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        with cap.hold("s", timeout=10):
            waited = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert 0.3 < waited < 3.0  # within a lease (1 s) of the kill, plus a sweep's chance


def test_a_waiting_process_that_dies_is_skipped(r: redis.Redis, prefix: str) -> None:
    """A slot handed to a waiter that never takes it goes on after the lease."""
    lim = Limiter(r, None, concurrency=1, lease=0.3, name="ghost", prefix=prefix)
    held = lim.acquire("s", holder="h1")
    assert held.hold is not None
    assert lim.wait("s", "ghost", "").status == "queued"  # then dies
    cap = Concurrency(r, 1, name="ghost", prefix=prefix, lease=0.3)
    lim.release("s", held.hold)  # handed to the ghost
    with cap.hold("s", timeout=5):
        pass


def test_redelivered_copies_wait_for_a_live_original(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, None, concurrency=2, lease=1.0, name="copy", prefix=prefix)
    original = lim.acquire("s", holder="task-1:0")
    assert original.allowed and original.hold is not None
    copy = lim.acquire("s", holder="task-1:0")
    assert not copy.allowed and copy.capped == "copy" and 0 < copy.retry_after <= 1.0
    lim.release("s", original.hold)
    again = lim.acquire("s", holder="task-1:0")
    assert not again.allowed and again.capped == "done"  # it ran: the copy is dropped


def test_caps_with_rules_are_all_or_nothing(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "2/m", concurrency=5, name="both", prefix=prefix)
    a = lim.acquire("s", holder="a")
    b = lim.acquire("s", holder="b")
    c = lim.acquire("s", holder="c")
    assert a.allowed and b.allowed and not c.allowed and c.rule is not None
    assert c.hold is None and lim.holders("s").held == 2  # denied by a rule: no slot taken
    lim.release("s", a.hold)  # type: ignore[arg-type]
    assert lim.holders("s").held == 1
    assert lim.usage("s").rules[0].used == 2  # a slot given back is not a refund


def test_bad_configuration_is_refused(r: redis.Redis, prefix: str) -> None:
    with pytest.raises(ConfigError, match="concurrency must be"):
        Concurrency(r, 0, name="x", prefix=prefix)
    with pytest.raises(ConfigError, match="lease"):
        Concurrency(r, 1, name="x", prefix=prefix, lease=0)
    with pytest.raises(ConfigError, match="needs rules"):
        Limiter(r, None, name="x", prefix=prefix)
    with pytest.raises(ConfigError, match="cannot lease"):
        Limiter(r, "10/s", concurrency=1, name="x", prefix=prefix).lease("s", span=0.1)
    with pytest.raises(ValueError, match="holder"):
        Concurrency(r, 1, name="x", prefix=prefix).acquire("s", holder="has space")


T = 1_800_000_000.0


def test_an_acquire_gives_a_slot_back_first_as_a_release_would(
    r: redis.Redis, redis_server: ServerHandle, prefix: str
) -> None:
    lim = Limiter(r, None, concurrency=1, name=f"gb{uuid.uuid4().hex[:6]}", prefix=prefix)
    a = lim.acquire("s", holder="a:0", now=T)
    assert a.allowed and a.hold is not None
    assert lim.acquire("s", holder="a:0", now=T).capped == "copy"  # a copy of it asks
    wrong = Hold("a:0", "not-its-token", 0, 30.0)
    b = lim.acquire("s", holder="b:0", give_back=wrong, now=T)
    assert not b.allowed and b.capped == "full"  # never another holder's slot
    b = lim.acquire("s", holder="b:0", give_back=a.hold, now=T + 1)
    assert b.allowed and b.hold is not None and b.hold.fence > a.hold.fence
    assert [h.holder for h in lim.holders("s", now=T + 1).holders] == ["b:0"]
    assert lim.acquire("s", holder="a:0", now=T + 1).capped == "done"  # the copy is dropped
    # a slot given back goes to the oldest waiter before the caller is asked
    assert lim.wait("s", "c:0", "message of c", now=T + 1).status == "queued"
    d = lim.acquire("s", holder="d:0", give_back=b.hold, now=T + 2)
    assert not d.allowed and d.capped == "full" and d.handed == (("c:0", "message of c"),)
    assert lim.release("s", b.hold, now=T + 2) == (False, ())  # given back already

    async def twin() -> None:
        client = aioredis.Redis.from_url(redis_server.url(0))
        alim = AioLimiter(client, None, concurrency=1, name=lim.name + "a", prefix=prefix)
        x = await alim.acquire("s", holder="x:0", now=T)
        y = await alim.acquire("s", holder="y:0", give_back=x.hold, now=T)
        assert y.allowed and [h.holder for h in (await alim.holders("s", now=T)).holders] == ["y:0"]
        await client.aclose()

    asyncio.run(twin())


@pytest.mark.compat
def test_the_asyncio_twin(redis_server: ServerHandle, prefix: str) -> None:
    async def main() -> tuple[int, float]:
        client = aioredis.Redis.from_url(redis_server.url(0))
        cap = AioConcurrency(client, 2, name="aio", prefix=prefix, lease=0.3)
        running = peak = 0

        async def work() -> None:
            nonlocal running, peak
            async with cap.hold("s", timeout=10) as permit:
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.1)
                permit.check()
                running -= 1

        started = time.monotonic()
        await asyncio.gather(*(work() for _ in range(6)))
        elapsed = time.monotonic() - started
        async with cap.hold("s") as permit:  # renewed past its lease
            await asyncio.sleep(0.8)
            assert not permit.lost
        assert (await cap.holders("s")).holders == ()
        await client.aclose()
        return peak, elapsed

    peak, elapsed = asyncio.run(main())
    assert peak == 2
    assert 0.25 < elapsed < 3.0


def _hammer(url: str, prefix: str, key: str, rounds: int) -> None:
    client = redis.Redis.from_url(url)
    cap = Concurrency(client, 2, name="hammer", prefix=prefix, lease=2.0)
    for _ in range(rounds):
        with cap.hold("s", timeout=30):
            start = time.time()
            time.sleep(0.002)
            client.rpush(key, json.dumps([start, time.time()]))


def test_processes_hammering_one_cap_never_exceed_it(
    redis_server: ServerHandle, r: redis.Redis, prefix: str
) -> None:
    key = f"{prefix}:intervals:{uuid.uuid4().hex}"
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_hammer, args=(redis_server.url(0), prefix, key, 25)) for _ in range(6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    intervals = [json.loads(x) for x in r.lrange(key, 0, -1)]
    assert len(intervals) == 150
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, change in events:  # an end at the same instant as a start counts first
        running += change
        peak = max(peak, running)
    assert peak <= 2


def test_threads_sharing_one_cap_never_exceed_it(r: redis.Redis, prefix: str) -> None:
    """One Concurrency object shared by eight threads (each hold renews on its own thread)."""
    cap = Concurrency(r, 3, name="threads", prefix=prefix, lease=2.0)
    intervals: list[tuple[float, float]] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(15):
            with cap.hold("s", timeout=30):
                start = time.time()
                time.sleep(0.002)
                with lock:
                    intervals.append((start, time.time()))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert len(intervals) == 120
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    assert peak <= 3
    assert cap.holders("s").holders == ()


@given(st.text(max_size=12))
def test_a_space_in_a_holder_id_is_found_as_str_isspace_finds_it(text: str) -> None:
    assert _spaced(text) == any(c.isspace() for c in text)
