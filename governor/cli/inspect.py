"""``governor inspect NAME SUBJECT``: one subject in detail.

::

    $ governor -A proj inspect proj.call_partner customer-42
    $ governor inspect partner-api customer-42 --rules "1/s, 20/m, 200/h, 800/d" --json
    $ governor -A proj inspect queue emails && echo "room for one more"

Exit status 0 when one more unit would be admitted now, 1 when the subject is blocked or a
rule is full, 2 when the limit is unknown (without an app, ``--rules`` is required).
"""

from __future__ import annotations

import click
from rich.table import Table

from .common import (
    EXIT_FAILED,
    CliError,
    State,
    echo_json,
    format_duration,
    format_time,
    pass_state,
)
from .limits import LimitEntry, resolve, subject_state
from .views import bar, console, limit_title, subject_json

__all__ = ["inspect_command", "target"]


def target(
    state: State, name: str, subject: str, rules: str | None, algorithm: str | None = None
) -> LimitEntry:
    """The limit to inspect; without rules (``--rules`` or an app), say how to give them."""
    entry = resolve(state, name, subject, rules, algorithm)
    if entry is None:
        raise CliError(
            f"inspect needs the rules of {name!r}: pass --rules '1/s, 20/m' (as configured), or "
            "-A proj (or run `celery -A proj governor inspect`) to read them from the Celery app"
        )
    return entry


@click.command("inspect")
@click.argument("name")
@click.argument("subject")
@click.option("--rules", help="The limiter's rules, e.g. '1/s, 20/m' (needed without an app).")
@click.option("--algorithm", help="Algorithm with --rules [the app's, else sliding_log].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@pass_state
def inspect_command(
    state: State,
    name: str,
    subject: str,
    rules: str | None,
    algorithm: str | None,
    as_json: bool,
) -> None:
    """One subject in detail: every rule, its block, its bookings.

    NAME is a limiter name: "queue" (SUBJECT = a queue), "task" (SUBJECT = a task name) or a
    per-key limit's governor_name / task name (SUBJECT = the key).

    Exit status: 0 if one more would be admitted now, 1 if blocked or full, 2 if the limit is
    unknown, 3 if Redis is unreachable.
    """
    entry = target(state, name, subject, rules, algorithm)
    s = subject_state(state, entry, subject)
    if as_json:
        echo_json({**entry.describe(), **subject_json(s)})  # "rules" in detail
    else:
        u = s.usage
        out = console()
        out.print(f"[bold]{subject}[/] in {limit_title(entry)}")
        table = Table(box=None)
        for col in ("rule", "usage", "used", "limit", "remaining", "next free in", "fully free in"):
            table.add_column(col, justify="left" if col in ("rule", "usage") else "right")
        for r in u.rules:
            table.add_row(
                r.rule.text,
                bar(r.used, r.limit),
                str(r.used),
                str(r.limit),
                str(r.remaining),
                format_duration(r.retry_after),
                format_duration(r.reset_after),
            )
        out.print(table)
        if u.blocked is not None:
            reason = u.blocked or "(no reason given)"
            until = format_time(u.now + u.blocked_for)
            out.print(
                f"[bold red]blocked[/] for {format_duration(u.blocked_for)} (until {until}): "
                f"{reason}"
            )
        else:
            out.print("block:    none")
        if u.booked_for > 0:
            until = format_time(u.now + u.booked_for)
            out.print(
                f"bookings: held up to {format_duration(u.booked_for)} ahead (the last starts "
                f"at {until})"
            )
        else:
            out.print(f"bookings: {u.booked} held")
        if s.cap is not None:
            cap = s.cap
            out.print(f"running:  {cap.held} of {cap.limit} at once; {cap.waiting} waiting")
            for h in cap.holders:
                state_ = "handed over, not started" if h.pending else "running"
                out.print(
                    f"  {h.holder}  {state_} since {format_time(h.since)}  "
                    f"lease ends in {format_duration(max(0.0, h.expires - cap.now))}  "
                    f"{h.info}"
                )
        verdict = "[green]yes[/]" if s.admits else "[red]no[/]"
        out.print(f"admits one more now: {verdict}")
    if not s.admits:
        raise click.exceptions.Exit(EXIT_FAILED)
