"""One governed run on worker nodes, a queue per capability, and the promises every pool and
broker row checks (tests/nodes/test_pools.py, tests/nodes/test_brokers.py).

The nodes run tests/support/worker_app.py with tests/support/pool_probe.py (admissions as Redis
counted them, deferrals, the hub watch); every body sleeps :data:`SLEEP`. Queues, each its own name
per run:

========  ============================  ==========================================================
kind      limit                         what is checked
========  ============================  ==========================================================
``rate``  ``10/s``                      admissions counted in any second <= 10
``park``  ``2/5s`` (park after 1 s)     the two that wait 5 s are parked in Redis while no worker
                                        and no broker holds them; <= 2 counted in any 5 s
``cap``   ``N at once``                 never more than N bodies at once; slots handed over
``fair``  ``10/s`` fair by customer     B, sent after A's flood, is served beside it, not behind
                                        it (B's last call starts before A's last); <= 10 a second
``hold``  none (``pool_probe.hold``)    bodies wait in ``BLPOP`` for a plain ``Concurrency``
                                        slot: never more than one at once
========  ============================  ==========================================================

Every task runs exactly once: each ran once, and once all ran nothing of the run's queues is
left on the broker, in a worker (prefetched, an ETA, running) or parked.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from governor import Limiter
from governor.celery.fair.queue import FairQueue
from governor.celery.fair.queue import fair_due_key as fair_index
from governor.celery.waiting.parking import parked_count
from governor.embedded import free_port
from governor.rules import parse_rules

from .brokers import Broker
from .celery_helpers import most_at_once, most_in_window, wait_for
from .worker_nodes import Nodes

SLEEP = 0.2
"""Seconds every body sleeps (by default)."""
RULES = {"rate": "10/s", "park": "2/5s", "fair": "10/s"}
"""The rule of each rate-limited kind."""
FIRST = {"rate": 0, "cap": 1000, "park": 2000, "fair": 3000, "hold": 4000}
"""Each kind's tasks are numbered from here (``n``), the fair tenant B's from 3500."""


@dataclass
class Work:
    """How many tasks of each kind."""

    rate: int = 20
    cap: int = 8
    park: int = 4
    fair: tuple[int, int] = (40, 4)
    """Tenant A's calls, then B's."""
    hold: int = 0

    def numbers(self, kind: str) -> list[int]:
        if kind == "fair":
            a, b = self.fair
            return [FIRST["fair"] + i for i in range(a)] + [3500 + i for i in range(b)]
        return [FIRST[kind] + i for i in range(getattr(self, kind))]


def limits(queues: dict[str, str], cap: int) -> dict[str, Any]:
    """``governor_queues`` for the run's queues."""
    table: dict[str, Any] = {}
    for kind, queue in queues.items():
        if kind in ("rate", "park"):
            table[queue] = RULES[kind]
        elif kind == "fair":
            table[queue] = {"rules": RULES["fair"], "fair_by": "customer"}
        elif kind == "cap":
            table[queue] = {"concurrency": cap}
    return table


