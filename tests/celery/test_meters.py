"""Limits with meters in Celery (issue 19): costs per meter, settle, learned estimates, observe,
Backoff's headers. A real worker (threads pool, in process) and the suite's Redis."""

from __future__ import annotations

import itertools
import pickle
import time
import uuid
from typing import Any

import pytest
from celery import Task

from governor import Limiter
from governor.celery import Backoff, GovernedTask, Governor, learned, observe, settle
from governor.celery.metering.learned import totals_key
from support.celery_helpers import Recorder, config_error, new_app, wait_for, worker
from support.servers import ServerHandle

METERS = {"requests": "50/m", "tokens": "10000/m"}


def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


def used(app: Any, name: str, subject: str, meters: dict[str, str] = METERS) -> dict[str, int]:
    """Units each meter's (first) rule counts now for ``subject``."""
    import redis

    lim = Limiter(
        redis.Redis.from_url(app.conf.governor_redis_url),
        meters,
        name=name,
        prefix=app.conf.governor_prefix,
    )
    out: dict[str, int] = {}
    for r in lim.usage(subject).rules:
        assert r.meter is not None
        out.setdefault(r.meter, r.used)
    return out


# -- configuration ---------------------------------------------------------------------------


def test_meters_are_read_from_every_place_a_limit_is(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: {"rules": METERS}},
        governor_tasks={"t.whole": {"rules": {"tokens": "100/s"}, "concurrency": 2}},
    )
    gov = Governor(app)

    @app.task(
        base=GovernedTask,
        shared=False,
        name="t.keyed",
        governor_limit={"requests": "5/s", "tokens": "900/m, 9000/d"},
        governor_key=lambda org, **_: org,
    )
    def keyed(org: str) -> None: ...

    app.finalize()
    s = gov.settings
    assert s.queues[q].meters[1][0] == "tokens" and len(s.queues[q].rules) == 2
    assert s.tasks["t.whole"].concurrency == 2
    assert "tokens: 900/m, 9000/d" in gov.gate.calls.options(app.tasks["t.keyed"]).key_config.text  # type: ignore[union-attr]


def test_meters_outside_rules_and_adaptive_meters_are_refused(redis_server: ServerHandle) -> None:
    text = config_error(redis_server.url(), governor_queues={"q": METERS})
    assert "rules per meter go under 'rules'" in text
    text = config_error(
        redis_server.url(), governor_queues={"q": {"rules": METERS, "adaptive": True}}
    )
    assert "adaptive" in text
    text = config_error(redis_server.url(), governor_queues={"q": {"rules": {"tok ens": "5/s"}}})
    assert "meter name" in text


# -- a worker ----------------------------------------------------------------------------------


def test_settle_gives_the_unused_reservation_back_once(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(
        bind=True,
        base=GovernedTask,
        shared=False,
        name=f"t.complete.{q}",
        governor_limit=METERS,
        governor_key=lambda org, **_: org,
        governor_cost=lambda org, max_tokens, real, **_: {"requests": 1, "tokens": max_tokens},
    )
    def complete(self: Task, org: str, max_tokens: int, real: int | None) -> None:
        first = second = {}
        if real is not None:
            first = settle(self, tokens=real)
            second = settle(self, {"tokens": real})  # once: nothing more
        rec.add(
            org=org,
            first={k: [v.status, list(v.given_back)] for k, v in first.items()},
            second=len(second),
        )

    with worker(app, [q], concurrency=2):
        complete.delay("org-a", 3000, 700)
        complete.delay("org-b", 3000, None)  # never settles: the estimate stands
        complete.delay("org-c", 1000, 1600)  # used more than estimated: the overrun counts
        seen = rec.wait(3, timeout=20)
    by = {r["org"]: r for r in seen}
    name = f"t.complete.{q}"
    assert by["org-a"]["first"] == {name: ["settled", [0, 2300]]}
    assert used(app, name, "org-a") == {"requests": 1, "tokens": 700}
    assert used(app, name, "org-b") == {"requests": 1, "tokens": 3000}
    assert used(app, name, "org-c") == {"requests": 1, "tokens": 1600}
    totals = _totals(app)
    assert totals[f"tokens|reserved|{name}"] == 7000
    assert totals[f"tokens|settled|{name}"] == 2300
    assert totals[f"tokens|refunded|{name}"] == 2300
    assert totals[f"tokens|overrun|{name}"] == 600
    assert totals[f"tokens|unsettled|{name}"] == 1


def _totals(app: Any) -> dict[str, int]:
    import redis

    client = redis.Redis.from_url(app.conf.governor_redis_url)
    raw = client.hgetall(totals_key(app.conf.governor_prefix))
    return {k.decode(): int(v) for k, v in raw.items()}


def test_every_meter_must_admit_the_whole_reservation(redis_server: ServerHandle) -> None:
    """Tokens run out before requests do: the next call waits until the token window has room
    for all of it, on the queue's meters (``{"rules": ...}``)."""
    q = queue_name()
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: {"rules": {"requests": "100/s", "tokens": "1000/2s"}}},
    )
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(bind=True, shared=False, governor_cost={"requests": 1, "tokens": 400})
    def call(self: Task, n: int) -> None:
        rec.add(n=n)

    with worker(app, [q], concurrency=2):
        start = time.time()
        for n in range(5):
            call.delay(n)
        seen = rec.wait(5, timeout=20)
    starts = sorted(r["t"] - start for r in seen)
    assert len(starts) == 5
    # two fit in each 2 s window (800 of 1000 tokens), never three
    assert starts[2] >= 1.9 and starts[4] >= 3.9, starts


