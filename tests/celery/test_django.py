"""The Django example (examples/django_project): Celery reads governor's settings from Django's
through the ``CELERY_`` namespace, a bad one fails at finalize naming it as written, and a
governed task runs under its limits on a real worker and under the testing kit."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from governor import ConfigError
from governor.celery import Governor
from governor.testing import Clock, governed
from support.celery_helpers import most_in_window, wait_for, worker
from support.servers import ServerHandle

django = pytest.importorskip("django")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django_project"


@pytest.fixture(scope="module")
def project(redis_server: ServerHandle) -> Iterator[Any]:
    """The example's Celery app, its settings loaded by Django (once per process), on the
    suite's Redis, with a queue and a key prefix of this run's."""
    saved = {k: os.environ.get(k) for k in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    if "mysite" not in sys.modules:
        os.environ["REDIS_URL"] = redis_server.base_url
        os.environ["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
        sys.path.insert(0, str(EXAMPLE))
        django.setup()
    from celery import _state

    before = set(_state._on_app_finalizers)
    import partners.tasks  # noqa: F401  (as a view or the worker would)
    from mysite.celery import app

    if not app.finalized:
        app.conf.update(
            task_default_queue=f"dj-{uuid.uuid4().hex[:8]}",
            governor_prefix=f"gt{uuid.uuid4().hex[:8]}",
            worker_hijack_root_logger=False,
            broker_connection_retry_on_startup=True,
        )
        app.finalize()
    yield app
    # @shared_task registers its task with every app made from now on: the suite's other apps
    # must not get the example's tasks (they name limits like "partner-api" too)
    _state._on_app_finalizers.difference_update(set(_state._on_app_finalizers) - before)
    for key, value in saved.items():  # subprocesses of later tests must not load the example
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_governor_reads_the_celery_namespace(project: Any) -> None:
    settings = Governor.find(project).settings  # type: ignore[union-attr]
    assert settings.queues["emails"].text == "10/s, 800/d"
    assert settings.tasks["partners.tasks.nightly_report"].text == "1/m"
    assert settings.max_wait == 3600.0
    assert settings.redis_url == f"{os.environ['REDIS_URL']}/1"
    assert "partners.tasks.sync_customer" in project.tasks


def test_a_bad_setting_fails_at_finalize_named_as_written(
    project: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from celery import Celery
    from django.test import override_settings

    bad = {"CELERY_GOVERNOR_QUEUES": {"emails": "ten a second"}, "CELERY_GOVERNOR_QUEUS": {}}
    with override_settings(**bad), caplog.at_level(logging.WARNING, "governor.celery"):
        app = Celery("bad", set_as_current=False)
        app.config_from_object("django.conf:settings", namespace="CELERY")
        Governor(app)
        with pytest.raises(ConfigError) as info:
            app.finalize()
    message = str(info.value)
    assert "governor_queues['emails']" in message and "'ten a second'" in message
    assert "(set as CELERY_GOVERNOR_QUEUES)" in message
    assert (
        "unknown setting CELERY_GOVERNOR_QUEUS is ignored; did you mean CELERY_GOVERNOR_QUEUES?"
        in (caplog.text)
    )


@pytest.mark.worker
def test_a_governed_task_on_a_real_worker(project: Any) -> None:
    from partners.client import partner
    from partners.tasks import sync_customer

    partner.received.clear()
    with worker(project, [project.conf.task_default_queue]):
        for i in range(8):
            sync_customer.delay("acme", {"i": i})
        received = wait_for(lambda: list(partner.received), lambda r: len(r) >= 8, timeout=20)
    assert sorted(p["i"] for _, _, p in received) == list(range(8))
    starts = [t for t, _, _ in received]
    assert most_in_window(starts, 1.0) <= 5 + 1  # 5/s per customer, one more on a window edge
    assert max(starts) - min(starts) >= 0.9  # the last three waited for the next second


def test_with_the_testing_kit(project: Any, redis_server: ServerHandle) -> None:
    from partners.tasks import nightly_report, send_receipt, sync_customer

    clock = Clock()
    with governed(project, "apply", clock=clock, redis_url=redis_server.url(4)) as gov:
        for _ in range(6):
            sync_customer.delay("acme", {})
        for _ in range(11):
            send_receipt.delay("a@example.com")  # routed to "emails" by CELERY_TASK_ROUTES
        nightly_report.delay()
        nightly_report.delay()
        gov.assert_denied(sync_customer.s("acme", {}), limit="partner-api", retry_after=1.0)
    assert [(d.limit, d.rule) for d in gov.denials] == [
        ("partner-api", "5/s"),
        ("queue:emails", "10/s"),
        ("task:partners.tasks.nightly_report", "1/m"),
    ]
