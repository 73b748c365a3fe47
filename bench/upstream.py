"""Upstream feedback: an HTTP upstream allows fewer calls than the app's rules, and answers the
rest with 429 + Retry-After. How many 429s, how fast, how long, with and without feedback.

    python -m bench.upstream                       # about a minute and a half on 2 cores
    python -m bench.upstream --tasks 600 --quota 20 --rules 60/s
    python -m bench.upstream --quota 5 --rules 10/s --modes adaptive   # fewer than 10 units

Workers: 2 separate ``celery worker`` nodes (prefork, 2 processes each) on a private Redis
broker; the whole backlog is published at once. The upstream counts calls per fixed second.

429s        answers of 429 the upstream gave (and the share of all its answers); and those in
            the second half of the run (once an adaptive limit has learnt the quota)
throughput  successful calls per second from the first to the last, against the quota; and
            the answers of 200 a second in the second half
wall        first call to last success
retries     Celery retries per task (only the hand-written ``self.retry`` spends them)
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import redis

from bench.common import table
from bench.nodes import send, start_nodes, stop_nodes
from governor.embedded import EmbeddedRedis
from tests.support.upstream_server import upstream

MODES = {
    "retry": "self.retry(countdown) on 429",
    "backoff": "Backoff",
    "adaptive": "Backoff + adaptive",
}


def run(server: EmbeddedRedis, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    key = f"gu{uuid.uuid4().hex[:8]}"
    queue = f"q{uuid.uuid4().hex[:6]}"
    with upstream(args.quota, 1.0) as up:
        env = {
            "GU_BROKER": server.url(1),
            "GU_STORE": server.url(2),
            "GU_RECORD": server.url(3),
            "GU_KEY": key,
            "GU_MODE": mode,
            "GU_QUEUE": queue,
            "GU_RULES": args.rules,
            "GU_URL": up.url,
            "GU_COUNTDOWN": str(args.countdown),
        }
        procs = start_nodes("upstream_app", env, queue)
        record = redis.Redis.from_url(server.url(3))
        try:
            time.sleep(3.0)  # let both nodes connect
            send(server.url(1), "upstream_app.call", queue, [(n,) for n in range(args.tasks)])
            deadline = time.monotonic() + args.timeout
            while record.llen(f"{key}:done") < args.tasks and time.monotonic() < deadline:
                time.sleep(0.2)
            done = [json.loads(x) for x in record.lrange(f"{key}:done", 0, -1)]
            log = list(up.log)
        finally:
            stop_nodes(procs)
    refused = sum(1 for _, s in log if s == 429)
    first = min(t for t, _ in log) if log else 0.0
    last = max(d[0] for d in done) if done else first
    wall = last - first
    late = sum(1 for t, s in log if s == 429 and t >= first + wall / 2)
    late_ok = sum(1 for t, s in log if s == 200 and t >= first + wall / 2)
    return {
        "done": f"{len({d[1] for d in done})}/{args.tasks}",
        "429s": f"{refused} ({refused / max(1, len(log)):.0%})",
        "late": str(late),
        "throughput": f"{len(done) / wall:.1f}/s of {args.quota}/s" if wall else "-",
        "late_rate": f"{late_ok / (wall / 2):.1f}/s" if wall else "-",
        "wall": f"{wall:.1f} s (ideal {args.tasks / args.quota:.1f} s)",
        "retries": f"{sum(d[2] for d in done) / max(1, len(done)):.2f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--quota", type=int, default=10, help="the upstream's calls per second")
    parser.add_argument("--rules", default="40/s", help="the app's rules (a guess, too high)")
    parser.add_argument("--countdown", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"which scenarios, of {','.join(MODES)}"
    )
    args = parser.parse_args()
    rows = []
    with EmbeddedRedis() as server:
        for mode in args.modes.split(","):
            name = MODES[mode]
            r = run(server, mode, args)
            print(f"{name}: {r}", flush=True)
            rows.append(
                [
                    name,
                    r["done"],
                    r["429s"],
                    r["late"],
                    r["throughput"],
                    r["late_rate"],
                    r["wall"],
                    r["retries"],
                ]
            )
    print(
        f"\n{args.tasks} calls, upstream allowing {args.quota}/s (429 + Retry-After beyond), "
        f"app rules {args.rules}, 2 nodes x 2 prefork processes:\n"
    )
    header = [
        "scenario",
        "done",
        "429s",
        "in the 2nd half",
        "throughput",
        "200s in the 2nd half",
        "wall",
        "retries/task",
    ]
    print(table(header, rows))


if __name__ == "__main__":
    main()
