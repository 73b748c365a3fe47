"""Issue 18's chaos run: capped, paused and parked tasks on two worker nodes, with revokes,
expired tasks, unreadable messages and a broker slower than a slot's lease, all at once.

One queue, ``{"rules": "20/s", "concurrency": 2}``, a 2 s slot lease, waits over 0.5 s parked;
two `celery worker` nodes x 2 prefork processes (tests/support/worker_nodes.py) run 80 no-op
tasks and 20 that call an HTTP upstream allowing 4 calls per 3 s (tests/support/upstream_server.py:
a 429 raises Backoff, which pauses the limit for every node). Bodies last 0.1 s, so that the cap
lets through what the rule does (2 slots of 0.2 s would let 10/s through, and the rule would
never bind). A pause turns the cap's line over: each waiter handed a slot is denied on arrival
and sent back to come when the pause ends (1 to 3 s), so parked after 0.5 s (after 1 s, half
the runs parked nothing). Meanwhile:

- 5 tasks are revoked before they are sent, 5 more while they wait in the cap's line, up to 3
  while they are parked behind a pause, and 5 expire while they wait;
- 3 unreadable entries are parked (the releasers meet them) and 3 put in the cap's line (a
  freed slot is handed to them): at the start, when the broker slows down, at a pause;
- the broker's replies and messages reach the workers 3 s late for 3 s (``Proxy.delay`` in
  tests/support/faults_nodes.py): hand-overs lapse, releases and re-publishes wait.

Then: every task runs at most once, every one neither revoked nor expired exactly once; the
limit never counts more than 20 admissions in a second, never more than 2 bodies run at once;
after the last body the cap has no holder and no waiter within one lease; nothing stays parked
or lapsed in the cap's line, the unreadable entries are dead letters; no task failed.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from celery import Celery

from governor import Limiter
from governor.celery import Governor
from governor.celery.types import handed_by
from governor.celery.waiting import dead_letters, parking
from governor.celery.waiting.envelope import open_envelope
from governor.embedded import EmbeddedRedis
from support.celery_helpers import most_at_once, most_in_window, wait_for
from support.faults_nodes import Proxy, Watch
from support.servers import ServerHandle
from support.upstream_server import upstream
from support.worker_nodes import Nodes

pytestmark = [pytest.mark.worker, pytest.mark.slow]

RATE, CAP, LEASE, BODY = 20, 2, 2.0, 0.1
NOOP, UPSTREAM = "worker_app.noop", "worker_app.upstream"
NOOPS, CALLS = 80, 20
"""No-op tasks, and tasks calling the upstream (every fifth one)."""
QUOTA, QUOTA_WINDOW = 4, 3.0
"""The upstream's quota: 4 calls per 3 s, well below the 4 a second the limit lets through; a
429 names the rest of the window, 1 to 3 s."""
DELAY, DELAY_AT, DELAY_FOR = 3.0, 3.0, 3.0
"""The broker's traffic to the workers is DELAY s late (longer than the lease) for DELAY_FOR s,
from DELAY_AT s after the tasks were sent."""
REVOKE_AT, EXPIRES = 1.0, 2.5
"""When the second revokes are sent, when the expiring tasks expire (s after sending)."""
REVOKED_FIRST = (3, 21, 44, 64, 86)
"""Revoked before they are sent (two of them call the upstream)."""
REVOKED_LATER = (77, 83, 88, 92, 97)
EXPIRING = (76, 81, 87, 91, 96)
"""From the tail of a line kept in arrival order: at most 20 tasks start a second (the rule,
and 2 slots of 0.1 s), so the 76th starts 3.8 s in at the earliest, after the revokes (1 s)
and expiries (2.5 s); they wait in the cap's line or parked until then."""
SETTLE = 2.5
"""Slack over one lease for the sweepers (every 0.2 s) on a loaded machine."""