def test_a_reservation_no_rule_can_admit_fails_at_once(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    Governor(app)
    rec = Recorder(redis_server.url())
    failed: list[str] = []

    @app.task(
        bind=True,
        base=GovernedTask,
        shared=False,
        governor_limit=METERS,
        governor_cost=lambda tokens, **_: {"requests": 1, "tokens": tokens},
    )
    def call(self: Task, tokens: int) -> None:
        rec.add(tokens=tokens)

    from celery.signals import task_failure

    def on_failure(sender: Any = None, exception: Any = None, **_: Any) -> None:
        failed.append(str(exception))

    task_failure.connect(on_failure, weak=False)
    try:
        with worker(app, [q], concurrency=1):
            call.delay(20_000)
            call.delay(5)
            seen = rec.wait(1, timeout=20)
            wait_for(lambda: failed, lambda f: len(f) >= 1, timeout=10)
    finally:
        task_failure.disconnect(on_failure)
    assert [r["tokens"] for r in seen] == [5]
    assert len(failed) == 1 and "20000 units of meter 'tokens'" in failed[0], failed
    assert "can ever admit" in failed[0]


def test_learned_estimates_follow_what_the_task_used(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q, governor_learned_percentile=0.9)
    gov = Governor(app)
    rec = Recorder(redis_server.url())
    name = f"t.learn.{q}"

    @app.task(
        bind=True,
        base=GovernedTask,
        shared=False,
        name=name,
        governor_limit={"requests": "1000/m", "tokens": "10000000/m"},
        governor_cost=lambda max_tokens, **_: {
            "requests": 1,
            "tokens": learned(max_tokens, most=max_tokens),
        },
    )
    def call(self: Task, max_tokens: int, real: int) -> None:
        reserved = dict(gov.gate.reservations.of(self.request.id).cost)  # type: ignore[union-attr]
        settle(self, tokens=real)
        rec.add(reserved=reserved["tokens"])

    with worker(app, [q], concurrency=1):
        for i in range(30):  # uses 10 % to 19 % of max_tokens, one outlier
            call.delay(1000, 2000 if i == 3 else 100 + 3 * i)
            rec.wait(i + 1, timeout=10)
        call.delay(4000, 100)
        seen = rec.wait(31, timeout=20)
    reserved = [r["reserved"] for r in seen]
    assert reserved[:10] == [1000] * 10  # too little history: the default
    # then the 90th percentile of use/default, the outlier ignored, never above most
    assert all(100 <= r <= 200 for r in reserved[10:30]), reserved
    assert reserved[29] >= 150  # it follows the uses as they grow
    assert 600 <= reserved[30] <= 800, reserved  # in proportion to its own default


def test_observe_charges_what_another_client_spent(redis_server: ServerHandle) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    Governor(app)
    rec = Recorder(redis_server.url())
    name = f"t.obs.{q}"

    @app.task(
        bind=True,
        base=GovernedTask,
        shared=False,
        name=name,
        governor_limit=METERS,
        governor_key=lambda org, **_: org,
        governor_cost={"requests": 1, "tokens": 500},
    )
    def call(self: Task, org: str, headers: Any) -> None:
        charged = observe(self, headers)
        rec.add(org=org, charged=charged)

    with worker(app, [q], concurrency=1):
        call.delay(
            "org-a",
            {
                "x-ratelimit-limit-tokens": "10000",
                "x-ratelimit-remaining-tokens": "6000",
                "x-ratelimit-reset-tokens": "30s",
                "x-ratelimit-remaining-requests": "49",
            },
        )
        call.delay("org-b", {"x-ratelimit-remaining-tokens": "not a number"})
        call.delay("org-c", "not headers at all")
        seen = rec.wait(3, timeout=20)
    by = {r["org"]: r["charged"] for r in seen}
    assert by["org-a"] == {name: {"tokens": 3500, "requests": 0}}
    assert used(app, name, "org-a") == {"requests": 1, "tokens": 4000}
    assert by["org-b"] == {} and by["org-c"] == {}


def test_a_backoff_gives_the_reservation_back_and_syncs_its_headers(
    redis_server: ServerHandle,
) -> None:
    q = queue_name()
    app = new_app(redis_server.url(), q)
    Governor(app)
    rec = Recorder(redis_server.url())
    name = f"t.bo.{q}"

    class Response:
        status_code = 429
        headers = {
            "retry-after-ms": "300",
            "x-ratelimit-remaining-tokens": "2000",
            "x-ratelimit-reset-tokens": "20s",
        }

    exc = Backoff.from_response(Response())
    assert exc.quotas["tokens"].remaining == 2000
    assert pickle.loads(pickle.dumps(exc)).quotas == exc.quotas

    @app.task(
        bind=True,
        base=GovernedTask,
        shared=False,
        name=name,
        governor_limit=METERS,
        governor_key=lambda org, **_: org,
        governor_cost={"requests": 1, "tokens": 1500},
    )
    def call(self: Task, org: str) -> None:
        waits = ((self.request.headers or {}).get("governor") or {}).get("waits", 0)
        if waits == 0:
            raise Backoff.from_response(Response())
        rec.add(org=org, waits=waits, used=used(app, name, org))

    with worker(app, [q], concurrency=1):
        call.delay("org-a")
        seen = rec.wait(1, timeout=20)
    assert len(seen) == 1 and seen[0]["waits"] >= 1
    # the refused call's 1500 went back; the upstream's 2000 left charged 8000; the run
    # after the pause reserved its 1500 on top
    assert seen[0]["used"] == {"requests": 1, "tokens": 9500}


@pytest.mark.parametrize("cost", [{"tokens": 5, "typo": 1}, {"requests": 1}])
def test_a_cost_that_misses_a_meter_says_so(redis_server: ServerHandle, cost: Any) -> None:
    from governor.celery.metering.costs import check
    from governor.celery.types import LimitSpec
    from governor.errors import CostError

    app = new_app(redis_server.url(), "q", governor_queues={"q": {"rules": {"tokens": "9/s"}}})
    gov = Governor(app)
    app.finalize()
    spec = LimitSpec("queue", "queue", gov.settings.queues["q"], "q")
    lim = gov.gate.store.limiter("queue", spec.config)
    with pytest.raises(CostError) as info:
        check("t", cost, [(lim, spec)])
    assert "typo" in str(info.value) or "names none of the meters" in str(info.value)


def test_meters_with_a_cap_and_with_fair_sharing(redis_server: ServerHandle) -> None:
    """A limit with meters keeps what limits have: a concurrency cap (one call at a time, the
    unused tokens still given back), and fair sharing between tenants (every call runs)."""
    capped, fair = queue_name(), queue_name()
    app = new_app(
        redis_server.url(),
        capped,
        governor_queues={
            capped: {"rules": {"requests": "100/s", "tokens": "5000/m"}, "concurrency": 1},
            fair: {"rules": {"requests": "100/s", "tokens": "3000/2s"}, "fair_by": "org"},
        },
    )
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(
        bind=True,
        shared=False,
        governor_cost=lambda org, **_: {"requests": 1, "tokens": 1000},
    )
    def call(self: Task, org: str, n: int) -> None:
        start = time.time()
        time.sleep(0.1)
        settle(self, tokens=100)
        rec.add(org=org, n=n, start=start, end=time.time())

    with worker(app, [capped, fair], concurrency=4):
        for n in range(6):
            call.apply_async(("org-a", n), queue=capped)
        for n in range(8):
            call.apply_async(("org-b" if n % 4 else "org-c", n), queue=fair)
        seen = rec.wait(14, timeout=40)
    assert len(seen) == 14
    on_cap = sorted((r["start"], r["end"]) for r in seen if r["org"] == "org-a")
    assert all(a[1] <= b[0] + 0.01 for a, b in itertools.pairwise(on_cap)), on_cap
    # 6 calls of 1000 tokens under 5000/m ran within seconds: each gave 900 back
    assert max(e for _, e in on_cap) - min(s for s, _ in on_cap) < 10
    fair_runs = [r for r in seen if r["org"] != "org-a"]
    assert {r["org"] for r in fair_runs} == {"org-b", "org-c"}