@dataclass
class Run:
    nodes: Nodes
    broker: Broker
    queues: dict[str, str]
    work: Work
    cap: int
    prefix: str
    metrics_ports: list[int] = field(default_factory=list)
    started: float = 0.0
    done: float = 0.0

    def store(self) -> redis.Redis:
        return redis.Redis.from_url(self.nodes.env["GT_STORE"])

    def parked(self) -> int:
        client = self.store()
        try:
            return parked_count(client, self.prefix)
        finally:
            client.close()

    def left(self) -> int:
        """Messages of the run still on the broker, held by a worker, or parked."""
        return self.broker.waiting(list(self.queues.values()), self.nodes) + self.parked()

    def by_kind(self, runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {kind: [] for kind in self.queues}
        for r in runs:
            for kind in self.queues:
                if r["n"] in self.numbers[kind]:
                    out[kind].append(r)
        return out

    @property
    def numbers(self) -> dict[str, set[int]]:
        return {kind: set(self.work.numbers(kind)) for kind in self.queues}

    @property
    def total(self) -> int:
        return sum(len(n) for n in self.numbers.values())

    def log(self) -> str:
        return self.nodes.log_text()[-4000:]


def start(
    nodes_factory: Any,
    broker: Broker,
    *,
    pool: str,
    nodes: int,
    concurrency: int,
    cap: int,
    kinds: tuple[str, ...],
    work: Work,
    conf: dict[str, Any] | None = None,
    sleep: float = SLEEP,
    metrics: bool = False,
) -> Run:
    """Start the nodes for a run (the queues are named here and noted for the broker's
    clean-up). ``sleep``: seconds each body sleeps (a pool of few slots needs short bodies to
    have room beyond the limits: the limits, not the pool, must make tasks wait). ``metrics``:
    each node serves governor's metrics on a port of its own, scraped while tasks wait."""
    tag = uuid.uuid4().hex[:8]
    queues = {kind: f"{kind}-{tag}" for kind in kinds}
    if work.hold:
        queues["hold"] = f"hold-{tag}"
    broker.made.extend(queues.values())
    prefix = f"gt{uuid.uuid4().hex[:8]}"
    settings = {
        "imports": ["pool_probe"],
        "governor_prefix": prefix,
        "governor_park_after": 1.0,
        "governor_release_interval": 0.2,
        **broker.conf,
        **(conf or {}),
    }
    group = nodes_factory(limits(queues, cap), broker=broker.url, conf=settings, sleep=sleep)
    ports = [free_port() for _ in range(nodes)] if metrics else []
    for port in ports or [None] * nodes:
        if port is not None:
            served = {"governor_metrics_port": port, "governor_metrics_addr": "127.0.0.1"}
            group.env["GT_CONF"] = json.dumps({**settings, **served})
        group.start(1, concurrency=concurrency, queues=list(queues.values()), pool=pool, timeout=90)
    return Run(group, broker, queues, work, cap, prefix, metrics_ports=ports)


def publish_and_wait(run: Run) -> None:
    """Send the run's tasks, check the parked ones while they wait, wait until every task ran
    and nothing is left anywhere."""
    nodes, work, queues = run.nodes, run.work, run.queues
    run.started = time.time()
    if "cap" in queues:  # first, alone: every pool has more slots than the cap, some wait
        nodes.send(queues["cap"], "worker_app.noop", [(n,) for n in work.numbers("cap")])
        handed = wait_for(lambda: nodes.records("handover"), bool, timeout=30)
        assert handed, f"no slot of the cap was handed over\n{run.log()}"
    # then the parked ones, checked before they are released
    for kind in ("park", "rate", "hold"):
        if kind in queues:
            task = "pool_probe.hold" if kind == "hold" else "worker_app.noop"
            nodes.send(queues[kind], task, [(n,) for n in work.numbers(kind)])
    if "fair" in queues:  # A floods, B comes after: B is served beside A, not behind it
        fair_a, fair_b = work.fair
        a = [("A", FIRST["fair"] + i) for i in range(fair_a)]
        nodes.send(queues["fair"], "worker_app.report", a)
        nodes.send(queues["fair"], "worker_app.report", [("B", 3500 + i) for i in range(fair_b)])
    if "park" in queues:
        check_parked(run)
    for port in run.metrics_ports:  # while tasks wait: a scrape of each node
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        assert "governor_admitted_total" in text, text[:2000]
    runs = wait_for(nodes.runs, lambda r: len(r) >= run.total, timeout=120)
    assert len(runs) >= run.total, f"{len(runs)} of {run.total} ran\n{diagnose(run)}"
    run.done = max(r["t"] for r in runs)
    left = wait_for(run.left, lambda n: n == 0, timeout=60, every=0.5)
    assert left == 0, (
        f"{left} messages left on the broker, in a worker or parked (parked: {run.parked()})\n"
        f"{run.broker.describe(list(run.queues.values()))}\n{diagnose(run)}"
    )


def diagnose(run: Run) -> str:
    """Where the tasks that did not run are (for a failure's message)."""
    nodes = run.nodes
    ran = {r["n"] for r in nodes.runs()}
    missing = {kind: sorted(set(numbers) - ran) for kind, numbers in run.numbers.items()}
    lines = [f"missing: { {k: v for k, v in missing.items() if v} }"]
    for kind, queue in run.queues.items():
        try:
            waiting = run.broker.waiting([queue], nodes)
        except Exception as exc:
            waiting = repr(exc)
        lines.append(f"{kind} ({queue}): {waiting} on the broker or held by a worker")
    client = run.store()
    try:
        lines.append(f"parked: {parked_count(client, run.prefix)}")
        if "cap" in run.queues:
            lim = Limiter(client, None, concurrency=1, name="queue", prefix=run.prefix)
            usage = lim.holders(run.queues["cap"])
            lines.append(f"cap: {len(usage.holders)} holders, {usage.waiting} waiting")
        if "fair" in run.queues:
            for raw in client.zrange(fair_index(run.prefix), 0, -1):
                key = json.loads(raw)
                lim = Limiter(
                    client,
                    key["rules"],
                    algorithm=key["algorithm"],
                    name=key["name"],
                    prefix=run.prefix,
                )
                queue = FairQueue(lim, key["subject"])
                lines.append(f"fair {key['subject']}: waiting {queue.waiting(client)}")
    finally:
        client.close()
    lost = {n for numbers in missing.values() for n in numbers}
    received = [r for r in nodes.records("received") if set(r["args"]) & lost]
    ids = {r["id"] for r in received}
    lines += [f"received {r}" for r in received]
    lines += [f"deferred {d}" for d in nodes.records("deferred") if d["id"] in ids]
    lines += [f"counted {c}" for c in nodes.records("counted") if c["id"] in ids]
    lines.append(run.log())
    return "\n".join(lines)


def check_parked(run: Run) -> None:
    """The two tasks of ``park`` that wait 5 s are parked in Redis, and then neither the broker
    nor a worker holds a message of ``park`` (the two admitted at once have ended)."""
    park = run.queues["park"]
    numbers = set(run.work.numbers("park"))

    def look() -> tuple[int, int, int]:
        ran = {r["id"] for r in run.nodes.runs() if r["n"] in numbers}
        ended = {e["id"] for e in run.nodes.records("ends")}
        if len(ran) < 2 or not ran <= ended:
            return -1, -1, -1
        before = run.parked()
        held = run.broker.waiting([park], run.nodes)
        return before, held, run.parked()

    seen = wait_for(look, lambda v: v == (2, 0, 2), timeout=20, every=0.2)
    assert seen == (2, 0, 2), f"(parked, held, parked) = {seen}\n{run.log()}"


def check(run: Run) -> dict[str, Any]:
    """The promises of the run; returns what was measured (for the row's line)."""
    nodes = run.nodes
    runs = nodes.runs()
    assert not nodes.failures(), nodes.failures()[:3]
    ids = Counter(r["id"] for r in runs)
    twice = [i for i, c in ids.items() if c > 1]
    assert not twice, f"ran twice: {twice}\n{run.log()}"
    kinds = run.by_kind(runs)
    for kind, numbers in run.numbers.items():
        assert sorted(r["n"] for r in kinds[kind]) == sorted(numbers), (kind, run.log())
    out: dict[str, Any] = {"tasks": len(runs), "took": round(run.done - run.started, 1)}
    counted = nodes.records("counted")
    for kind, text in RULES.items():
        if kind not in run.queues:
            continue
        (rule,) = parse_rules(text)
        times = [c["counted"] for c in counted if c["queue"] == run.queues[kind]]
        assert len(times) == len(run.numbers[kind]), (kind, len(times))
        most = most_in_window(times, rule.period)
        starts = most_in_window([r["t"] for r in kinds[kind]], rule.period)
        out[kind] = f"{most}/{rule.limit} counted (bodies {starts})"
        assert most <= rule.limit, f"{kind}: {most} admissions counted in a window of {text}"
    ends = {e["id"]: e for e in nodes.records("ends")}
    if "cap" in run.queues:
        bodies = [ends[r["id"]] for r in kinds["cap"]]
        peak = most_at_once(bodies)
        handovers = len(nodes.records("handover"))
        out["cap"] = f"{peak}/{run.cap} at once, {handovers} hand-overs"
        assert peak <= run.cap, f"{peak} bodies at once under {run.cap} at once"
        assert handovers >= 1, "no slot was handed over"
    if "park" in run.queues:
        # (a booked task that reaches its slot too late, on a loaded machine, books again: a
        # second wait, which the rule allows)
        late = [r for r in kinds["park"] if r["waits"]]
        assert len(late) == 2, kinds["park"]
        parked = {d["id"] for d in nodes.records("deferred") if d["parked"]}
        assert {r["id"] for r in late} <= parked, "a long wait was not parked"
        waits = sorted(r["waits"] for r in late)
        out["park"] += f", 2 parked (waits {waits}), none held"
    if "fair" in run.queues:
        a = max(r["t"] for r in kinds["fair"] if r["customer"] == "A")
        b = max(r["t"] for r in kinds["fair"] if r["customer"] == "B")
        out["fair"] += f", B done {a - b:.1f}s before A"
        assert b < a, f"tenant B's last call started {b - a:.2f}s after A's last"
    if "hold" in run.queues:
        peak = most_at_once([ends[r["id"]] for r in kinds["hold"]])
        out["hold"] = f"{peak}/1 at once"
        assert peak <= 1
    return out