@dataclass
class Scene:
    """The parts of one run and what it saw."""

    nodes: Nodes
    app: Celery
    """The test's own governed app (the nodes' settings, the broker without the proxy): its
    limiter queues unreadable entries in the cap's line, its hand-over publishes what that
    hands over, its control revokes."""
    watch: Watch
    queue: str
    prefix: str
    ids: list[str]
    revoked: set[str]
    expiring: set[str]
    sent: float = 0.0
    maybe: set[str] = field(default_factory=set)
    """Revoked so close to their start that they may have run (at most once, then)."""
    poison: set[tuple[str, str]] = field(default_factory=set)
    """(dead-letter source, entry) of every unreadable entry put in."""
    delayed: tuple[float, float] = (0.0, 0.0)
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    """(time, live holders of the cap, waiters, parked tasks) over the run."""
    lapsed: set[str] = field(default_factory=set)
    """Holders whose hand-over lapsed (their message came later than a lease), over the run."""
    parked_revoked: int = 0

    @property
    def store(self) -> redis.Redis:
        return self.governor.gate.client

    @property
    def governor(self) -> Governor:
        found = Governor.find(self.app)
        assert found is not None
        return found

    @property
    def cap(self) -> Limiter:
        return self.governor.gate.store.limiter("queue", self.governor.settings.queues[self.queue])

    @property
    def due(self) -> set[str]:
        """The tasks that must run once."""
        return set(self.ids) - self.revoked - self.expiring - self.maybe


def test_chaos_run_on_two_nodes(redis_server: ServerHandle, nodes_factory: Any) -> None:
    queue, prefix, tag = (f"ch-{uuid.uuid4().hex[:6]}", f"gt{uuid.uuid4().hex[:8]}",
                          uuid.uuid4().hex[:6])  # fmt: skip
    queues = {queue: {"rules": f"{RATE}/s", "concurrency": CAP}}
    conf = {
        "governor_prefix": prefix,
        "governor_park_after": 0.5,
        "governor_release_interval": 0.2,
        "governor_concurrency_lease": LEASE,
        "governor_fail_mode": "closed",
    }
    ids = [f"{tag}-{n}" for n in range(NOOPS + CALLS)]
    with EmbeddedRedis() as broker_server, upstream(QUOTA, QUOTA_WINDOW) as up:
        broker, proxy = broker_server.url(1), Proxy(broker_server.port)
        nodes = nodes_factory(queues, broker=f"redis://127.0.0.1:{proxy.port}/1", conf=conf,
                              sleep=BODY)  # fmt: skip
        nodes.env["GT_UPSTREAM"] = up.url
        scene = Scene(
            nodes,
            local_app(broker, nodes.env["GT_STORE"], queues, conf),
            Watch(broker, nodes.env["GT_STORE"], prefix, queue),
            queue,
            prefix,
            ids,
            revoked={ids[n] for n in REVOKED_FIRST + REVOKED_LATER},
            expiring={ids[n] for n in EXPIRING},
        )
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(scene, stop), daemon=True)
        try:
            nodes.start(2, concurrency=2, queues=[queue])
            revoke(scene.app, [ids[n] for n in REVOKED_FIRST])
            scene.sent = send(scene, broker)
            sampler.start()
            scene.poison |= park_poison(scene, tag)
            line_poison(scene, f"{tag}-c0", "{not json")  # at the tail of a long line
            assert len(scene.poison) == 4
            at(scene.sent + REVOKE_AT)
            assert not {r["id"] for r in nodes.runs()} & {ids[n] for n in REVOKED_LATER}
            revoke(scene.app, [ids[n] for n in REVOKED_LATER])
            at(scene.sent + DELAY_AT)
            scene.delayed = proxy.delay(DELAY, DELAY_FOR)
            # while hand-overs lapse, and while the limit is paused (hand-overs denied on
            # arrival): the slot a decision gives up goes to the next in line
            line_poison(scene, f"{tag}-c1", json.dumps({"ct": "text/x-unknown", "b64": False}))
            wait_for(lambda: scene.cap.usage(scene.queue), lambda u: u.paused, 20, every=0.05)
            line_poison(scene, f"{tag}-c2", "[]", timeout=10)
            revoke_parked(scene)
            settle(scene, timeout=150)
            stop.set()
            sampler.join(10)
            check(scene, up)
        finally:
            stop.set()
            proxy.close()
            scene.watch.close()
            scene.app.close()


