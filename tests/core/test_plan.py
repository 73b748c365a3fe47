"""The offline planner: against a brute-force search, and against the real Redis limiter."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import ConfigError, CostError, Limiter, Rule
from governor.plan import Plan, plan, plan_us

EPOCH = 1_700_000_000.0  # a whole millisecond: the sliding log stamps in whole ms


def brute_force(rules: list[Rule], jobs: int, start_us: int, cost: int) -> list[int]:
    """The definition, searched directly: job j starts at the earliest t >= start such that,
    for every rule, the units of the jobs already planned in (t - W, t] leave room for cost.

    The set of such t only changes where a job enters a window (t = t_k) or leaves it
    (t = t_k + W), so the earliest one is ``start`` or some ``t_k + W``. A job that waits also
    keeps one average interval (cost x the shortest W/N among the rules) after the job before it.
    """
    import math

    spacing = math.ceil(min(r.period_us / r.limit for r in rules) * cost)
    starts: list[int] = []
    stamps: list[int] = []  # starts rounded up to the ms, as the limiter counts them
    for _ in range(jobs):
        candidates = {start_us} | {t + r.period_us for t in stamps for r in rules}
        if starts:
            candidates |= {stamps[-1] + spacing}

        def fits(t: int) -> bool:
            return all(
                cost * sum(1 for s in stamps if t - r.period_us < s <= t) + cost <= r.limit
                for r in rules
            )

        def spaced(t: int) -> bool:
            return t == start_us or not starts or t >= stamps[-1] + spacing

        starts.append(min(t for t in candidates if t >= start_us and fits(t) and spaced(t)))
        stamps.append(-(-starts[-1] // 1000) * 1000)
    return starts


rules_st = st.lists(
    st.builds(Rule, st.integers(1, 6), st.integers(1, 5000).map(lambda ms: ms / 1000)),
    min_size=1,
    max_size=4,
)


@given(
    rules=rules_st,
    jobs=st.integers(0, 40),
    start_ms=st.integers(0, 10**6),
    cost=st.integers(1, 3),
)
def test_matches_brute_force(rules: list[Rule], jobs: int, start_ms: int, cost: int) -> None:
    cost = min(cost, *(r.limit for r in rules))
    start_us = start_ms * 1000
    got = plan_us(tuple(rules), jobs, start_us, cost)
    assert got == brute_force(rules, jobs, start_us, cost)
    assert plan(rules, jobs, start_us / 1e6, cost) == [t / 1e6 for t in got]
    # and it is a valid schedule: no window of any rule holds more than its limit
    for rule in rules:
        for t in got:
            assert cost * sum(1 for s in got if t - rule.period_us < s <= t) <= rule.limit


def reserve_all(
    client: redis.Redis, rules: list[Rule], jobs: int, now: float, cost: int
) -> list[float]:
    """Reserve ``jobs`` one after another at a fixed ``now``: the start each one gets."""
    limiter = Limiter(client, rules, name="plan", prefix=f"gt{uuid.uuid4().hex[:10]}")
    starts: list[float] = []
    for _ in range(jobs):
        d = limiter.reserve("batch", cost, now=now, tolerance=0)
        assert d.allowed or d.booked
        starts.append(d.now if d.allowed else d.slot.start)  # type: ignore[union-attr]
    return starts


@settings(max_examples=60)
@given(
    rules=rules_st,
    jobs=st.integers(1, 40),
    offset_ms=st.integers(0, 10**6),
    cost=st.integers(1, 3),
)
def test_matches_redis_reservations(
    r: redis.Redis, rules: list[Rule], jobs: int, offset_ms: int, cost: int
) -> None:
    cost = min(cost, *(rule.limit for rule in rules))
    now = EPOCH + offset_ms / 1000
    assert reserve_all(r, rules, jobs, now, cost) == plan(rules, jobs, now, cost)


def test_matches_redis_for_the_partner_api_rules(r: redis.Redis) -> None:
    rules = [Rule.parse(x) for x in ("1/s", "20/m", "200/h", "800/d")]
    # 1000 jobs cross the day boundary (job 801 waits for the first day's window to pass)
    # and overflow the log Redis keeps (the largest limit's worth of stamps)
    expected = plan(rules, 1000, EPOCH)
    assert reserve_all(r, rules, 1000, EPOCH, 1) == expected
    assert expected[800] - EPOCH == 86400


def test_the_partner_api_batch_takes_twelve_days() -> None:
    began = time.perf_counter()
    p = Plan.build("1/s, 20/m, 200/h, 800/d", jobs=10_000)
    assert time.perf_counter() - began < 0.5
    assert p.last == 12 * 86400 + 3600 + 9 * 60 + 19  # 12d 1h 9m 19s
    assert p.tightest == Rule.parse("800/d")
    assert p.per_day == 800
    assert p.counts(86400) == [(d, 800) for d in range(12)] + [(12, 400)]
    assert p.counts(3600)[:5] == [(0, 200), (1, 200), (2, 200), (3, 200), (24, 200)]
    starts = p.starts
    assert starts[:3] == [0.0, 1.0, 2.0]
    assert starts[20] == 60.0  # 20/m
    assert starts[200] == 3600.0  # 200/h


def test_start_and_cost() -> None:
    assert plan("2/s", 5, start=100.0) == [100.0, 100.0, 101.0, 101.5, 102.0]
    assert plan("4/s", 3, cost=2) == [0.0, 0.0, 1.0]
    assert plan("2/s", 5) == [0.0, 0.0, 1.0, 1.5, 2.0]  # a waiting backlog runs evenly
    assert plan("3/s", 3, cost=2) == [0.0, 1.0, 2.0]  # 2 + 2 > 3: one job a second
    assert plan("1/s", 0) == []
    p = Plan.build("1/s", 3, start=50.0)
    assert (p.first, p.last, p.starts) == (0.0, 2.0, [50.0, 51.0, 52.0])
    assert Plan.build("1/s", 0).last == 0.0


def test_bad_input_names_the_fix() -> None:
    with pytest.raises(CostError, match="never start under rule '1/s'"):
        plan("1/s, 10/m", 3, cost=2)
    with pytest.raises(ConfigError, match="jobs must be"):
        plan("1/s", -1)
    with pytest.raises(CostError):
        plan("1/s", 1, cost=0)
    with pytest.raises(ConfigError, match="unknown unit"):
        plan("1/x", 1)


def test_tenants_sharing_a_plan_fairly() -> None:
    p = Plan.build("20/s", 620)
    a, b = p.tenants([("A", 600, 1.0), ("B", 20, 1.0)])
    assert (a.jobs, b.jobs) == (600, 20)
    assert b.first == 0.0 and b.last == pytest.approx(1.95)  # every other start: 10/s
    assert a.last == pytest.approx(30.95)
    heavy, light = Plan.build("20/s", 40).tenants([("H", 20, 3.0), ("L", 20, 1.0)])
    starts = Plan.build("20/s", 40).starts
    assert heavy.last < light.last and light.last == pytest.approx(starts[-1])
    with pytest.raises(ConfigError):
        p.tenants([("A", 1, 1.0)])


def test_plan_command_with_tenants() -> None:
    import json

    from click.testing import CliRunner

    from governor.cli import cli

    runner = CliRunner(env={"COLUMNS": "160"})
    out = runner.invoke(cli, ["plan", "20/s", "--tenants", "A=600,B=20", "--json"])
    assert out.exit_code == 0, out.output
    rows = {t["name"]: t for t in json.loads(out.stdout)["tenants"]}
    assert rows["B"]["last"] == pytest.approx(1.95) and rows["B"]["last_fifo"] == pytest.approx(
        30.95
    )
    text = runner.invoke(cli, ["plan", "20/s", "--tenants", "A=600,B=20x2"]).stdout
    assert "last (fair)" in text and "B" in text
    for bad in (["--tenants", "A"], ["--tenants", "A=5x0"], ["--jobs", "3", "--tenants", "A=5"]):
        assert runner.invoke(cli, ["plan", "20/s", *bad]).exit_code == 2
    assert runner.invoke(cli, ["plan", "20/s"]).exit_code == 2  # neither --jobs nor --tenants
