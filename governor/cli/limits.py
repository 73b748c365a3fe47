"""Which limits exist, and what Redis holds for them: the data behind status, inspect and top.

With a Celery app, the limits are the app's configuration (see
:mod:`governor.celery.config.task_limits`)::

    queue quota      limiter "queue", subject = the queue      governor inspect queue emails
    whole-task       limiter "task",  subject = the task name  governor inspect task proj.sync
    per-key          limiter = governor_name or task name      governor inspect proj.call c-42

Without one, :func:`found_limits` groups the ``<prefix>:{<name>:<subject>}:<kind>`` keys that a
SCAN finds by limiter name; their rules are unknown, so only blocks and bookings are shown.

>>> entries = configured_limits(app, settings)            # doctest: +SKIP
>>> [snapshot(state, e) for e in entries]                 # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING

from ..algorithms import ALGORITHMS
from ..decision import CapUsage, Usage
from ..keys import escape, parse_key
from ..limiter import Limiter
from ..text import as_text
from .app_limits import app_limits, configured_limits
from .apps import settings_of
from .common import CliError, State
from .entries import Config, LimitEntry

if TYPE_CHECKING:
    pass

__all__ = [
    "LimitEntry",
    "LimitState",
    "SubjectState",
    "all_limits",
    "app_limits",
    "configured_limits",
    "dead_letter_count",
    "found_limits",
    "meter_totals",
    "parked_count",
    "resolve",
    "snapshot",
    "with_meter_totals",
]

MAX_EXAMINED = 5000
"""Subjects of one limit whose usage status and top read (one round trip each)."""
_SUFFIXES = {a.suffix: a.name for a in ALGORITHMS.values()}


@dataclass(frozen=True)
class SubjectState:
    """What Redis holds for one subject of a limit (``usage.rules`` is empty if unknown)."""

    subject: str
    algorithm: str | None
    usage: Usage
    booked: int | None
    """Bookings held; None when the rules (needed to count them) are unknown."""
    cap: CapUsage | None = None
    """Holders and waiters of its concurrency cap, if it has one."""
    tenants: dict[str, int] | None = None
    """Under a fair limit: calls waiting in its fair queue, per tenant."""
    shares: dict[str, float] | None = None
    """Under a fair limit: each waiting tenant's share of the limit now (its weight over the
    waiting tenants' weights)."""

    @property
    def admits(self) -> bool:
        """Whether one more unit would be admitted now (not blocked, every rule has room, a
        free concurrency slot that nobody waits for)."""
        free = self.cap is None or (self.cap.held < self.cap.limit and not self.cap.waiting)
        return (
            free
            and self.usage.blocked is None
            and all(r.retry_after <= 0 for r in self.usage.rules)
        )

    @property
    def fullness(self) -> float:
        capped = self.cap.held / self.cap.limit if self.cap is not None else 0.0
        return max([r.used / r.limit for r in self.usage.rules] + [capped])


@dataclass(frozen=True)
class LimitState:
    entry: LimitEntry
    subjects: list[SubjectState]
    total: int
    """Subjects examined; ``subjects`` may show fewer (blocked, then the fullest, first)."""
    parked: int = 0
    capped: bool = False
    """More than :data:`MAX_EXAMINED` subjects exist: only that many were examined."""
    meters: dict[str, dict[str, int]] | None = None
    """A limit with meters: per meter, what tasks reserved, settled, got refunded and overran
    (units; ``calls`` settled, ``unsettled`` never), summed over every worker since the
    totals were kept (``<prefix>:{metering}:totals``)."""


# -- the Celery app ---------------------------------------------------------------------------


