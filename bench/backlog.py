"""A backlog of 1,000 tasks on 2 worker nodes: governor against Celery's own rate_limit.

    python -m bench.backlog                 # about 6 minutes on 2 cores
    python -m bench.backlog --tasks 400 --celery-timeout 60

Each scenario starts 2 separate ``celery worker`` nodes (prefork, 2 processes each) on a private
Redis broker, publishes the whole backlog at once, and records when every task body starts.

overshoot     the most starts in any window of each rule, divided by the limit (1.00 = exact)
waits/task    governance waits per task (governor), or Celery retries per task
rebooked      tasks that missed their booked slot (started > governor_late_tolerance late, a busy
              machine) and booked again, behind the queue: they are what makes wall > ideal
utilization   the earliest schedule the rules allow for the tasks that started (governor's
              planner) / the time they took from first start to last: 100% = as fast as allowed
parked peak   most tasks parked in Redis at once (governor)
wall / ideal  time from the first start to the last (and to the 99th percentile), against
              the earliest schedule the rules allow (governor's planner); for Celery, "did not
              finish" after --celery-timeout
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import redis

from bench.common import table
from governor.embedded import EmbeddedRedis
from governor.plan import most_in_window, plan
from governor.rules import parse_rules

ROOT = Path(__file__).resolve().parent.parent


def run(
    server: EmbeddedRedis,
    tasks: int,
    rules: str,
    *,
    governed: bool,
    timeout: float,
    park_after: float,
) -> dict[str, object]:
    key = f"gb{uuid.uuid4().hex[:8]}"
    queue = f"q{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "GB_BROKER": server.url(1),
        "GB_STORE": server.url(2),
        "GB_RECORD": server.url(3),
        "GB_KEY": key,
        "GB_PARK": str(park_after),
        "GB_QUEUES": json.dumps({queue: rules} if governed else {}),
        "GB_RATE": "" if governed else rules,
        "PYTHONPATH": str(ROOT),
    }
    logs = Path(tempfile.mkdtemp(prefix="governor-backlog-"))
    procs = []
    for i in range(2):
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "bench.backlog_app",
                    "worker",
                    "-P",
                    "prefork",
                    "-c",
                    "2",
                    "-n",
                    f"n{i}-{key}@%h",
                    "-Q",
                    queue,
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "-l",
                    "WARNING",
                ],
                cwd=ROOT,
                env=env,
                stdout=(logs / f"n{i}.log").open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    record = redis.Redis.from_url(server.url(3))
    store = redis.Redis.from_url(server.url(2))
    parked_peak = 0
    try:
        time.sleep(4)  # let both nodes connect
        from celery import Celery

        producer = Celery("producer", broker=server.url(1))
        published = time.time()
        with producer.producer_or_acquire() as p:
            for n in range(tasks):
                producer.send_task("backlog_app.call", (n,), queue=queue, producer=p)
        deadline = published + timeout
        while record.llen(key) < tasks and time.time() < deadline:
            if governed:
                parked_peak = max(
                    parked_peak,
                    store.zcard("governor:{parked}:due") + store.zcard("governor:{parked}:lease"),
                )
            time.sleep(0.25)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    rows = [json.loads(x) for x in record.lrange(key, 0, -1)]
    starts = sorted(r[0] for r in rows)
    parsed = parse_rules(rules)
    ideal = plan(parsed, tasks)[-1]
    overshoot = max(most_in_window(starts, r.period) / r.limit for r in parsed) if starts else 0
    took = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    fastest = plan(parsed, len(starts))[-1] if starts else 0.0
    return {
        "done": len({r[1] for r in rows}),
        "runs": len(rows),
        "overshoot": overshoot,
        "waits": sum(r[2] + r[3] for r in rows) / max(1, len(rows)),
        "rebooked": sum(1 for r in rows if r[2] > 1),
        "utilization": fastest / took if took else 0.0,
        "parked": parked_peak,
        "wall": starts[-1] - starts[0] if starts else 0.0,
        "wall99": starts[max(0, math.ceil(0.99 * len(starts)) - 1)] - starts[0] if starts else 0.0,
        "ideal": ideal,
        "finished": len({r[1] for r in rows}) >= tasks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rules", default="20/s")
    parser.add_argument(
        "--several", default="20/s, 500/m", help="a second governor scenario with several rules"
    )
    parser.add_argument("--celery-timeout", type=float, default=90.0)
    parser.add_argument("--park-after", type=float, default=10.0)
    args = parser.parse_args()
    scenarios = [
        (f"governor {args.rules}", args.rules, True),
        (f"governor {args.several}", args.several, True),
        (f"Celery rate_limit={args.rules!r}", args.rules, False),
    ]
    rows = []
    with EmbeddedRedis() as server:
        print(
            f"{args.tasks} tasks, 2 nodes x 2 prefork processes, private Redis "
            f"({redis.Redis.from_url(server.url()).info()['redis_version']}); "
            f"park_after {args.park_after}s\n"
        )
        for label, rules, governed in scenarios:
            timeout = (plan(rules, args.tasks)[-1] + 60) if governed else args.celery_timeout
            r = run(
                server,
                args.tasks,
                rules,
                governed=governed,
                timeout=timeout,
                park_after=args.park_after,
            )
            wall = f"{r['wall']:.1f}s (99%: {r['wall99']:.1f}s) / {r['ideal']:.1f}s"
            if not r["finished"]:
                wall = f"did not finish in {timeout:.0f}s ({r['done']} done)"
            rows.append(
                [
                    label,
                    f"{r['done']}/{args.tasks}",
                    f"{r['overshoot']:.2f}",
                    f"{r['waits']:.2f}",
                    str(r["rebooked"]) if governed else "-",
                    f"{r['utilization']:.0%}",
                    str(r["parked"]) if governed else "-",
                    wall,
                    str(r["runs"] - r["done"]),
                ]
            )
            print(f"  {label}: done", flush=True)
    print()
    print(
        table(
            [
                "scenario",
                "done",
                "overshoot",
                "waits/task",
                "rebooked",
                "utilization",
                "parked peak",
                "wall / ideal",
                "duplicates",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
