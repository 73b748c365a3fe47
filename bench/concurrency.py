"""Concurrency caps: slot use and hand-over latency, governor against a hand-written semaphore.

    python -m bench.concurrency                       # about a minute on 2 cores
    python -m bench.concurrency --tasks 120 --sleep 0.3 --cap 3

Workers: 2 separate ``celery worker`` nodes (prefork, 3 processes each: more than the cap) on a
private Redis broker; the whole backlog is published at once. Each body sleeps ``--sleep``.

max at once    the most bodies running at the same moment (from their start and end times)
slots busy     time the bodies ran / (cap x time from the first start to the last end)
wall / ideal   first start to last end, against tasks x sleep / cap
hand-over      governor: from the moment a process freed a slot and published the next
               waiting task to that task's start (p50 / p99)
retries/task   the hand-written semaphore's retries (``countdown`` seconds apart)
primitive      ``governor.Concurrency`` in one process, 8 threads: from a release to the
               waiting thread's return from ``acquire`` (a Redis PING round trip for scale)
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from typing import Any

import redis

from bench.common import table
from bench.nodes import send, start_nodes, stop_nodes
from governor import Concurrency
from governor.embedded import EmbeddedRedis


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] if values else 0.0


def run_nodes(server: EmbeddedRedis, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    key = f"gc{uuid.uuid4().hex[:8]}"
    queue = f"q{uuid.uuid4().hex[:6]}"
    env = {
        "GC_BROKER": server.url(1),
        "GC_STORE": server.url(2),
        "GC_RECORD": server.url(3),
        "GC_KEY": key,
        "GC_MODE": mode,
        "GC_CAP": str(args.cap),
        "GC_SLEEP": str(args.sleep),
        "GC_QUEUE": queue,
        "GC_RETRY": str(args.countdown),
    }
    procs = start_nodes("concurrency_app", env, queue, concurrency=3)
    record = redis.Redis.from_url(server.url(3))
    try:
        time.sleep(3.0)  # let both nodes connect
        send(server.url(1), "concurrency_app.work", queue, [(n,) for n in range(args.tasks)])
        deadline = time.monotonic() + args.timeout
        while record.llen(f"{key}:ends") < args.tasks and time.monotonic() < deadline:
            time.sleep(0.2)
        ends = [json.loads(x) for x in record.lrange(f"{key}:ends", 0, -1)]
        handover = [float(x) for x in record.lrange(f"{key}:handover", 0, -1)]
    finally:
        stop_nodes(procs)
    intervals = [(e[0], e[1]) for e in ends]
    span = max(e for _, e in intervals) - min(s for s, _ in intervals) if intervals else 0.0
    busy = sum(e - s for s, e in intervals) / (args.cap * span) if span else 0.0
    return {
        "done": f"{len({e[2] for e in ends})}/{args.tasks}",
        "max": most_at_once(intervals),
        "busy": f"{busy:.1%}",
        "wall": f"{span:.2f} s / {args.tasks * args.sleep / args.cap:.2f} s",
        "handover": (
            f"{1000 * pct(handover, 0.5):.1f} / {1000 * pct(handover, 0.99):.1f} ms"
            if handover
            else "-"
        ),
        "retries": f"{sum(e[3] for e in ends) / max(1, len(ends)):.2f}",
    }


def run_primitive(server: EmbeddedRedis, rounds: int = 300) -> dict[str, float]:
    """One holder releases, one waiting thread returns from acquire: the latency between."""
    client = redis.Redis.from_url(server.url(4))
    cap = Concurrency(client, 1, name="bench", prefix=f"gc{uuid.uuid4().hex[:6]}")
    pings = []
    for _ in range(rounds):
        t = time.perf_counter()
        client.ping()
        pings.append(time.perf_counter() - t)
    latencies: list[float] = []
    for _ in range(rounds):
        held = cap.acquire("s")
        assert held is not None
        got: list[tuple[float, Any]] = []

        def wait(out: list[tuple[float, Any]] = got) -> None:
            permit = cap.acquire("s")
            out.append((time.perf_counter(), permit))

        waiter = threading.Thread(target=wait)
        waiter.start()
        while cap.holders("s").waiting == 0:
            time.sleep(0.0005)
        released = time.perf_counter()
        held.release()
        waiter.join()
        latencies.append(got[0][0] - released)
        got[0][1].release()
    return {
        "ping_p50": pct(pings, 0.5),
        "p50": pct(latencies, 0.5),
        "p99": pct(latencies, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=90)
    parser.add_argument("--sleep", type=float, default=0.3)
    parser.add_argument("--cap", type=int, default=3)
    parser.add_argument("--countdown", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    with EmbeddedRedis() as server:
        rows = []
        for name, mode in (("governor cap", "governor"), ("INCR semaphore + retry", "retry")):
            r = run_nodes(server, mode, args)
            rows.append(
                [
                    name,
                    r["done"],
                    r["max"],
                    r["busy"],
                    r["wall"],
                    r["handover"],
                    r["retries"] if mode == "retry" else "0",
                ]
            )
            print(f"{name}: {r}", flush=True)
        prim = run_primitive(server)
    print(
        f"\n{args.tasks} tasks of {args.sleep} s under {args.cap} at once, 2 nodes x 3 prefork "
        f"processes (countdown {args.countdown} s for the hand-written semaphore):\n"
    )
    print(
        table(
            [
                "scenario",
                "done",
                "max at once",
                "slots busy",
                "wall / ideal",
                "hand-over p50 / p99",
                "retries/task",
            ],
            rows,
        )
    )
    print(
        f"\ngovernor.Concurrency in one process: release -> waiter returns p50 "
        f"{1e3 * prim['p50']:.2f} ms, p99 {1e3 * prim['p99']:.2f} ms "
        f"(Redis PING round trip p50 {1e3 * prim['ping_p50']:.2f} ms: the p50 is "
        f"{prim['p50'] / prim['ping_p50']:.1f} PINGs)"
    )


if __name__ == "__main__":
    main()
