"""Plan a batch offline: when can each of N jobs start under a sliding log with several rules?

Pure arithmetic, no Redis. Job ``j`` starts at the earliest ``t >= start`` such that, for every
rule "at most N units per W seconds", the jobs already planned in ``(t - W, t]`` leave room for
its ``cost``; a job that has to wait also starts at least one average interval (the shortest
``W / N`` among the rules, times its cost) after the job before it, so a backlog runs
evenly. That is what :meth:`governor.Limiter.reserve` books, one job after another, with the
sliding log (``tolerance=0``, all calls at the same ``now``).

>>> plan("2/s", jobs=5)
[0.0, 0.0, 1.0, 1.5, 2.0]
>>> batch = Plan.build("1/s, 20/m, 200/h, 800/d", jobs=10_000)
>>> batch.last / 86_400                  # the last job may start 12d 1h 9m 19s in
12.048136574074075
>>> batch.tightest.text, batch.per_day   # the rule that sets the long-run pace: 800 a day
('800/d', 800.0)

Why it is O(jobs x rules): each job is planned no earlier than the one before it (planning more
jobs never makes room earlier), so all planned jobs lie at or before ``t``; then rule (N, W)
admits job ``j`` at ``t`` exactly when the job ``N // cost`` places earlier started at or
before ``t - W``. Hence ``t_j = max(start, t_{j - N_i // cost} + W_i over the rules)``, and for
a job that waits (``t_j > start``) also ``t_j >= t_{j-1} + ceil(cost * W/N)`` (the spacing).
Times are computed in integer microseconds (as the limiter counts them), so they are exact.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from .algorithms import get_algorithm
from .errors import ConfigError, CostError
from .rules import Rule, RuleSpec, parse_rules

__all__ = ["Plan", "most_in_window", "plan"]

_US = 1_000_000


def _check(rules: tuple[Rule, ...], jobs: int, cost: int) -> None:
    get_algorithm("sliding_log").check(rules)  # the plan is the sliding log's: same rules
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
        raise ConfigError(f"jobs must be a whole number >= 0, got {jobs!r}")
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise CostError(f"cost must be a positive integer, got {cost!r}")
    for rule in rules:
        if cost > rule.limit:
            raise CostError(
                f"a job costing {cost} can never start under rule {rule.text!r} "
                f"(at most {rule.limit} per window): lower the cost or raise the limit"
            )


def most_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` inside any half-open window of ``window`` seconds: check a
    schedule, or recorded start times, against a rule (``<= rule.limit`` means it held).

    >>> most_in_window([0.0, 0.5, 1.0, 1.2], 1.0)
    3
    """
    ordered = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(ordered):
        while ordered[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


def plan_us(rules: tuple[Rule, ...], jobs: int, start_us: int, cost: int = 1) -> list[int]:
    """:func:`plan` on integer microseconds (no validation; see :func:`plan`)."""
    steps = [(rule.limit // cost, rule.period_us) for rule in rules]
    # the same float expression as the Lua script, so both round alike
    spacing = math.ceil(min(rule.period_us / rule.limit for rule in rules) * cost)
    # the limiter counts each start at its stamp, the start rounded up to the millisecond
    starts: list[int] = []
    stamps: list[int] = []
    for j in range(jobs):
        t = start_us
        for back, window in steps:
            if j >= back:
                earliest = stamps[j - back] + window
                if earliest > t:
                    t = earliest
        if t > start_us and j:
            t = max(t, stamps[j - 1] + spacing)
        starts.append(t)
        stamps.append(-(-t // 1000) * 1000)
    return starts


def plan(rules: RuleSpec, jobs: int, start: float = 0.0, cost: int = 1) -> list[float]:
    """The earliest start (seconds, same clock as ``start``) of each of ``jobs`` jobs, in order.

    >>> plan("1/s, 3/10s", jobs=5, start=100.0)
    [100.0, 101.0, 102.0, 110.0, 111.0]
    """
    parsed = parse_rules(rules)
    _check(parsed, jobs, cost)
    return [t / _US for t in plan_us(parsed, jobs, round(start * _US), cost)]


@dataclass(frozen=True)
class Plan:
    """A planned batch: every start plus the summaries ``governor plan`` prints.

    >>> p = Plan.build("1/s, 20/m, 200/h, 800/d", jobs=1000)
    >>> p.counts(3600)[:4]        # jobs per hour from the start: (hour index, jobs)
    [(0, 200), (1, 200), (2, 200), (3, 200)]
    """

    rules: tuple[Rule, ...]
    jobs: int
    start: float
    cost: int
    starts_us: tuple[int, ...] = field(repr=False)

    @classmethod
    def build(cls, rules: RuleSpec, jobs: int, start: float = 0.0, cost: int = 1) -> Plan:
        parsed = parse_rules(rules)
        _check(parsed, jobs, cost)
        start_us = round(start * _US)
        return cls(parsed, jobs, start_us / _US, cost, tuple(plan_us(parsed, jobs, start_us, cost)))

    @property
    def starts(self) -> list[float]:
        """Each job's earliest start (seconds)."""
        return [t / _US for t in self.starts_us]

    @property
    def first(self) -> float:
        """Seconds after ``start`` the first job may start (0.0; also for an empty plan)."""
        return (self.starts_us[0] / _US - self.start) if self.starts_us else 0.0

    @property
    def last(self) -> float:
        """Seconds after ``start`` the last job may start (0.0 for an empty plan)."""
        return (self.starts_us[-1] / _US - self.start) if self.starts_us else 0.0

    @property
    def tightest(self) -> Rule:
        """The rule with the lowest long-run rate: it sets the pace of a long batch."""
        return min(self.rules, key=lambda r: (r.limit // self.cost) / r.period_us)

    @property
    def per_day(self) -> float:
        """Jobs per day in the long run (the tightest rule's pace)."""
        rule = self.tightest
        return (rule.limit // self.cost) * 86_400 / rule.period

    def counts(self, period: float) -> list[tuple[int, int]]:
        """Jobs starting in each ``period`` seconds after ``start``: (index, jobs), empty
        periods left out, in order."""
        step = round(period * _US)
        if step <= 0:
            raise ConfigError(f"period must be positive, got {period!r}")
        origin = round(self.start * _US)
        counter = Counter((t - origin) // step for t in self.starts_us)
        return sorted(counter.items())

    def tenants(self, shares: Sequence[tuple[str, int, float]]) -> list[TenantPlan]:
        """When each tenant's jobs run when ``shares`` (name, jobs, weight) are queued at once
        under a fair limit: jobs go in order of their start-time fair queuing tags (the k-th
        job of a tenant with weight w: k x cost / w; ties in the order given), each at the
        next start of this plan. Their jobs must add up to the plan's."""
        if sum(n for _, n, _ in shares) != self.jobs:
            raise ConfigError(
                f"the tenants' jobs add up to {sum(n for _, n, _ in shares)}, not {self.jobs}"
            )
        order = sorted(
            ((k * self.cost / w, i) for i, (_, n, w) in enumerate(shares) for k in range(1, n + 1)),
        )
        firsts: dict[int, float] = {}
        lasts: dict[int, float] = {}
        for slot, (_, i) in zip(self.starts_us, order):
            firsts.setdefault(i, slot / _US - self.start)
            lasts[i] = slot / _US - self.start
        return [
            TenantPlan(name, n, w, firsts.get(i, 0.0), lasts.get(i, 0.0))
            for i, (name, n, w) in enumerate(shares)
        ]


@dataclass(frozen=True)
class TenantPlan:
    """One tenant's jobs in a fair plan: seconds after the start of its first and last job."""

    name: str
    jobs: int
    weight: float
    first: float
    last: float
