"""What the dashboard shows, read from Redis once per refresh by one background thread.

Every ``interval`` seconds the :class:`Sampler` reads every limit (the app's, or those found in
Redis) through the CLI's readers (:mod:`governor.cli.limits`) and keeps the result as one
:class:`Frame`; browsers poll the frame, so the cost in Redis does not grow with the number of
open pages. A refresh costs, in Redis calls::

    1 (live limits) + 1 (adaptive factors, if any limit is adaptive)
    + 1 (what tasks reserved and settled, if any limit has meters)
    + per per-key limit: its SCAN (1 call per 1000 keys of that limit)
    + per subject examined (at most ``examine`` per limit): 1 (usage)
      + 1 if the limit has a concurrency cap + 1 if it is fair
    + 3 for parked tasks (two ZCARDs, the next due), and every ``PARKED_EVERY`` seconds an
      HSCAN of at most ``PARKED_SCAN`` parked envelopes for the count per limit

Starts are not stored in Redis as a time series: the chart's series is sampled here, in this
process (a ring buffer per limit and subject, ``history`` seconds long), so it begins when the
dashboard starts. The rate drawn is the units the subject's shortest rule counts divided by its
period: starts per second averaged over that rule's window, against the rule's limit per second.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

from ..cli.common import State, mask_url, user_errors
from ..cli.entries import LimitEntry
from ..cli.limits import (
    LimitState,
    SubjectState,
    app_limits,
    found_limits,
    subject_state,
    with_meter_totals,
)

__all__ = ["Frame", "History", "Parked", "Sampler", "rate_of", "read_limits", "read_parked"]

log = logging.getLogger("governor.dashboard")

PARKED_EVERY = 10.0
"""Seconds between two counts of parked tasks per limit (they read the envelopes)."""
PARKED_SCAN = 2000
"""Parked envelopes read at most per count (beyond that the counts are lower bounds)."""


def rate_of(s: SubjectState) -> tuple[float, float] | None:
    """(starts per second over the shortest rule's window, that rule's limit per second)."""
    if not s.usage.rules:
        return None
    shortest = min(s.usage.rules, key=lambda r: r.rule.period_us)
    period = shortest.rule.period
    return shortest.used / period, shortest.limit / period


class History:
    """Ring buffers of (time, rate) per (limit label, subject), ``seconds`` long."""

    def __init__(self, seconds: float, interval: float) -> None:
        self.seconds = seconds
        self.points = max(2, math.ceil(seconds / interval) + 1)
        self._series: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def add(self, label: str, subject: str, now: float, rate: float) -> None:
        with self._lock:
            series = self._series.get((label, subject))
            if series is None:
                series = self._series[(label, subject)] = deque(maxlen=self.points)
            if series and now - series[-1][0] < 0.2:  # a page reading it between two refreshes
                return
            series.append((now, rate))

    def get(self, label: str, subject: str) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._series.get((label, subject), ()))

    def prune(self, now: float) -> None:
        """Forget the series nobody updated for ``seconds``."""
        with self._lock:
            for key in [k for k, v in self._series.items() if now - v[-1][0] > self.seconds]:
                del self._series[key]

    def __len__(self) -> int:
        return len(self._series)


@dataclass(frozen=True)
class Parked:
    """Parked tasks: how many, the next one due, and per limit label (lower bounds if capped)."""

    total: int = 0
    next_due: float | None = None
    by_label: dict[str, int] = field(default_factory=dict)
    capped: bool = False


@dataclass(frozen=True)
class Frame:
    """One refresh: every limit (``subjects`` holds every subject examined, blocked then the
    fullest first), or the error that stopped it (``limits`` then holds the last good ones)."""

    time: float
    limits: list[LimitState]
    source: str
    parked: Parked
    calls: int
    """Redis calls this refresh made (counted as the formula in the module's docs says)."""
    took: float
    error: str | None = None
    error_since: float | None = None


def _examined(
    state: State, entry: LimitEntry, subjects: Iterable[str] | None, examine: int
) -> tuple[LimitState, int]:
    """A limit's subjects (at most ``examine``), sorted like ``status``: and the calls made."""
    calls = 0
    if entry.subject is not None:
        names: list[str] = [entry.subject]
    else:
        if subjects is None:
            subjects = entry.limiter(state).subjects()
            calls += 1
        names = list(islice(subjects, examine + 1))
    capped = len(names) > examine
    found = [subject_state(state, entry, s) for s in names[:examine]]
    per = 1
    if entry.config is not None:
        per += (entry.config.concurrency is not None) + entry.config.fair
    calls += per * len(found)
    found.sort(key=lambda s: (s.usage.blocked is None, -s.fullness, s.subject))
    return LimitState(entry, found, len(found), 0, capped), calls


def read_limits(state: State, examine: int) -> tuple[list[LimitState], str, int]:
    """Every limit with at most ``examine`` subjects each, where they came from ("app" or
    "redis"), and the Redis calls made."""
    if state.app is not None:
        state.cache.pop("live", None)  # live limits change while the dashboard runs
        entries = app_limits(state)
        calls = 1 + any(e.config is not None and e.config.adaptive for e in entries)
        if entries:
            out = []
            for entry in entries:
                ls, n = _examined(state, entry, None, examine)
                out.append(ls)
                calls += n
            calls += any(e.config is not None and e.config.meters for e in entries)
            return with_meter_totals(state, out), "app", calls
    else:
        calls = 0
    found = found_limits(state)
    calls += 1
    out = []
    for entry, subjects in found:
        ls, n = _examined(state, entry, subjects, examine)
        out.append(ls)
        calls += n
    return out, "redis", calls


def read_parked(state: State, by_label: bool) -> tuple[Parked | None, int]:
    """Parked tasks (None without celery installed), and the Redis calls made."""
    try:
        from ..celery.waiting import parking
    except ImportError:
        return None, 0
    due_key, _, lease_key = parking.keys(state.prefix)
    total = int(state.client.zcard(due_key)) + int(state.client.zcard(lease_key))
    first = state.client.zrange(due_key, 0, 0, withscores=True)
    next_due = float(first[0][1]) / 1000 if first else None
    calls = 3
    counts: dict[str, int] = {}
    capped = False
    if by_label and total:
        seen = 0
        for env in parking.parked_entries(state.client, state.prefix):
            seen += 1
            label = str(env.get("label"))
            counts[label] = counts.get(label, 0) + 1
            if seen >= PARKED_SCAN:
                capped = True
                break
        calls += 1 + seen // 500
    return Parked(total, next_due, counts, capped), calls


class Sampler:
    """Reads a :class:`Frame` every ``interval`` seconds in a daemon thread."""

    def __init__(
        self, state: State, interval: float = 1.0, examine: int = 100, history: float = 300.0
    ) -> None:
        self.state = state
        self.interval = interval
        self.examine = examine
        self.history = History(history, interval)
        self.frame = Frame(time.time(), [], "none", Parked(), 0, 0.0, "not read yet")
        self._parked = Parked()
        self._parked_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return f"{mask_url(self.state.redis_url)} prefix {self.state.prefix!r}"

    def refresh(self) -> Frame:
        """Read every limit now (errors become the frame's ``error``, never an exception)."""
        with self._lock:
            started = time.monotonic()
            try:
                with user_errors(self.state):
                    limits, source, calls = read_limits(self.state, self.examine)
                    now = time.time()
                    parked, more = read_parked(self.state, now - self._parked_at >= PARKED_EVERY)
            except Exception as exc:  # the page shows it; the next refresh tries again
                message = getattr(exc, "message", None) or mask_url(f"{type(exc).__name__}: {exc}")
                if not hasattr(exc, "message"):
                    log.exception("dashboard refresh failed")
                last = self.frame
                self.frame = Frame(
                    time.time(),
                    last.limits,
                    last.source,
                    last.parked,
                    0,
                    time.monotonic() - started,
                    str(message),
                    last.error_since if last.error is not None else time.time(),
                )
                return self.frame
            if parked is not None and parked.by_label:
                self._parked, self._parked_at = parked, now
            elif parked is not None and not parked.total:
                self._parked, self._parked_at = Parked(), now
            if parked is not None:
                parked = Parked(
                    parked.total, parked.next_due, self._parked.by_label, self._parked.capped
                )
            limits = [self._with_parked(ls, parked) for ls in limits]
            for ls in limits:
                for s in ls.subjects:
                    self.record(ls.entry.label, s)
            self.history.prune(now)
            self.frame = Frame(
                now, limits, source, parked or Parked(), calls + more, time.monotonic() - started
            )
            return self.frame

    @staticmethod
    def _with_parked(ls: LimitState, parked: Parked | None) -> LimitState:
        if parked is None:
            return ls
        count = parked.by_label.get(ls.entry.label, 0)
        return LimitState(ls.entry, ls.subjects, ls.total, count, ls.capped)

    def record(self, label: str, s: SubjectState) -> None:
        rate = rate_of(s)
        if rate is not None:
            self.history.add(label, s.subject, s.usage.now, rate[0])

    def start(self) -> Sampler:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="governor-dashboard", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
