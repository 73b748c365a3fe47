"""Rendering shared by status, inspect and top: usage bars, per-limit tables, JSON shapes.

>>> console().print(bar(6, 10))      # 7 of 12 cells: green; yellow from 80 %; red when full
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..decision import CapUsage, Usage
from .common import format_duration, json_number
from .limits import LimitEntry, LimitState, SubjectState

__all__ = [
    "bar",
    "cap_json",
    "console",
    "limit_json",
    "limit_table",
    "limit_title",
    "state_text",
    "subject_json",
]

BAR_WIDTH = 12
MONEY = "usd_micro"
"""A meter whose name ends so counts micro-dollars: shown as dollars (budgets in money)."""


def is_money(meter: str | None) -> bool:
    return meter is not None and meter.endswith(MONEY)


def dollars(micro: int) -> str:
    return f"${micro / 1e6:,.2f}"


def used_text(used: int, limit: int, meter: str | None) -> str:
    """``6/10``, or for a money meter ``$1.20/$5.00``."""
    return f"{dollars(used)}/{dollars(limit)}" if is_money(meter) else f"{used}/{limit}"


def rule_text(rule: Any, meter: str | None) -> str:
    return f"{meter} {rule.text}" if meter else str(rule.text)


def meter_lines(meters: dict[str, dict[str, int]]) -> list[str]:
    """What tasks reserved and settled, per meter: ``tokens: reserved 12000, settled 7000,
    refunded 5000, overrun 0 (40 settled, 2 not)``."""
    out = []
    for meter, t in sorted(meters.items()):
        shown = dollars if is_money(meter) else (lambda n: f"{n:,}")
        amounts = ", ".join(
            f"{what} {shown(t.get(what, 0))}"
            for what in ("reserved", "settled", "refunded", "overrun")
        )
        out.append(
            f"{meter}: {amounts} ({t.get('calls', 0):,} settled, {t.get('unsettled', 0):,} not)"
        )
    return out


def console() -> Console:
    """A console on the current stdout (click's test runner swaps it), without auto-highlight."""
    return Console(highlight=False)


def bar(used: int, limit: int, width: int = BAR_WIDTH) -> Text:
    """``used`` of ``limit`` as a bar of ``width`` cells."""
    ratio = 0.0 if limit <= 0 else min(1.0, used / limit)
    filled = round(ratio * width)
    if used > 0 and filled == 0:
        filled = 1
    style = "red" if used >= limit else "yellow" if ratio >= 0.8 else "green"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"))


def limit_title(entry: LimitEntry) -> Text:
    """``queue:emails  10/s, 800/d  sliding_log`` and, for per-key limits, the tasks."""
    if entry.config is None:
        algos = ", ".join(entry.algorithms) or "blocks only"
        return Text.assemble((entry.name, "bold"), (f"  rules unknown ({algos})", "dim"))
    text = Text.assemble(
        (entry.label, "bold"), f"  {entry.config.text}", (f"  {entry.config.algorithm}", "dim")
    )
    if entry.kind == "key":
        tasks = "" if entry.tasks == (entry.name,) else f"; tasks {', '.join(entry.tasks)}"
        text.append(f"  per key{tasks}", "dim")
    return text


def state_text(s: SubjectState) -> Text:
    """``ok``, ``full: next in 0.40s``, ``BLOCKED 1h 59m: reason``, plus bookings."""
    u = s.usage
    parts: list[tuple[str, str]] = []
    if u.blocked is not None:
        reason = f": {u.blocked}" if u.blocked else ""
        what = "PAUSED by upstream" if u.paused else "BLOCKED"
        parts.append((f"{what} {format_duration(u.blocked_for)}{reason}", "bold red"))
    elif u.rules:
        wait = max(r.retry_after for r in u.rules)
        if wait <= 0:
            parts.append(("ok", "green"))
        else:
            parts.append((f"full: next in {format_duration(wait)}", "red"))
    elif s.cap is None:
        parts.append(("not blocked", "dim"))
    if s.cap is not None:
        cap = s.cap
        style = "red" if cap.held >= cap.limit else "green"
        parts.append((f"{cap.held}/{cap.limit} running", style))
        if cap.waiting:
            parts.append((f"{cap.waiting} waiting for a slot", "yellow"))
    if s.tenants:
        top = sorted(s.tenants.items(), key=lambda kv: (-kv[1], kv[0]))
        shares = s.shares or {}
        shown = ", ".join(
            f"{t or '-'}: {n}" + (f" at {shares[t]:.0%}" if t in shares else "") for t, n in top[:3]
        )
        more = f", +{len(top) - 3} tenants" if len(top) > 3 else ""
        waiting = sum(s.tenants.values())
        parts.append((f"{waiting} waiting fairly ({shown}{more})", "yellow"))
    if u.booked_for > 0:
        parts.append((f"booked up to {format_duration(u.booked_for)} ahead", "cyan"))
    elif s.booked:
        parts.append((f"{s.booked} booked", "cyan"))
    text = Text()
    for i, (part, style) in enumerate(parts):
        if i:
            text.append(", ")
        text.append(part, style)
    return text


def limit_table(ls: LimitState) -> Table:
    """One limit: a row per subject and rule (bars), or per subject when the rules are unknown."""
    table = Table(box=None, pad_edge=False)
    longest = max((len(s.subject) for s in ls.subjects), default=7)
    table.add_column("subject", overflow="fold", min_width=min(40, longest))  # fold only if huge
    if ls.entry.config is None:
        table.add_column("state")
        for s in ls.subjects:
            table.add_row(s.subject, state_text(s))
        return table
    for name in ("rule", "usage", "used", "resets in", "state"):
        table.add_column(name, justify="right" if name in ("used", "resets in") else "left")
    for s in ls.subjects:
        rows = [
            (
                rule_text(r.rule, r.meter),
                bar(r.used, r.limit),
                used_text(r.used, r.limit, r.meter),
                format_duration(r.reset_after),
            )
            for r in s.usage.rules
        ]
        if s.cap is not None:
            cap = s.cap
            rows.append(("at once", bar(cap.held, cap.limit), f"{cap.held}/{cap.limit}", ""))
        for i, row in enumerate(rows):
            table.add_row(s.subject if i == 0 else "", *row, state_text(s) if i == 0 else "")
    return table


def limits_view(states: list[LimitState], *, parked: bool = False) -> Group:
    """Every limit: its title, its table, what was left out; a blank line between limits."""
    parts: list[RenderableType] = []
    for ls in states:
        parts.append(limit_title(ls.entry))
        if ls.subjects:
            parts.append(limit_table(ls))
        else:
            parts.append(Text("nothing counted in Redis", style="dim"))
        for line in meter_lines(ls.meters or {}):
            parts.append(Text(line, style="dim"))
        if ls.total > len(ls.subjects):
            more = f"{ls.total - len(ls.subjects)}{'+' if ls.capped else ''}"
            parts.append(Text(f"... {more} more subjects (--subjects to see them)", "dim"))
        if parked:
            parts.append(Text(f"{ls.parked} parked tasks", "dim"))
        parts.append(Text(""))
    return Group(*parts)


def usage_json(u: Usage) -> list[dict[str, Any]]:
    return [
        {
            "rule": r.rule.text,
            "meter": r.meter,
            "used_text": used_text(r.used, r.limit, r.meter),
            "limit": r.limit,
            "used": r.used,
            "remaining": r.remaining,
            "next_free_in": json_number(r.retry_after),
            "fully_free_in": json_number(r.reset_after),
        }
        for r in u.rules
    ]


def cap_json(cap: CapUsage) -> dict[str, Any]:
    return {
        "limit": cap.limit,
        "running": cap.held,
        "waiting": cap.waiting,
        "holders": [
            {
                "holder": h.holder,
                "since": h.since,
                "lease_ends_in": json_number(max(0.0, h.expires - cap.now)),
                "fence": h.fence,
                "info": h.info,
                "handed_over": h.pending,
            }
            for h in cap.holders
        ],
    }


def subject_json(s: SubjectState) -> dict[str, Any]:
    u = s.usage
    return {
        "subject": s.subject,
        "algorithm": s.algorithm,
        "rules": usage_json(u),
        "admits_now": s.admits,
        "blocked": u.blocked is not None,
        "paused": u.paused,
        "block_reason": u.blocked,
        "blocked_for": json_number(u.blocked_for),
        "booked": s.booked,
        "booked_for": json_number(u.booked_for),
        "concurrency": cap_json(s.cap) if s.cap is not None else None,
        "fair_waiting": s.tenants,
        "fair_shares": s.shares,
        "now": u.now,
    }


def limit_json(ls: LimitState) -> dict[str, Any]:
    return {
        **ls.entry.describe(),
        "subject_count": ls.total,
        "subject_count_capped": ls.capped,
        "parked": ls.parked,
        "meter_totals": ls.meters,
        "meter_lines": meter_lines(ls.meters or {}),
        "subjects": [subject_json(s) for s in ls.subjects],
    }
