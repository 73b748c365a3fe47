"""cProfile for a real Celery worker: its main process and each pool process.

``python -m bench.celery_overhead --profile DIR`` has every bench worker call
:func:`profile_worker`; each process writes ``<worker>-main.pstats`` or
``<worker>-pool-<pid>.pstats`` into DIR (and ``.gc.json``: the garbage collector's counts and
CPU seconds). The main process is profiled from ``worker_ready`` to
``worker_shutdown``, a pool process from ``worker_process_init`` to its exit (and every
:data:`EVERY` tasks meanwhile, in case its exit is abrupt). Times are CPU time; call counts
are exact; times carry cProfile's own overhead (compare governed with ungoverned, both profiled).

    python -m bench.profiling DIR --tasks N [--top 40] [--match governor]
    python -m bench.profiling DIR --tasks N --diff calls     # or --diff time

prints, per variant, functions by their own time per task, with calls per task; with --diff,
governed against ungoverned by function (N: tasks per variant over all rounds).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import re
import sys
import time
from collections import defaultdict
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
EVERY = 1000
"""A pool process also writes its stats after this many tasks."""


def new_profile() -> cProfile.Profile:
    """A profile of CPU time (``time.process_time``): waiting for Redis or the broker, and
    time the machine gave to other processes, are not counted."""
    return cProfile.Profile(time.process_time)


def profile_worker(directory: str) -> None:
    """Install the profiling signal receivers (call in the worker's app module)."""
    from celery import signals

    state: dict[str, Any] = {"prof": None, "name": "worker", "tasks": 0}

    def path(kind: str) -> str:
        return os.path.join(directory, f"{state['name']}-{kind}.pstats")

    @signals.worker_init.connect(weak=False)  # type: ignore[untyped-decorator]
    def _named(sender: Any = None, **_: Any) -> None:
        state["name"] = str(getattr(sender, "hostname", "worker")).split("@")[0]

    @signals.worker_ready.connect(weak=False)  # type: ignore[untyped-decorator]
    def _main_start(**_: Any) -> None:
        state["prof"] = new_profile()
        state["prof"].enable()

    gc_time = [0.0, 0.0]  # seconds in collections, start of the current one

    def _gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_time[1] = time.process_time()
        else:
            gc_time[0] += time.process_time() - gc_time[1]

    gc.callbacks.append(_gc)

    def _gc_dump(kind: str) -> None:
        with open(path(kind).replace(".pstats", ".gc.json"), "w") as f:
            json.dump({"seconds": gc_time[0], "stats": gc.get_stats()}, f)

    @signals.worker_shutdown.connect(weak=False)  # type: ignore[untyped-decorator]
    def _main_stop(**_: Any) -> None:
        if state["prof"] is not None:
            state["prof"].disable()
            state["prof"].dump_stats(path("main"))
            _gc_dump("main")

    @signals.worker_process_init.connect(weak=False)  # type: ignore[untyped-decorator]
    def _pool_start(**_: Any) -> None:
        sys.setprofile(None)  # a forked child inherits the parent's profiler: not ours
        state["prof"] = new_profile()
        state["tasks"] = 0
        state["prof"].enable()

    def _pool_dump() -> None:
        prof = state["prof"]
        if prof is not None:
            prof.disable()
            prof.dump_stats(path(f"pool-{os.getpid()}"))
            _gc_dump(f"pool-{os.getpid()}")
            prof.enable()

    @signals.worker_process_shutdown.connect(weak=False)  # type: ignore[untyped-decorator]
    def _pool_stop(**_: Any) -> None:
        _pool_dump()
        state["prof"] = None

    def tick() -> None:
        state["tasks"] += 1
        if state["tasks"] % EVERY == 0:
            _pool_dump()

    _ticks.append(tick)


_ticks: list[Any] = []


def tick() -> None:
    """A task ended (called by the bench's task: a signal receiver would change what Celery
    runs for each task)."""
    for fn in _ticks:
        fn()


def _label(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename.startswith(ROOT):
        filename = filename[len(ROOT) :]
    for marker in ("site-packages/", "lib/python3"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{line}({name})" if line else name


def load(directory: str) -> dict[str, pstats.Stats]:
    """Stats merged by variant and process kind: {"governed main": Stats, ...}."""
    groups: dict[str, list[str]] = defaultdict(list)
    for entry in sorted(os.listdir(directory)):
        m = re.match(r"govbench-(\w+?)-\d+-(main|pool)", entry)
        if m and entry.endswith(".pstats"):
            groups[f"{m.group(1)} {m.group(2)}"].append(os.path.join(directory, entry))
    return {k: pstats.Stats(*v) for k, v in sorted(groups.items())}


def _own(stats: pstats.Stats) -> dict[str, tuple[float, int]]:
    raw: Any = stats.stats  # type: ignore[attr-defined]
    out: dict[str, tuple[float, int]] = {}
    for func, (_cc, nc, tt, _ct, _callers) in raw.items():
        t, n = out.get(_label(func), (0.0, 0))
        out[_label(func)] = (t + tt, n + nc)
    return out


def difference(directory: str, tasks: int, top: int, by: str = "time") -> str:
    """Per process kind: total CPU per task, governed against ungoverned, and the functions
    whose own time (or calls) differ most."""
    groups = load(directory)
    out = []
    for kind in ("main", "pool"):
        gov, base = groups.get(f"governed {kind}"), groups.get(f"ungoverned {kind}")
        if gov is None or base is None:
            continue
        g, b = _own(gov), _own(base)
        gt, bt = sum(t for t, _ in g.values()), sum(t for t, _ in b.values())
        out.append(
            f"\n{kind}: {1e6 * gt / tasks:.1f} us CPU per task governed, "
            f"{1e6 * bt / tasks:.1f} ungoverned ({1e6 * (gt - bt) / tasks:+.1f}; cProfile's "
            "CPU time, inflated by its own overhead)\n  own us/task: governed, ungoverned, "
            "difference; calls/task: governed, ungoverned"
        )
        rows = []
        for label in g.keys() | b.keys():
            (tg, ng), (tb, nb) = g.get(label, (0.0, 0)), b.get(label, (0.0, 0))
            rows.append((tg - tb, label, tg, tb, ng, nb))
        if by == "calls":  # exact, where times are noisy: the work added, call by call
            rows.sort(key=lambda r: -abs(r[4] - r[5]))
        else:
            rows.sort(key=lambda r: -abs(r[0]))
        for diff, label, tg, tb, ng, nb in rows[:top]:
            out.append(
                f"  {1e6 * tg / tasks:8.2f} {1e6 * tb / tasks:8.2f} {1e6 * diff / tasks:+8.2f}"
                f"   {ng / tasks:7.3f} {nb / tasks:7.3f}  {label}"
            )
    return "\n".join(out)


def report(directory: str, tasks: int, top: int, match: str | None) -> str:
    out = []
    for group, stats in load(directory).items():
        raw: Any = stats.stats  # type: ignore[attr-defined]
        rows = []
        for func, (_cc, nc, tt, ct, _callers) in raw.items():
            label = _label(func)
            if match and not re.search(match, label):
                continue
            rows.append((tt, ct, nc, label))
        rows.sort(reverse=True)
        out.append(f"\n{group}: own / cumulative us per task, calls per task ({tasks} tasks)")
        for tt, ct, nc, label in rows[:top]:
            out.append(
                f"  {1e6 * tt / tasks:8.2f} {1e6 * ct / tasks:9.2f} {nc / tasks:8.3f}  {label}"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--tasks", type=int, required=True, help="tasks per variant, all rounds")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--match", help="only functions whose label matches this regex")
    parser.add_argument(
        "--diff",
        choices=["time", "calls"],
        help="governed against ungoverned, by function: the largest differences of own time, "
        "or of calls (exact: the work added, where times are noisy)",
    )
    args = parser.parse_args(argv)
    if args.diff:
        print(difference(args.directory, args.tasks, args.top, args.diff))
    else:
        print(report(args.directory, args.tasks, args.top, args.match))
    return 0


if __name__ == "__main__":
    sys.exit(main())
