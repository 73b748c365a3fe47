"""``governor plan RULES --jobs N``: when will a batch finish? Offline: never touches Redis.

::

    $ governor plan "1/s, 20/m, 200/h, 800/d" --jobs 10000
    $ governor plan "5/s, 1000/h" --jobs 20000 --now --json | jq .last_at_iso
    $ governor plan "10/s" --jobs 50 --start 2025-06-01T09:00 --schedule
    $ governor plan "1/s, 20/m, 200/h, 800/d" --jobs 10000 --chart plan.svg

Each job starts as early as every rule allows (the sliding log's exact schedule, as
``Limiter.reserve`` books it when all jobs are queued at once); see :mod:`governor.plan`.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..plan import Plan
from .common import CliError, FloatParam, echo_json, format_duration, format_time
from .views import console

__all__ = ["plan_command", "runs"]

MAX_ROWS = 24


class When(FloatParam):
    """An ISO 8601 time (naive = local time) or Unix seconds."""

    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        text = str(value).strip()
        try:
            return float(text)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            self.fail(
                f"{text!r} is not a time: write ISO 8601 such as 2025-06-01T09:00 (local time) "
                "or 2025-06-01T09:00+02:00, or Unix seconds",
                param,
                ctx,
            )


def wall_clock(unix: float, ms: bool = False) -> str:
    """Local wall-clock time: ``2025-06-01 09:00:00`` (``.250`` more with ``ms``)."""
    text = datetime.fromtimestamp(unix).isoformat(sep=" ", timespec="milliseconds")
    return text if ms else text[:-4]


def runs(counts: list[tuple[int, int]], first: int, last: int) -> list[tuple[int, int, int]]:
    """Periods ``first..last`` merged into runs of equal counts: (from, to_exclusive, count).

    >>> runs([(0, 200), (1, 200), (5, 3)], 0, 6)
    [(0, 2, 200), (2, 5, 0), (5, 6, 3), (6, 7, 0)]
    """
    by = dict(counts)
    out: list[tuple[int, int, int]] = []
    for i in range(first, last + 1):
        n = by.get(i, 0)
        if out and out[-1][2] == n and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1, n)
        else:
            out.append((i, i + 1, n))
    return out


def _table(unit: str, size: int, rows: list[tuple[int, int, int]], absolute: float | None) -> Table:
    table = Table(box=None, pad_edge=False)
    table.add_column("from", justify="right")
    table.add_column("to", justify="right")
    table.add_column(f"jobs each {unit}", justify="right")
    table.add_column("jobs so far", justify="right")
    total = 0
    for a, b, n in rows[:MAX_ROWS]:
        total += n * (b - a)
        if absolute is None:
            start, end = f"+{a}{unit[0]}", f"+{b}{unit[0]}"
        else:
            start, end = wall_clock(absolute + a * size), wall_clock(absolute + b * size)
        table.add_row(start, end, str(n), str(total))
    if len(rows) > MAX_ROWS:
        table.caption = f"... {len(rows) - MAX_ROWS} more rows (--json has them all)"
        table.caption_justify = "left"
    return table


def _json(p: Plan, absolute: bool, schedule: bool) -> dict[str, Any]:
    data: dict[str, Any] = {
        "rules": [r.text for r in p.rules],
        "algorithm": "sliding_log",
        "jobs": p.jobs,
        "cost": p.cost,
        "start": p.start if absolute else None,
        "start_iso": format_time(p.start) if absolute else None,
        "first_after": p.first,
        "last_after": p.last,
        "last_after_text": format_duration(p.last),
        "last_at": p.start + p.last if absolute else None,
        "last_at_iso": format_time(p.start + p.last) if absolute else None,
        "tightest_rule": p.tightest.text,
        "jobs_per_day_long_run": p.per_day,
        "per_hour": [{"hour": h, "jobs": n} for h, n in p.counts(3600)],
        "per_day": [{"day": d, "jobs": n} for d, n in p.counts(86400)],
    }
    if schedule:
        data["starts_after"] = [t - p.start for t in p.starts]
    return data


def _chart_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    if value is None:
        return None
    if value.suffix.lower() != ".svg":
        raise click.BadParameter(
            f"{str(value)!r}: only .svg charts are supported (e.g. --chart plan.svg)", ctx, param
        )
    folder = value.parent
    if not folder.is_dir():
        raise click.BadParameter(f"{str(value)!r}: no folder {str(folder)!r}", ctx, param)
    return value


def _write_chart(path: Path, p: Plan, origin: float | None) -> None:
    from .plan_chart import write  # only when asked for

    try:
        write(path, p, origin)
    except OSError as exc:
        raise CliError(f"cannot write the chart to {str(path)!r}: {exc.strerror or exc}") from None
    click.echo(f"chart written to {path}", err=True)


@click.command("plan")
@click.argument("rules")
@click.option("--jobs", type=click.IntRange(min=1), help="How many jobs (or give --tenants).")
@click.option(
    "--tenants",
    metavar="NAME=JOBS[xW],...",
    help="Tenants sharing the limit fairly (fair_by), e.g. A=600,B=20x2: each one's finish.",
)
@click.option(
    "--cost", type=click.IntRange(min=1), default=1, show_default=True, help="Units each job costs."
)
@click.option("--start", "start", type=When(), help="When the batch is queued (ISO 8601).")
@click.option("--now", is_flag=True, help="The batch is queued now (print clock times).")
@click.option("--schedule", is_flag=True, help="Also list every job's start.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--chart",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=_chart_path,
    help="Also draw jobs per minute/hour/day and each rule's ceiling into this .svg file.",
)
def plan_command(
    rules: str,
    jobs: int | None,
    tenants: str | None,
    cost: int,
    start: float | None,
    now: bool,
    schedule: bool,
    as_json: bool,
    chart: Path | None,
) -> None:
    """When a batch can run under RULES (offline, no Redis).

    RULES as configured, e.g. "1/s, 20/m, 200/h, 800/d".

    Assumes the jobs are queued at once on an empty limit and start as early as every rule
    allows. Times are offsets from the start unless --start or --now gives a clock time.
    """
    if start is not None and now:
        raise click.UsageError("give --start or --now, not both")
    shares = _tenants(tenants) if tenants else None
    if shares is not None:
        total = sum(n for _, n, _ in shares)
        if jobs is not None and jobs != total:
            raise click.UsageError(f"--jobs {jobs} but the tenants' jobs add up to {total}")
        jobs = total
    if jobs is None:
        raise click.UsageError("give --jobs N (or --tenants)")
    absolute = start is not None or now
    # "now" on the millisecond grid the limiter stamps on, so offsets come out round
    begin = math.ceil(time.time() * 1000) / 1000 if now else (start or 0.0)
    p = Plan.build(rules, jobs, start=begin, cost=cost)
    if chart is not None:
        _write_chart(chart, p, p.start if absolute else None)
    fair = p.tenants(shares) if shares is not None else None
    if as_json:
        data = _json(p, absolute, schedule)
        if fair is not None:
            data["tenants"] = [
                {"name": t.name, "jobs": t.jobs, "weight": t.weight, "first": t.first,
                 "last": t.last, "last_fifo": fifo}
                for t, fifo in zip(fair, _fifo_lasts(p, shares or []))
            ]  # fmt: skip
        echo_json(data)
        return
    out = console()
    each = "" if cost == 1 else f", {cost} units each"
    out.print(
        f"{jobs} jobs under {', '.join(r.text for r in p.rules)} "
        f"(sliding log{each}), planned without Redis.\n"
    )
    if absolute:
        out.print(f"first job  starts at {format_time(p.start + p.first)} (local time below)")
        out.print(
            f"last job   can start at {format_time(p.start + p.last)}, "
            f"after {format_duration(p.last)}"
        )
    else:
        out.print(f"first job  starts at +{format_duration(p.first)}")
        days = f" ({p.last / 86400:.2f} days)" if p.last >= 86400 else ""
        out.print(f"last job   can start after {format_duration(p.last)}{days}")
    quota = jobs / p.per_day
    took = f"{quota:.3g} days" if quota >= 1 else format_duration(quota * 86400)
    out.print(
        f"long run   at most {p.per_day:g} jobs a day (rule {p.tightest.text}): "
        f"{jobs} jobs = {took} of quota"
    )
    if fair is not None:
        out.print()
        out.print(_tenant_table(fair, _fifo_lasts(p, shares or [])))
    origin = p.start if absolute else None
    # the periods worth a table: minutes for a batch within the hour, else hours and days
    periods: list[tuple[str, int, int | None]] = (
        [("minute", 60, 59)] if p.last < 3600 else [("hour", 3600, 23)]
    )
    if p.last >= 86400:
        periods.append(("day", 86400, None))
    for unit, size, cap in periods:
        counts = p.counts(size)
        last = counts[-1][0] if cap is None else min(cap, counts[-1][0])
        first = {"minute": " (first hour)", "hour": " (first day)"}.get(unit, "")
        out.print(f"\njobs per {unit}{first}")
        out.print(_table(unit, size, runs(counts, 0, last), origin))
    if schedule:
        out.print()
        for i, t in enumerate(p.starts, 1):
            when = wall_clock(t, ms=True) if absolute else f"+{format_duration(t - p.start)}"
            out.print(f"job {i}: {when}")


def _tenants(text: str) -> list[tuple[str, int, float]]:
    """``A=600,B=20x2`` -> [("A", 600, 1.0), ("B", 20, 2.0)]."""
    out = []
    for item in text.split(","):
        name, eq, rest = item.strip().partition("=")
        jobs_text, _, weight_text = rest.partition("x")
        try:
            jobs, weight = int(jobs_text), float(weight_text or 1)
        except ValueError:
            jobs, weight = 0, 0.0
        if not eq or not name or jobs < 1 or not 0.001 <= weight <= 1000:
            raise click.BadParameter(
                f"{item.strip()!r}: write NAME=JOBS or NAME=JOBSxWEIGHT (weight 0.001 to 1000)",
                param_hint="--tenants",
            )
        out.append((name.strip(), jobs, weight))
    return out


def _fifo_lasts(p: Plan, shares: list[tuple[str, int, float]]) -> list[float]:
    """Each tenant's last start first come, first served, in the order given."""
    out, done = [], 0
    for _, n, _ in shares:
        done += n
        out.append(p.starts_us[done - 1] / 1e6 - p.start)
    return out


def _tenant_table(fair: list[Any], fifo: list[float]) -> Table:
    table = Table(title="tenants sharing it fairly (queued at once)", title_justify="left")
    for column in ("tenant", "jobs", "weight", "first", "last (fair)", "last (FIFO, in order)"):
        table.add_column(column, justify="left" if column == "tenant" else "right")
    for t, last_fifo in zip(fair, fifo):
        table.add_row(
            t.name, str(t.jobs), f"{t.weight:g}", f"+{format_duration(t.first)}",
            f"+{format_duration(t.last)}", f"+{format_duration(last_fifo)}",
        )  # fmt: skip
    return table