def glob_escape(text: str) -> str:
    """``text`` matched literally in a SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def has_state(state: State, name: str) -> bool:
    """Whether Redis holds anything (state or a block) for any subject of limiter ``name``."""
    pattern = glob_escape(f"{state.prefix}:{{{escape(name)}:") + "*"
    return next(iter(state.client.scan_iter(match=pattern, count=1000)), None) is not None


def found_limits(state: State) -> list[tuple[LimitEntry, list[str]]]:
    """Limiters seen in Redis under the prefix (SCAN), with their subjects."""
    pattern = glob_escape(f"{state.prefix}:{{") + "*"
    subjects: dict[str, dict[str, None]] = {}
    algorithms: dict[str, set[str]] = {}
    for raw in state.client.scan_iter(match=pattern, count=1000):
        key = as_text(raw)
        parts = parse_key(key, state.prefix)
        if parts is None:
            continue
        name, subject, kind = parts
        subjects.setdefault(name, {})[subject] = None
        if kind[:2] in _SUFFIXES:  # all but the sliding log add a rules hash
            algorithms.setdefault(name, set()).add(_SUFFIXES[kind[:2]])
    return [
        (
            LimitEntry("found", name, None, algorithms=tuple(sorted(algorithms.get(name, ())))),
            list(subjects[name]),
        )
        for name in sorted(subjects)
    ]


def resolve(
    state: State, name: str, subject: str, rules: str | None, algorithm: str | None = None
) -> LimitEntry | None:
    """The limit ``NAME SUBJECT`` refers to: from ``--rules``, else from the app's config.

    None when there is neither (commands that need the rules say so). An app that does not
    configure ``name`` is a usage error (a typo must not silently inspect an empty limiter).
    """
    if rules is not None:
        from ..algorithms import get_algorithm
        from ..rules import parse_rules

        if algorithm is None:
            algorithm = settings_of(state.app).algorithm if state.app else "sliding_log"
        config = Config(parse_rules(rules), get_algorithm(algorithm).name)
        return LimitEntry("given", name, config, subject)
    if state.app is None:
        return None
    entries = app_limits(state)
    for entry in entries:
        if entry.name == name and entry.subject in (None, subject):
            return replace(entry, subject=subject) if entry.subject is None else entry
    fixed = [e.subject for e in entries if e.name == name and e.subject is not None]
    if fixed:
        raise CliError(
            f"{name} {subject!r} has no limit in app {state.app_name!r}; configured: "
            + ", ".join(f"{name} {s}" for s in fixed)
        )
    subjects: dict[str, list[str]] = {}
    for e in entries:
        subjects.setdefault(e.name, [])
        if e.subject is not None:
            subjects[e.name].append(e.subject)
    known = ", ".join(
        f"{n} ({', '.join(subs)})" if subs else n for n, subs in sorted(subjects.items())
    )
    raise CliError(
        f"unknown limit name {name!r}: app {state.app_name!r} configures {known or 'none'}. "
        "Pass --rules to use a limiter the app does not configure"
    )


# -- what Redis holds -------------------------------------------------------------------------


def subject_state(state: State, entry: LimitEntry, subject: str) -> SubjectState:
    if entry.config is not None:
        lim = entry.limiter(state)
        usage = lim.usage(subject)
        cap = lim.holders(subject) if lim.cap is not None else None
        tenants = fair_waiting(state, lim, subject) if entry.config.fair else None
        shares = None
        if tenants:
            weight = entry.config.weight or (lambda _t: 1.0)
            weights = {t: weight(t) for t in tenants}
            total = sum(weights.values())
            shares = {t: w / total for t, w in weights.items()}
        return SubjectState(
            subject, entry.config.algorithm, usage, usage.booked, cap, tenants, shares
        )
    algorithm = entry.algorithms[0] if entry.algorithms else None
    # the sliding log's view: blocks are shared by every algorithm; its bookings need no rules
    usage = entry.limiter(state, "sliding_log").usage(subject)
    log = algorithm == "sliding_log"
    booked = usage.booked if log else None
    usage = replace(usage, rules=(), booked=0, booked_for=usage.booked_for if log else 0.0)
    return SubjectState(subject, algorithm, usage, booked)


def fair_waiting(state: State, lim: Limiter, subject: str) -> dict[str, int]:
    from ..celery.fair.queue import FairQueue

    return FairQueue(lim, subject).waiting(state.client)


def snapshot(
    state: State,
    entry: LimitEntry,
    subjects: Iterable[str] | None = None,
    max_subjects: int | None = None,
) -> LimitState:
    """Usage of a limit's subjects: its own subject, the given ones, or those SCAN finds."""
    if subjects is None and entry.subject is not None:
        subjects = [entry.subject]
    elif subjects is None:
        subjects = entry.limiter(state).subjects()
    found = [subject_state(state, entry, s) for s in islice(subjects, MAX_EXAMINED + 1)]
    capped = len(found) > MAX_EXAMINED
    found = found[:MAX_EXAMINED]
    found.sort(key=lambda s: (s.usage.blocked is None, -s.fullness, s.subject))
    total = len(found)
    if max_subjects is not None:
        found = found[:max_subjects]
    return LimitState(entry, found, total, parked_count(state, entry), capped)


def all_limits(state: State, max_subjects: int | None = None) -> tuple[list[LimitState], str]:
    """Every limit with its subjects, and where they came from ("app" or "redis")."""
    if state.app is not None:
        entries = app_limits(state)
        if entries:
            states = [snapshot(state, e, max_subjects=max_subjects) for e in entries]
            return with_meter_totals(state, states), "app"
    return [
        snapshot(state, entry, subjects, max_subjects) for entry, subjects in found_limits(state)
    ], "redis"


def meter_totals(state: State) -> dict[str, dict[str, dict[str, int]]]:
    """What tasks reserved and settled under limits with meters: label -> meter -> what ->
    units (one HGETALL; empty without celery installed)."""
    try:
        learned = importlib.import_module("governor.celery.metering.learned")
    except ImportError:
        return {}
    raw = state.client.hgetall(learned.totals_key(state.prefix))
    out: dict[str, dict[str, dict[str, int]]] = {}
    for field_, value in raw.items():
        text = field_.decode("utf-8", "replace") if isinstance(field_, bytes) else str(field_)
        meter, what, label = [*text.split("|", 2), "", ""][:3]
        if label:
            out.setdefault(label, {}).setdefault(meter, {})[what] = int(value)
    return out


def with_meter_totals(state: State, states: list[LimitState]) -> list[LimitState]:
    """``states`` with the meter totals of their limits with meters (a call only if any)."""
    if not any(ls.entry.config is not None and ls.entry.config.meters for ls in states):
        return states
    totals = meter_totals(state)
    return [
        replace(ls, meters=totals.get(ls.entry.label, {}))
        if ls.entry.config is not None and ls.entry.config.meters
        else ls
        for ls in states
    ]


# -- parked tasks -----------------------------------------------------------------------------


def parking_available() -> bool:
    try:
        importlib.import_module("governor.celery.waiting.parking")
    except ImportError:
        return False
    return True


def dead_letter_count(state: State) -> int | None:
    """Letters in the dead-letter place (None without celery installed)."""
    try:
        dead_letters = importlib.import_module("governor.celery.waiting.dead_letters")
    except ImportError:
        return None
    return int(dead_letters.count(state.client, state.prefix))


def parked_count(state: State, entry: LimitEntry) -> int:
    """Tasks parked in Redis because ``entry`` made them wait (0 without celery installed)."""
    try:
        parking = importlib.import_module("governor.celery.waiting.parking")
    except ImportError:
        return 0
    shards = settings_of(state.app).parking_shards if state.app is not None else 1
    return int(parking.parked_count(state.client, state.prefix, entry.label, shards))
