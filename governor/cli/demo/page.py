"""``governor demo --report run.html``: the run as one page to open instead of reading numbers.

A single self-contained file: inline CSS and SVG charts drawn here (no script, nothing fetched).
It shows the rules, tasks and verdict; admissions counted and body starts per second against
each rule's ceiling; starts per worker node; the governance waits per task; the pace against
the fastest schedule the rules allow (:mod:`governor.plan`); the processes and Redis used.
Every text from the run (rules, node names, errors) is escaped. Scales and ceilings come from
:mod:`.plan_chart`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from html import escape
from pathlib import Path

from ...plan import Plan
from ..svg import BAR, bucket_for, ceiling, number_text, tick_label
from .charts import bar_chart, steps_chart
from .processes import CONCURRENCY, NODES
from .report import Summary

__all__ = ["render", "write"]

STARTED, FAST = "#9ecae9", "#e45756"
NODE_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d")
CSS = """body{font:15px/1.45 sans-serif;max-width:60em;margin:1.5em auto;padding:0 1em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse}td,th{padding:.15em .9em .15em 0;text-align:left}
th{font-weight:600}.verdict{padding:.5em .8em;border-radius:4px;font-weight:600}
.ok{background:#e3f4e1;color:#1e6b1e}.bad{background:#fbe3e1;color:#9b1c1c}
.note{color:#666;font-size:.9em}svg{max-width:100%;height:auto}"""


def _per_bucket(times: Sequence[float], origin: float, size: int, n: int) -> list[float]:
    counts = Counter(int((t - origin) // size) for t in times)
    return [float(counts.get(i, 0)) for i in range(n)]


def _time_charts(summary: Summary) -> list[str]:
    """Admissions and starts per second (or longer buckets), and starts per node."""
    counted, started = summary.counted, summary.started
    if not counted:
        return ['<p class="note">No task started: nothing to draw.</p>']
    origin = min(counted[0], started[0])
    bucket = bucket_for(max(counted[-1], started[-1]) - origin)
    n = int((max(counted[-1], started[-1]) - origin) // bucket.size) + 1
    labels = [tick_label(i, bucket, None) for i in range(n)]
    ceilings = [
        (f"{r.text}: at most {number_text(c)}", float(c))
        for r in summary.rules
        for c in [ceiling(r, bucket.size)]
    ]
    rates = bar_chart(
        f"admissions counted and body starts per {bucket.name}",
        labels,
        [
            ("admissions counted", BAR, _per_bucket(counted, origin, bucket.size, n)),
            ("body starts", STARTED, _per_bucket(started, origin, bucket.size, n)),
        ],
        f"tasks per {bucket.name}",
        ceilings=ceilings,
        css="rates",
    )
    nodes = sorted({r.node for r in summary.records})
    per_node = [
        (
            node,
            NODE_COLOURS[k % len(NODE_COLOURS)],
            _per_bucket([r.t for r in summary.records if r.node == node], origin, bucket.size, n),
        )
        for k, node in enumerate(nodes)
    ]
    by_node = bar_chart(
        f"body starts per {bucket.name} on each worker node",
        labels,
        per_node,
        f"starts per {bucket.name}",
        stacked=True,
        ceilings=ceilings,
        css="nodes",
    )
    return [
        f"<h2>Admissions and starts per {escape(bucket.name)}</h2>",
        f'<p class="note">Bars from {escape(_clock(origin))} on. The rules count each admission'
        " on Redis's clock; they are what the verdict checks. Each task's body starts a moment"
        " later (this machine's clock), a moment that varies on a busy machine, so body starts"
        " may bunch up a little beyond a ceiling: shown, not checked. A dashed line is the most"
        f" a rule lets start in any {escape(bucket.name)}.</p>",
        rates,
        "<h2>Starts per worker node</h2>",
        by_node,
    ]


def _waits_chart(summary: Summary) -> list[str]:
    histogram = summary.waits()["histogram"]
    if not histogram:
        return []
    most = max(int(k) for k in histogram)
    counts = [float(histogram.get(str(k), 0)) for k in range(most + 1)]
    chart = bar_chart(
        "tasks by governance waits",
        [str(k) for k in range(most + 1)],
        [("tasks", BAR, counts)],
        "tasks",
        css="waits",
    )
    return [
        "<h2>Governance waits per task</h2>",
        '<p class="note">How many times governor sent each task to wait for a later slot'
        " before it ran (0: it started at once).</p>",
        chart,
    ]


def _pace_chart(summary: Summary) -> list[str]:
    """Tasks admitted over time, against the fastest schedule the rules allow."""
    counted = summary.counted
    if not counted:
        return []
    plan = Plan.build(summary.rules, jobs=len(counted)).starts
    achieved = [t - counted[0] for t in counted]
    series = [("achieved (admissions counted)", BAR, achieved), ("fastest allowed", FAST, plan)]
    return [steps_chart("tasks admitted over time", series, "tasks admitted", css="pace")]


def _table(rows: Sequence[Sequence[object]], head: Sequence[str] = ()) -> str:
    cells = [f"<tr>{''.join(f'<th>{escape(h)}</th>' for h in head)}</tr>"] if head else []
    for row in rows:
        first, *rest = (escape(str(c)) for c in row)
        tag = "td" if head else "th"
        cells.append(f"<tr><{tag}>{first}</{tag}>{''.join(f'<td>{c}</td>' for c in rest)}</tr>")
    return f"<table>{''.join(cells)}</table>"


def _rate(rate: float | None, span: float) -> str:
    return "all at once (a burst the rules allow)" if rate is None else f"{rate:.2f}/s over {span}s"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _verdict(summary: Summary) -> tuple[str, str]:
    if summary.error:
        return f"failed: {summary.error}", "bad"
    if summary.interrupted:
        return f"interrupted: {summary.done} of {summary.tasks} tasks had started", "bad"
    problems = []
    if not summary.limits_held:
        problems.append("OVER THE LIMIT: a window counted more admissions than its rule allows")
    if not summary.all_done:
        problems.append(
            f"{len(summary.missing)} of {summary.tasks} tasks did not start within "
            f"{summary.duration:g}s"
        )
    if problems:
        return "; ".join(problems), "bad"
    return "ok: every task ran, and no window counted more admissions than its rule allows", "ok"


def _processes(summary: Summary) -> str:
    procs = summary.extra.get("processes") or {}
    pools: dict[str, set[int]] = {}
    starts = Counter(r.node for r in summary.records)
    for r in summary.records:
        pools.setdefault(r.node, set()).update([r.pid] if r.pid is not None else [])
    rows: list[list[object]] = []
    names = list(procs.get("nodes") or [])
    for i, pid in enumerate(procs.get("workers") or []):
        name = names[i] if i < len(names) else f"worker {i + 1}"
        node = next((n for n in starts if n.split("@")[0] == name), name)
        pool = ", ".join(str(p) for p in sorted(pools.get(node, ()))) or "-"
        rows.append([node, pid, pool, starts.get(node, 0)])
    for node in sorted(set(starts) - {row[0] for row in rows}):
        rows.append([node, "-", ", ".join(str(p) for p in sorted(pools[node])), starts[node]])
    redis_pid = procs.get("redis")
    redis = summary.extra.get("redis") or "-"
    return "".join(
        [
            _table(rows, ["worker node", "pid", "pool processes seen", "starts"]),
            _table(
                [
                    ["Redis", f"{redis}" + (f" (pid {redis_pid})" if redis_pid else "")],
                    ["run", summary.extra.get("run", "-")],
                ]
            ),
        ]
    )


def render(summary: Summary, generated: float | None = None) -> str:
    """The report as HTML text (XHTML-like: every element closed, every text escaped)."""
    data = summary.as_json()
    verdict, css = _verdict(summary)
    pace = data["pace"]
    windows = [
        [w["rule"], w["limit"], w["max_counted"], w["max_starts"], "ok" if w["ok"] else "OVER"]
        for w in data["windows"]
    ]
    achieved = pace["achieved_rate"]
    allowed = pace["allowed_rate"]
    body = [
        f"<h1>governor demo: {escape(data['rules'])}</h1>",
        f'<p class="verdict {css}">{escape(verdict)}</p>',
        _table(
            [
                ["rules", data["rules"]],
                ["tasks", f"{summary.done} of {summary.tasks} started ({data['missing']} missing)"],
                ["time", f"{summary.elapsed:.1f}s of at most {summary.duration:g}s"],
                ["workers", f"{NODES} nodes x {CONCURRENCY} processes (prefork)"],
            ]
        ),
        "<h2>Windows</h2>",
        _table(windows, ["rule", "limit", "most admissions", "most body starts", "checked"]),
        '<p class="note">The most admissions the rules counted in any window of each rule (the'
        " verdict), and the most task bodies that started in one (shown only).</p>",
        *_time_charts(summary),
        *_waits_chart(summary),
        "<h2>Pace</h2>",
        _table(
            [
                ["achieved", _rate(achieved, pace["span"])],
                ["fastest allowed", _rate(allowed, pace["allowed_span"])],
            ]
        ),
        *_pace_chart(summary),
        "<h2>Processes and Redis</h2>",
        _processes(summary),
    ]
    if summary.missing:
        shown = ", ".join(str(n) for n in summary.missing[:50])
        more = " ..." if len(summary.missing) > 50 else ""
        body.append(f"<h2>Tasks that did not start</h2><p>{escape(shown)}{more}</p>")
    body.append(
        f'<p class="note">Written by governor demo at {escape(_clock(generated or time.time()))}.'
        "</p>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
        f"<title>governor demo: {escape(verdict)}</title><style>{CSS}</style></head>\n"
        "<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write(path: Path, summary: Summary) -> None:
    """Write :func:`render`'s page to ``path`` (``OSError`` if it cannot be written)."""
    path.write_text(render(summary), encoding="utf-8")
