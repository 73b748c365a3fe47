"""What ``governor demo`` shows: what the rules allow, what happened (the records the demo
tasks leave), the live view and the summary (see :mod:`governor.cli.demo.command`)."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...plan import Plan, most_in_window
from ...rules import Rule
from .processes import CONCURRENCY, NODES

if TYPE_CHECKING:
    from rich.console import RenderableType

    from .processes import Cluster

__all__ = [
    "DemoRecord",
    "Summary",
    "default_tasks",
    "live_frame",
    "most_in_window",
    "per_second_limit",
    "starts_within",
    "summary_renderable",
]

MAX_DEFAULT_TASKS = 1000

# -- arithmetic: what the rules allow, what happened ----------------------------------------


def per_second_limit(rules: Sequence[Rule]) -> int:
    """The most starts the rules allow in any one second (the live view's limit line).

    >>> per_second_limit(parse_rules("20/s, 300/m")), per_second_limit(parse_rules("5/500ms"))
    (20, 10)
    """
    bound = min(r.limit * max(1, math.ceil(1.0 / r.period)) for r in rules)
    return sum(1 for t in Plan.build(tuple(rules), jobs=bound + 1).starts if t < 1.0)


def starts_within(rules: Sequence[Rule], seconds: float, jobs: int) -> int:
    """How many of ``jobs`` tasks, all queued at once, the rules let start within ``seconds``.

    >>> starts_within(parse_rules("20/s, 300/m"), 30.0, jobs=400)
    300
    """
    return sum(1 for t in Plan.build(tuple(rules), jobs=jobs).starts if t <= seconds)


def default_tasks(rules: Sequence[Rule], duration: float) -> int:
    """The default ``--tasks``: 80 % of what the rules let start within two thirds of
    ``duration``, at least 1 and at most ``MAX_DEFAULT_TASKS``.

    The margins leave time for the workers' latency, and room in the rules' longer windows: a
    task that misses its booked slot (a busy machine) starts later on a new one, and the slot
    it missed stays counted, so a flood sized to a whole window's budget could spill into the
    next window, beyond ``duration``.

    >>> default_tasks(parse_rules("20/s, 300/m"), 30.0), default_tasks(parse_rules("1/m"), 30.0)
    (240, 1)
    """
    allowed = starts_within(rules, duration * 2 / 3, jobs=2 * MAX_DEFAULT_TASKS)
    return max(1, min(MAX_DEFAULT_TASKS, int(allowed * 0.8)))


@dataclass(frozen=True)
class DemoRecord:
    """One task start, as :mod:`governor.cli.demo.app` records it."""

    n: int
    t: float
    """When its body started (the worker's clock)."""
    waits: int
    node: str
    counted: float | None = None
    """When the rules counted its admission (Redis's clock), None if no rule did."""
    pid: int | None = None

    @property
    def at(self) -> float:
        """When the rules counted it; a start no rule counted (none should), when it started."""
        return self.t if self.counted is None else self.counted

    @classmethod
    def parse(cls, raw: bytes | str) -> DemoRecord:
        data = json.loads(raw)
        counted, pid = data.get("counted"), data.get("pid")
        return cls(
            int(data["n"]),
            float(data["t"]),
            int(data.get("waits") or 0),
            str(data["node"]),
            None if counted is None else float(counted),
            None if pid is None else int(pid),
        )


@dataclass
class Summary:
    """What a demo run did, against what its rules allow."""

    rules: tuple[Rule, ...]
    tasks: int
    records: list[DemoRecord]
    elapsed: float
    duration: float
    interrupted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    """Why the run failed (a worker exited, Redis went away), or None."""

    @property
    def started(self) -> list[float]:
        """When the task bodies started (sorted)."""
        return sorted(r.t for r in self.records)

    @property
    def counted(self) -> list[float]:
        """When the rules counted the admissions of the tasks that started (sorted)."""
        return sorted(r.at for r in self.records)

    @property
    def done(self) -> int:
        """Distinct tasks that started (a redelivered duplicate counts once)."""
        return len({r.n for r in self.records})

    @property
    def missing(self) -> list[int]:
        seen = {r.n for r in self.records}
        return [n for n in range(self.tasks) if n not in seen]

    @property
    def all_done(self) -> bool:
        return self.done >= self.tasks

    def windows(self) -> list[dict[str, Any]]:
        """Per rule: the most admissions counted in any window of its period (checked against
        its limit), and the most body starts (shown: each starts a varying moment later)."""
        counted, started = self.counted, self.started
        out = []
        for rule in self.rules:
            most = most_in_window(counted, rule.period)
            out.append(
                {
                    "rule": rule.text,
                    "limit": rule.limit,
                    "period": rule.period,
                    "max_counted": most,
                    "max_starts": most_in_window(started, rule.period),
                    "ok": most <= rule.limit,
                }
            )
        return out

    @property
    def limits_held(self) -> bool:
        return all(w["ok"] for w in self.windows())

    @property
    def ok(self) -> bool:
        return self.all_done and self.limits_held and not self.interrupted and not self.error

    def waits(self) -> dict[str, Any]:
        """Governance waits per task: how often governor re-published a call to a later slot."""
        per_task: dict[int, int] = {}
        for r in self.records:
            per_task[r.n] = max(per_task.get(r.n, 0), r.waits)
        counts = Counter(per_task.values())
        total = sum(per_task.values())
        return {
            "mean": round(total / len(per_task), 3) if per_task else 0.0,
            "max": max(per_task.values(), default=0),
            "histogram": {str(k): counts[k] for k in sorted(counts)},
        }

    def pace(self) -> dict[str, Any]:
        """The rate achieved from the first admission counted to the last (the bodies'
        ``starts_span`` too), and the best the rules allow for as many tasks (the sliding log's
        exact schedule, see :mod:`governor.plan`)."""
        times, started = self.counted, self.started
        done = self.done
        span = times[-1] - times[0] if len(times) > 1 else 0.0
        best = Plan.build(self.rules, jobs=done).last if done else 0.0
        return {
            "span": round(span, 3),
            "allowed_span": round(best, 3),
            "achieved_rate": round((done - 1) / span, 3) if span > 0 else None,
            "allowed_rate": round((done - 1) / best, 3) if best > 0 else None,
            "starts_span": round(started[-1] - started[0], 3) if started else 0.0,
        }

    def nodes(self) -> dict[str, int]:
        return dict(sorted(Counter(r.node for r in self.records).items()))

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "all_done": self.all_done,
            "interrupted": self.interrupted,
            "rules": ", ".join(r.text for r in self.rules),
            "tasks": self.tasks,
            "done": self.done,
            "missing": len(self.missing),
            "elapsed": round(self.elapsed, 3),
            "duration": self.duration,
            "windows": self.windows(),
            "waits": self.waits(),
            "pace": self.pace(),
            "nodes": self.nodes(),
            **({"error": self.error} if self.error else {}),
            **self.extra,
        }


# -- the live view --------------------------------------------------------------------------

CHART_SECONDS = 12
CHART_WIDTH = 40


def live_frame(
    cluster: Cluster,
    rules: Sequence[Rule],
    tasks: int,
    records: list[DemoRecord],
    elapsed: float,
    duration: float,
    line: int,
) -> RenderableType:
    """One screen: starts per second against the limit line, each rule's current window,
    totals."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text.assemble(
        ("governor demo", "bold"),
        "  limit ",
        (", ".join(r.text for r in rules), "bold"),
        f"  {elapsed:.1f}s of {duration:g}s\n",
        (f"{NODES} worker nodes x {CONCURRENCY} processes, {cluster.redis_label}", "dim"),
    )
    times = sorted(r.at for r in records)  # the admissions, as the rules counted them
    chart = Table.grid(padding=(0, 1))
    chart.add_column(justify="right", style="dim")
    chart.add_column()
    chart.add_column(justify="right")
    if times:
        origin = times[0]
        per_second = Counter(int(t - origin) for t in times)
        last = max(per_second)
        scale = CHART_WIDTH * 3 // 4 / max(line, 1)
        for second in range(max(0, last - CHART_SECONDS + 1), last + 1):
            count = per_second.get(second, 0)
            cells = min(CHART_WIDTH, round(count * scale))
            mark = round(line * scale)
            if cells <= mark:
                bar = Text("█" * cells, "green")
                bar.append(" " * (mark - cells) + "│", "yellow")
            else:
                bar = Text("█" * mark, "green")
                bar.append("█" * (cells - mark), "bold red")
            chart.add_row(f"{second}s", bar, f"{count}")
    else:
        chart.add_row("", Text("waiting for the first start...", "dim"), "")
    legend = Text(f"admissions per second; │ = the most the rules allow in 1s ({line})", "dim")
    usage = Table.grid(padding=(0, 2))
    now = time.time()
    for rule in rules:
        in_window = sum(1 for t in times if t > now - rule.period)
        filled = min(20, round(20 * in_window / rule.limit))
        style = (
            "red" if in_window > rule.limit else "yellow" if in_window == rule.limit else "green"
        )
        usage.add_row(
            rule.text,
            Text.assemble(("█" * filled, style), ("░" * (20 - filled), "dim")),
            f"{in_window}/{rule.limit} in the last {_period(rule)}",
        )
    done = len({r.n for r in records})
    waited = sum(1 for r in records if r.waits)
    totals = Text.assemble(
        ("done ", "bold"),
        f"{done}/{tasks}   ",
        ("waiting ", "bold"),
        f"{tasks - done}   ",
        ("started after a wait ", "bold"),
        f"{waited}",
    )
    hint = Text("Ctrl-C stops the demo and everything it started", "dim")
    return Group(head, Text(), chart, legend, Text(), usage, Text(), totals, hint)


def _period(rule: Rule) -> str:
    text = rule.text.split("/", 1)[1]
    return text if text[0].isdigit() else f"1{text}"


# -- the summary ----------------------------------------------------------------------------


def summary_renderable(summary: Summary) -> RenderableType:
    """The summary as lines of text (short enough for 80 columns, no padding)."""
    from rich.console import Group
    from rich.text import Text

    data = summary.as_json()
    status = "interrupted, " if summary.interrupted else ""
    lines = [
        Text.assemble(
            ("governor demo: ", "bold"),
            f"{status}{summary.done} of {summary.tasks} tasks done in {summary.elapsed:.1f}s "
            f"({NODES} nodes x {CONCURRENCY} processes, limit {data['rules']})",
        )
    ]

    def row(label: str, *parts: str | tuple[str, str]) -> None:
        lines.append(Text.assemble(("  " + label.ljust(7), "bold"), *parts))

    for w, rule in zip(data["windows"], summary.rules):
        verdict = ("ok", "green") if w["ok"] else ("OVER THE LIMIT", "bold red")
        row(
            w["rule"],
            f"at most {w['max_counted']} admissions in any {_period(rule)}, limit {w['limit']}: ",
            verdict,
        )
    if data["windows"]:
        most = ", ".join(
            f"{w['max_starts']} in any {_period(rule)}"
            for w, rule in zip(data["windows"], summary.rules)
        )
        row("bodies", f"at most {most}")
        row("", "(not checked: the rules count admissions, on Redis's clock; a body starts")
        row("", "a moment after its admission, a moment longer on a busy machine)")
    waits = data["waits"]
    parts = []
    for k, count in waits["histogram"].items():
        parts.append(f"{count} {'started at once' if k == '0' else f'after {k} wait'}")
        if k not in ("0", "1"):
            parts[-1] += "s"
    row("waits", f"{waits['mean']:.2f} per task: {', '.join(parts) or 'none started'}")
    pace = data["pace"]
    if pace["achieved_rate"] is not None and pace["allowed_rate"] is not None:
        row(
            "pace",
            f"{pace['achieved_rate']:.2f}/s from the first admission to the last "
            f"({pace['span']:.2f}s);",
        )
        row("", f"the rules allow {pace['allowed_rate']:.2f}/s ({pace['allowed_span']:.2f}s)")
    else:
        row("pace", "all started at once, a burst the rules allow" if summary.done else "-")
    nodes = ", ".join(f"{node.split('@')[0]} {count}" for node, count in data["nodes"].items())
    row("nodes", nodes or "-")
    if summary.all_done:
        lines.append(Text("all tasks done", "bold green"))
    else:
        missing = summary.missing
        shown = ", ".join(str(n) for n in missing[:10]) + (" ..." if len(missing) > 10 else "")
        why = (
            "had not started when the demo was interrupted"
            if summary.interrupted
            else "had not started when the demo failed"
            if summary.error
            else f"did not start within {summary.duration:g}s (still waiting for their slots)"
        )
        lines.append(Text(f"{len(missing)} of {summary.tasks} tasks {why}: {shown}", "bold red"))
    return Group(*lines)
