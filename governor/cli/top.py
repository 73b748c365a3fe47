"""``governor top``: a live view of every configured limit, refreshed every ``--interval``.

::

    $ governor -A proj top                   # Ctrl-C to quit
    $ governor -A proj top --once            # one frame, e.g. for a cron mail or a test
    $ governor -A proj top --frames 3 --interval 0.5 | less
    $ governor -A proj top --json --frames 10  # JSON Lines: status --json plus rates, per frame

Per limit and subject: used/limit of every rule and a rate. The rate is what Redis can tell
honestly: the change per second, between two samples, of the units the longest rule counts
(admissions and bookings, minus what left its window). Denials are not stored in Redis, so
they are not shown here: the workers count them (``governor_deferred_total`` in
:mod:`governor.celery.metrics`, the ``task_deferred`` signal, the logs).
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich import box
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .common import State, format_duration, mask_url, pass_state
from .limits import LimitState, SubjectState, all_limits
from .views import bar, console, limit_json, state_text

__all__ = ["Rates", "top"]


class Rates:
    """Rates from successive samples of the units counted by each subject's longest rule.

    >>> rates = Rates()
    >>> rates.update("queue:emails", "emails", now=100.0, used=10) is None   # first sample
    True
    >>> rates.update("queue:emails", "emails", now=102.0, used=16)
    3.0
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def update(self, label: str, subject: str, now: float, used: int) -> float | None:
        key = (label, subject)
        previous = self._last.get(key)
        self._last[key] = (now, used)
        if previous is None or now <= previous[0]:
            return None
        return (used - previous[1]) / (now - previous[0])

    def of(self, label: str, s: SubjectState) -> float | None:
        if not s.usage.rules:
            return None
        longest = max(s.usage.rules, key=lambda r: r.rule.period_us)
        return self.update(label, s.subject, s.usage.now, longest.used)


def frame(state: State, limits: list[LimitState], rates: Rates, interval: float) -> Group:
    """One screen: a row per limit (per-key limits: per subject) and rule."""
    clock = time.strftime("%H:%M:%S")
    head = Text.assemble(
        ("governor top", "bold"), f"  {mask_url(state.redis_url)}  prefix {state.prefix!r}  {clock}"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("limit", "rule", "usage", "used", "rate/s", "state"):
        right = name in ("used", "rate/s")
        table.add_column(name, justify="right" if right else "left", no_wrap=name != "state")
    if not limits:
        table.add_row("(no limits)", "", "", "", "", "")
    for ls in limits:
        entry = ls.entry
        fixed = entry.kind in ("queue", "task")
        if not fixed:
            rules_text = entry.config.text if entry.config else "rules unknown"
            table.add_row(Text(entry.label, "bold"), "", Text(rules_text, "dim"))
        if not ls.subjects:
            first = Text(entry.label, "bold") if fixed else Text("  -")
            table.add_row(first, "", Text("nothing counted", "dim"))
        for s in ls.subjects:
            rate = rates.of(entry.label, s)
            label = Text(entry.label, "bold") if fixed else Text(f"  {s.subject}")
            rate_text = "-" if rate is None else f"{rate:.2f}"
            rows = [
                (r.rule.text, bar(r.used, r.limit, 10), f"{r.used}/{r.limit}")
                for r in s.usage.rules
            ]
            if s.cap is not None:
                cap = s.cap
                rows.append(("at once", bar(cap.held, cap.limit, 10), f"{cap.held}/{cap.limit}"))
            if not rows:
                table.add_row(label, "", "", "", "", state_text(s))
            for i, row in enumerate(rows):
                table.add_row(
                    label if i == 0 else "",
                    *row,
                    rate_text if i == 0 else "",
                    state_text(s) if i == 0 else "",
                )
        if ls.total > len(ls.subjects):
            table.add_row(Text(f"  ... {ls.total - len(ls.subjects)} more", "dim"))
    note = Text(
        f"every {format_duration(interval)}; rate/s: change per second of the units counted "
        "by the longest rule (admissions + bookings - expiries). Denials are not kept in Redis: "
        "see governor_deferred_total in the workers' metrics.",
        style="dim",
    )
    return Group(head, table, note)


def frame_json(limits: list[LimitState], rates: Rates) -> dict[str, Any]:
    """One frame for scripts: each limit as ``status --json`` gives it, each subject with its
    rate (None on the first frame)."""
    out = []
    for ls in limits:
        item = limit_json(ls)
        for subject, s in zip(item["subjects"], ls.subjects):
            rate = rates.of(ls.entry.label, s)
            subject["rate"] = None if rate is None else round(rate, 3)
        out.append(item)
    return {"time": time.time(), "limits": out}


@click.command()
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option("--once", is_flag=True, help="Print one frame and exit (no rates yet).")
@click.option("--frames", type=click.IntRange(min=1), help="Exit after this many frames.")
@click.option(
    "--subjects",
    "max_subjects",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Subjects shown per per-key limit (the fullest).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object per frame.")
@pass_state
def top(
    state: State, interval: float, once: bool, frames: int | None, max_subjects: int, as_json: bool
) -> None:
    """Live usage per configured limit (Ctrl-C to quit)."""
    total = 1 if once else frames
    rates = Rates()
    if as_json:  # JSON Lines, one object per frame
        count = 0
        while total is None or count < total:
            if count:
                time.sleep(interval)
            limits, _ = all_limits(state, max_subjects)
            click.echo(json.dumps(frame_json(limits, rates)), nl=True)
            count += 1
        return
    out = console()

    def render() -> Group:
        limits, _ = all_limits(state, max_subjects)
        return frame(state, limits, rates, interval)

    if not out.is_terminal or total is not None:
        count = 0
        while total is None or count < total:
            if count:
                time.sleep(interval)
            out.print(render())
            count += 1
        return
    try:  # pragma: no cover - needs a terminal
        with Live(render(), console=out, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(), refresh=True)
    except KeyboardInterrupt:  # pragma: no cover
        pass