def local_app(broker: str, store: str, queues: dict[str, Any], conf: dict[str, Any]) -> Celery:
    app = Celery(f"chaos-{uuid.uuid4().hex[:6]}", broker=broker, set_as_current=False)
    app.conf.update(
        governor_redis_url=store, governor_queues=queues, task_ignore_result=True, **conf
    )
    for name in ("worker_app.noop", "worker_app.upstream"):  # names the envelopes give
        app.task(name=name, shared=False)(lambda n: None)
    Governor(app)
    return app


def revoke(app: Celery, ids: list[str]) -> None:
    """Revoke ``ids`` on both nodes, and wait until both said so (a revoke by id is kept in
    each node's memory: one both acknowledged before a copy arrives discards that copy)."""
    replies: list[Any] = []
    deadline = time.monotonic() + 60
    while len(replies) < 2 and time.monotonic() < deadline:
        replies = app.control.revoke(ids, reply=True, timeout=5, limit=2) or []
    assert len(replies) == 2, replies


def send(scene: Scene, broker: str) -> float:
    """In order, every fifth task calling the upstream; EXPIRING ones expire EXPIRES s from
    now. Sent straight to the broker (the proxy is the nodes' way only)."""
    sent = time.time()
    scene.nodes.send(
        scene.queue,
        [UPSTREAM if n % 5 == 4 else NOOP for n in range(len(scene.ids))],
        [(n,) for n in range(len(scene.ids))],
        options=[
            {"task_id": task_id, **({"expires": EXPIRES} if n in EXPIRING else {})}
            for n, task_id in enumerate(scene.ids)
        ],
        broker=broker,
    )
    return sent


def park_poison(scene: Scene, tag: str) -> set[tuple[str, str]]:
    """Unreadable parked entries, due now: not JSON, JSON of another shape, a body whose content
    type the app does not accept."""
    texts = [
        b"\xff\xfe not json",
        json.dumps({"hello": "world"}),
        json.dumps({"ct": "application/x-python-serialize", "enc": "binary", "body": "gASVAA==",
                    "b64": True, "due": 0, "label": "x", "task": NOOP}),
    ]  # fmt: skip
    out = set()
    for i, text in enumerate(texts):
        parking_id = f"poison-{tag}-p{i}"
        parking.park(scene.store, scene.prefix, parking_id, time.time(), text)
        out.add(("parked", parking_id))
    return out


def line_poison(scene: Scene, name: str, text: str, timeout: float = 30.0) -> None:
    """Queue an unreadable entry in the cap's line as soon as it is full or has waiters (a free
    slot with nobody waiting would not queue it), within ``timeout`` s, else not at all; what the
    test's calls hand over is published."""
    lim, handover, holder = scene.cap, scene.governor.gate.handover, f"poison-{name}:0"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waited = lim.wait(scene.queue, holder, text)
        handover.publish(handed_by(lim, scene.queue, waited.handed))
        if waited.status == "queued":
            scene.poison.add((f"cap:queue:{scene.queue}", holder))
            return
        time.sleep(0.01)


def revoke_parked(scene: Scene, most: int = 3, ahead: float = 1.0, timeout: float = 15) -> None:
    """As soon as tasks are parked (behind a pause) to run ``ahead`` s from now or later, revoke
    up to ``most`` of them: they cannot start before both nodes have the revoke (on a machine
    so slow that they could, they may run, at most once)."""

    def parked() -> dict[str, float]:
        due: dict[str, float] = {}
        for env in parking.parked_entries(scene.store, scene.prefix):
            try:
                sig, when, _ = open_envelope(scene.app, json.dumps(env))
            except Exception:  # an unreadable one of the test's
                continue
            if when >= time.time() + ahead and sig.id in scene.due:
                due[sig.id] = when
        return due

    due = wait_for(parked, lambda found: len(found) >= most, timeout, every=0.05)
    chosen = sorted(due, key=due.__getitem__)[-most:]
    if not chosen:
        return
    revoke(scene.app, chosen)
    late = time.time() > min(due[i] for i in chosen) - 0.5  # a body starts at its due time
    (scene.maybe if late else scene.revoked).update(chosen)
    scene.parked_revoked = 0 if late else len(chosen)


