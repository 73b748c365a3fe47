"""governor.testing: eager calls with the app's limits applied on a test's clock, or off."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, Task

from governor import GovernorError, GovernorTimeout
from governor.celery import Governor
from governor.celery.task import GovernedMixin
from governor.testing import Clock, Denied, governed
from support.celery_helpers import new_app
from support.servers import ServerHandle


def partner_app(url: str, **conf: Any) -> tuple[Celery, list[str], Any]:
    """An app with a per-key limit (partner-api, 5/s and 20/m per customer), what the task saw."""
    app = new_app(url, "default", **conf)
    governor = Governor(app)
    seen: list[str] = []

    @governor.task(
        "5/s, 20/m",
        key=lambda customer, **_: customer,
        limit_name="partner-api",
        name="shop.call_partner",
        shared=False,
    )
    def call_partner(customer: str) -> str:
        seen.append(customer)
        return customer

    return app, seen, call_partner


def test_a_denied_call_is_recorded_not_run_and_counts_nothing(redis_server: ServerHandle) -> None:
    app, seen, call_partner = partner_app(redis_server.url())
    clock = Clock()
    with governed(app, "apply", clock=clock, redis_url=redis_server.url(4)) as gov:
        results = [call_partner.delay("acme") for _ in range(7)]
        assert [r.state for r in results] == ["SUCCESS"] * 5 + ["IGNORED"] * 2
        assert seen == ["acme"] * 5
        first, second = gov.denials
        assert isinstance(results[5].result, Denied)
        assert (first.limit, first.rule, first.subject, first.task) == (
            "partner-api",
            "5/s",
            "acme",
            "shop.call_partner",
        )
        assert first.retry_after == pytest.approx(1.0) == second.retry_after  # nothing counted
        assert first.at == clock.now and gov.calls[5].denied is first
        assert [c.admitted for c in gov.calls] == [True] * 5 + [False] * 2
        assert gov.calls[0].limits == ("partner-api",)
        gov.assert_admitted(call_partner.s("globex"))  # per key
        clock.advance(0.5)
        gov.assert_denied(call_partner.s("acme"), limit="partner-api", rule="5/s", retry_after=0.5)
        clock.advance(0.5)
        assert call_partner.delay("acme").successful()


def test_assertions_say_what_differs(redis_server: ServerHandle) -> None:
    app, _, call_partner = partner_app(redis_server.url())
    clock = Clock()
    with governed(app, "apply", clock=clock, redis_url=redis_server.url(4)) as gov:
        with pytest.raises(AssertionError, match=r"would be admitted now, not denied"):
            gov.assert_denied(call_partner.s("acme"))
        for _ in range(5):
            call_partner.delay("acme")
        with pytest.raises(AssertionError, match=r"rule 5/s, not rule 20/m.*0\.5s"):
            gov.assert_denied(call_partner.s("acme"), rule="20/m", retry_after=0.5)
        with pytest.raises(AssertionError, match=r"'acme'\) would be denied: .* 5/s"):
            gov.assert_admitted(call_partner.s("acme"))
        # the longer rule names the wait once the shorter one has room
        for _ in range(3):
            clock.advance(1.0)
            for _ in range(5):
                call_partner.delay("acme")
        clock.advance(1.0)
        gov.assert_denied(call_partner.s(customer="acme"), rule="20/m", retry_after=56.0)
        assert gov.check(call_partner.s("globex")) is None


def test_queue_and_task_limits_of_plain_tasks(redis_server: ServerHandle) -> None:
    app = new_app(
        redis_server.url(),
        "default",
        governor_queues={"emails": "2/s"},
        governor_tasks={"shop.report": "1/m"},
        task_routes={"shop.send": {"queue": "emails"}},
    )
    Governor(app)

    @app.task(name="shop.send", shared=False)
    def send(to: str) -> None: ...

    @app.task(name="shop.report", shared=False)
    def report() -> None: ...

    with governed(app, "apply", redis_url=redis_server.url(4)) as gov:
        for _ in range(3):
            send.delay("a")
        report.delay()
        report.delay()
        gov.assert_denied(report, limit="task:shop.report", retry_after=60.0)  # a task: no args
        with pytest.raises(TypeError, match="a task or a signature"):
            gov.check("shop.report")
        send.apply_async(("b",), queue="default")  # routed elsewhere: no queue quota
    assert [(d.limit, d.rule) for d in gov.denials] == [
        ("queue:emails", "2/s"),
        ("task:shop.report", "1/m"),
    ]
    assert gov.calls[-1].admitted and gov.calls[-1].limits == ()


def test_a_concurrency_cap_holds_for_the_body_only(redis_server: ServerHandle) -> None:
    app = new_app(redis_server.url(), "default")
    governor = Governor(app)
    inner: list[Any] = []

    @governor.task(concurrency=1, name="shop.export", shared=False, bind=True)
    def export(self: Task, nested: bool) -> None:
        if nested:  # a second call while this one runs: the cap is full
            inner.append(export.delay(False))

    with governed(app, "apply", redis_url=redis_server.url(4)) as gov:
        assert export.delay(True).successful()
        assert inner[0].state == "IGNORED"
        (denied,) = gov.denials
        assert (denied.limit, denied.capped, denied.rule) == ("task:shop.export", "full", None)
        assert "concurrency cap (full)" in str(denied)
        assert export.delay(False).successful()  # the slot went back when the body ended
        gov.assert_admitted(export.s(False))


def test_what_production_fails_fails(redis_server: ServerHandle) -> None:
    app = new_app(redis_server.url(), "default")
    governor = Governor(app)

    @governor.task("2/s", name="shop.bulk", cost=lambda n, **_: n, shared=False)
    def bulk(n: int) -> None: ...

    @governor.task("1/h", name="shop.slow", max_wait=60, shared=False)
    def slow() -> None: ...

    app.conf.task_eager_propagates = True
    with governed(app, "apply", redis_url=redis_server.url(4)) as gov:
        with pytest.raises(GovernorError, match="costs 3, more than rule 2/s"):
            bulk.delay(3)
        slow.delay()
        with pytest.raises(GovernorTimeout, match="more than governor_max_wait=60"):
            slow.delay()
    assert gov.denials == []


def test_denials_raise_when_asked(redis_server: ServerHandle) -> None:
    app, seen, call_partner = partner_app(redis_server.url())
    with governed(app, "apply", redis_url=redis_server.url(4), on_denied="raise") as gov:
        for _ in range(5):
            call_partner.delay("acme")
        with pytest.raises(Denied, match=r"denied by partner-api \(rule 5/s\)") as info:
            call_partner.delay("acme")
    assert info.value is gov.denials[0] and len(seen) == 5


def test_limits_off_records_and_asks_nothing(redis_server: ServerHandle) -> None:
    app, seen, call_partner = partner_app(redis_server.url())
    with governed(app, "off") as gov:
        for _ in range(9):
            call_partner.delay("acme")
        assert gov.redis_url is None and len(seen) == 9
        assert [c.limits for c in gov.calls] == [("partner-api",)] * 9
        with pytest.raises(RuntimeError, match="limits are off"):
            gov.check(call_partner.s("acme"))


def test_production_paths_are_left_as_they_were(redis_server: ServerHandle) -> None:
    app, seen, call_partner = partner_app(redis_server.url(), task_always_eager=False)
    task = app.tasks["shop.call_partner"]
    before = type(task)
    with governed(app, "apply", redis_url=redis_server.url(4)) as gov:
        assert type(task) is not before and app.conf.task_always_eager
        with pytest.raises(RuntimeError, match="already under governed"), governed(app, "off"):
            pass
        gov.reset()
    assert type(task) is before and issubclass(before, GovernedMixin)
    assert app.conf.task_always_eager is False
    # outside the block an eager call is not governed, as in production
    for _ in range(8):
        assert call_partner.apply(("acme",)).successful()
    assert len(seen) == 8
    assert (
        Governor.find(app) is not None
        and Governor.find(app).gate.admit(  # type: ignore[union-attr]
            task, ("acme",), {}
        )
        is None
    )


def test_reset_forgets_the_counts(redis_server: ServerHandle) -> None:
    app, _, call_partner = partner_app(redis_server.url())
    with governed(app, "apply", redis_url=redis_server.url(4)) as gov:
        for _ in range(6):
            call_partner.delay("acme")
        prefix = gov.prefix
        gov.reset()
        assert gov.prefix != prefix and len(gov.denials) == 1
        gov.assert_admitted(call_partner.s("acme"))


def test_a_private_redis_when_none_is_named(redis_server: ServerHandle) -> None:
    app, _, call_partner = partner_app(redis_server.url())
    with governed(app, "apply") as gov:
        assert gov.redis_url is not None and gov.redis_url != redis_server.url(4)
        for _ in range(6):
            call_partner.delay("acme")
        assert len(gov.denials) == 1


def test_bad_arguments_are_refused(redis_server: ServerHandle) -> None:
    app, _, _ = partner_app(redis_server.url())
    with pytest.raises(ValueError, match="'apply' or 'off'"), governed(app, "on"):  # type: ignore[arg-type]
        pass
    with (
        pytest.raises(ValueError, match="'record' or 'raise'"),
        governed(
            app,
            "off",
            on_denied="sleep",  # type: ignore[arg-type]
        ),
    ):
        pass


def test_the_clock_counts_microseconds_and_moves_forward_only() -> None:
    clock = Clock()
    start = clock.now
    assert start % 86400 == 0
    for _ in range(10):
        clock.advance(0.1)
    assert clock() == start + 1.0
    assert clock.set(start + 2.5) == start + 2.5
    with pytest.raises(ValueError, match="forward only"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="forward only"):
        clock.set(start)
    with pytest.raises(ValueError, match="finite"):
        clock.advance(float("nan"))
