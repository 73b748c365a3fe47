"""Fair sharing of a quota between tenants, against first come, first served (``fair_by=None``).

    python -m bench.fairness                  # about 5 minutes on 2 cores
    python -m bench.fairness --only flood

Workers: 2 separate ``celery worker`` nodes (prefork, 2 processes each) on a private Redis
broker; tasks are no-ops that record when they started.

flood     tenant A sends --flood calls at once under 20/s; tenant B sends 20 two seconds later:
          when B's first and last calls started (after B sent them), when A's last did (ideal:
          all calls at 20/s), the most starts in any second
weights   A (weight 3) and B (weight 1) each send 300 at once under 20/s: A's share of the
          starts while both wait (ideal 75%), the worst Jain's index of weighted shares over any
          10 s window (sliding by 1 s) while both wait
many      one tenant sends 2,000 at once, then 1,000 tenants send 5 each, under 100/s: the
          small tenants' waits (start minus published); their p99 over a small tenant's fair-share
          interval (its 5 calls at rate / tenants); and the p99 of each small call's wait over its
          own bound (its position in its tenant x the tenants / the rate)
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from bench.common import table
from bench.nodes import send, start_nodes, stop_nodes
from governor.embedded import EmbeddedRedis

Runs = list[tuple[float, str, int, float]]
"""(started, tenant, n, sent)"""


def run(
    server: EmbeddedRedis, fair: bool, rules: str, weights: dict[str, int], total: int,
    publish: Callable[[str, str], None], timeout: float,
) -> Runs:  # fmt: skip
    key, queue = f"gf{uuid.uuid4().hex[:8]}", f"q{uuid.uuid4().hex[:6]}"
    env = {
        "GF_BROKER": server.url(1), "GF_STORE": server.url(2), "GF_RECORD": server.url(3),
        "GF_KEY": key, "GF_QUEUE": queue, "GF_RULES": rules, "GF_FAIR": "1" if fair else "0",
        "GF_WEIGHTS": json.dumps(weights),
    }  # fmt: skip
    procs = start_nodes("fairness_app", env, queue)
    record = redis.Redis.from_url(server.url(3))
    try:
        time.sleep(3.0)  # let both nodes connect
        publish(server.url(1), queue)
        deadline = time.monotonic() + timeout
        while record.llen(f"{key}:runs") < total and time.monotonic() < deadline:
            time.sleep(0.2)
        return [tuple(json.loads(x)) for x in record.lrange(f"{key}:runs", 0, -1)]  # type: ignore[misc]
    finally:
        stop_nodes(procs)


def calls(tenant: str, count: int) -> list[tuple[object, ...]]:
    return [(tenant, n, None) for n in range(count)]  # sent: stamped when published


def most_in(starts: list[float], window: float) -> int:
    starts = sorted(starts)
    return max(
        (sum(1 for t in starts[i:] if t < s + window) for i, s in enumerate(starts)), default=0
    )


def flood(server: EmbeddedRedis, fair: bool, args: argparse.Namespace) -> list[Any]:
    marks: dict[str, float] = {}

    def publish(broker: str, queue: str) -> None:
        marks["a"] = time.time()
        send(broker, "fairness_app.report", queue, calls("A", args.flood))
        time.sleep(max(0.0, 2.0 - (time.time() - marks["a"])))
        marks["b"] = time.time()
        send(broker, "fairness_app.report", queue, calls("B", 20))

    runs = run(server, fair, "20/s", {}, args.flood + 20, publish, args.flood / 20 + 60)
    b = sorted(r[0] for r in runs if r[1] == "B")
    a = sorted(r[0] for r in runs if r[1] == "A")
    ideal = (args.flood + 20) / 20
    return [
        "fair" if fair else "FIFO", f"{len(runs)}/{args.flood + 20}",
        f"{b[0] - marks['b']:.2f} s" if b else "-", f"{b[-1] - marks['b']:.2f} s" if b else "-",
        f"{a[-1] - marks['a']:.1f} s / {ideal:.1f} s" if a else "-",
        most_in([r[0] for r in runs], 1.0),
    ]  # fmt: skip


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if values else 1.0


def weights(server: EmbeddedRedis, fair: bool, args: argparse.Namespace) -> list[Any]:
    def publish(broker: str, queue: str) -> None:
        send(broker, "fairness_app.report", queue, calls("A", 300) + calls("B", 300))

    runs = sorted(run(server, fair, "20/s", {"A": 3}, 600, publish, 90))
    last_b = max(r[0] for r in runs if r[1] == "B")
    last_a = max(r[0] for r in runs if r[1] == "A")
    both = [r for r in runs if r[0] <= min(last_a, last_b)]
    share_a = sum(1 for r in both if r[1] == "A") / max(1, len(both))
    first, indexes = runs[0][0], []
    end = min(last_a, last_b)
    t = first
    while t + 10.0 <= end:
        window = [r for r in runs if t <= r[0] < t + 10.0]
        a = sum(1 for r in window if r[1] == "A") / 3
        indexes.append(jain([a, sum(1 for r in window if r[1] == "B") / 1]))
        t += 1.0
    return [
        "fair" if fair else "FIFO", f"{len(runs)}/600", f"{share_a:.1%}",
        f"{min(indexes):.3f}" if indexes else "-", f"{end - first:.1f} s",
    ]  # fmt: skip


def many(server: EmbeddedRedis, fair: bool, args: argparse.Namespace) -> list[Any]:
    tenants, each, big, rate = args.tenants, 5, 2000, 100

    def publish(broker: str, queue: str) -> None:
        small = [c for i in range(tenants) for c in calls(f"t{i}", each)]
        send(broker, "fairness_app.report", queue, calls("big", big) + small)

    total = big + tenants * each
    runs = run(server, fair, f"{rate}/s", {}, total, publish, total / rate + 90)
    small = [r for r in runs if r[1] != "big"]
    waits = sorted(r[0] - r[3] for r in small)
    bound = [(r[0] - r[3]) / ((r[2] + 1) * (tenants + 1) / rate) for r in small]
    big_done = max((r[0] - r[3] for r in runs if r[1] == "big"), default=0.0)

    def pct(values: list[float], q: float) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))] if values else 0.0

    interval = each * (tenants + 1) / rate  # a small tenant's 5 calls at its fair share
    return [
        "fair" if fair else "FIFO", f"{len(runs)}/{total}", f"{pct(waits, 0.5):.1f} s",
        f"{pct(waits, 0.99):.1f} s", f"{pct(waits, 0.99) / interval:.2f}",
        f"{pct(bound, 0.99):.2f}", f"{big_done:.1f} s",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", choices=["flood", "weights", "many"])
    parser.add_argument("--flood", type=int, default=600)
    parser.add_argument("--tenants", type=int, default=1000)
    args = parser.parse_args()
    heads = {
        "flood": ["order", "done", "B's first", "B's last", "A's last / ideal", "most in 1 s"],
        "weights": ["order", "done", "A's share (ideal 75%)", "Jain, worst 10 s", "both waiting"],
        "many": [
            "order",
            "done",
            "small p50",
            "small p99",
            "p99 / fair interval",
            "p99 of wait / own bound",
            "big's last",
        ],
    }
    scenarios = {"flood": flood, "weights": weights, "many": many}
    with EmbeddedRedis() as server:
        for name, scenario in scenarios.items():
            if args.only and args.only != name:
                continue
            rows = []
            for fair in (False, True):
                rows.append(scenario(server, fair, args))
                print(f"{name}: {rows[-1]}", flush=True)
            print(f"\n{name}:\n{table(heads[name], rows)}\n", flush=True)


if __name__ == "__main__":
    main()