def at(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def sample(scene: Scene, stop: threading.Event) -> None:
    """Until ``stop``: every 0.1 s, the cap's live holders and waiters and the parked tasks,
    and which hand-overs lapsed."""
    lim = scene.cap
    while not stop.wait(0.1):
        usage = lim.holders(scene.queue)
        parked = parking.parked_count(scene.store, scene.prefix)
        scene.samples.append((usage.now, usage.held, usage.waiting, parked))
        scene.lapsed |= {holder for holder, _ in lim.lapsed(scene.queue)}


def settle(scene: Scene, timeout: float) -> None:
    """Wait until every task that should run ran and nothing is left anywhere (the broker's
    queue and unacknowledged messages, parked, the cap's holders and line) for a second, and
    the broker's late traffic is out."""
    lim, deadline, quiet = scene.cap, time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        usage = lim.holders(scene.queue)
        idle = scene.watch.left() == 0 and usage.held == 0 and usage.waiting == 0
        if idle and scene.due <= {r["id"] for r in scene.nodes.runs()}:
            quiet = quiet or time.monotonic()
            if time.monotonic() - quiet >= 1.0 and time.time() > scene.delayed[1] + DELAY:
                return
        else:
            quiet = None
        time.sleep(0.1)


def check(scene: Scene, up: Any) -> None:
    nodes, lim = scene.nodes, scene.cap
    runs, ends, log = nodes.runs(), nodes.records("ends"), nodes.log_text()
    ran = [r["id"] for r in runs]
    twice = sorted({i for i in ran if ran.count(i) > 1})
    missing = sorted(scene.due - set(ran))
    never = sorted((scene.revoked | scene.expiring) & set(ran))
    counted = sorted(r["c"] for r in runs if r["c"] is not None)
    last_end = max(e["end"] for e in ends)
    busy_after = [s for s in scene.samples if s[0] >= last_end and (s[1] or s[2])]
    back = max((s[0] for s in busy_after), default=last_end) - last_end
    letters = {(x.source, x.entry) for x in dead_letters.entries(scene.store, scene.prefix)}
    parked = parking.parked_count(scene.store, scene.prefix)
    lapsed = lim.lapsed(scene.queue)
    statuses = up.statuses()
    print(
        f"\nchaos: {len(set(ran) & scene.due)}/{len(scene.due)} ran, {len(twice)} twice, "
        f"{len(missing)} missing; {len(scene.revoked)} revoked ({scene.parked_revoked} while "
        f"parked) and {len(scene.expiring)} expired, {len(never)} of them ran; at most "
        f"{most_in_window(counted, 1.0)}/{RATE} admitted in a second, {most_at_once(ends)}/{CAP} "
        f"at once; {statuses.count(429)} 429s "
        f"of {len(statuses)} calls; parked at most {max(s[3] for s in scene.samples)}, "
        f"{len(scene.lapsed)} hand-overs lapsed (late, or denied on arrival by a pause); broker "
        f"{DELAY:g} s late for {DELAY_FOR:g} s; "
        f"cap idle {back:.2f} s after the last body (lease {LEASE:g} s); "
        f"{len(letters & scene.poison)}/{len(scene.poison)} unreadable dead-lettered "
        f"({sum(1 for p in scene.poison if p[0] != 'parked')} from the cap's line); {parked} "
        f"parked, {len(lapsed)} lapsed at the end; took {last_end - scene.sent:.1f} s "
        f"(logs: /tmp/{nodes.key}-node*.log)"
    )
    assert not nodes.failures(), nodes.failures()[:3]
    assert not twice, (twice, log[-3000:])
    assert not missing, (missing, log[-3000:])
    assert not never, never
    assert len(counted) == len(runs)
    assert most_in_window(counted, 1.0) <= RATE, counted
    assert most_at_once(ends) <= CAP
    assert back <= LEASE + SETTLE, busy_after[-5:]
    assert parked == 0 and scene.watch.left() == 0
    assert lapsed == (), lapsed
    assert scene.poison <= letters, (scene.poison, letters)
    assert statuses.count(429) > 0  # the upstream paused the limit
