"""The app's tasks. ``@shared_task`` needs no import of mysite.celery (no import cycle); the
base class and ``governor_*`` options give a task its own limits."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from governor.celery import GovernedTask

from .client import partner


@shared_task(
    base=GovernedTask,
    name="partners.tasks.sync_customer",
    governor_limit="5/s, 200/h",
    governor_key=lambda customer, **_: customer,
    governor_name="partner-api",
)
def sync_customer(customer: str, payload: dict[str, Any]) -> dict[str, Any]:
    return partner.post(customer, payload)


@shared_task(name="partners.tasks.send_receipt")  # the "emails" queue's quota (settings.py)
def send_receipt(to: str) -> str:
    return f"receipt sent to {to}"


@shared_task(name="partners.tasks.nightly_report")  # CELERY_GOVERNOR_TASKS: once a minute
def nightly_report() -> str:
    return "report"
