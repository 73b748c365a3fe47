"""Emails, sent through a provider that allows 10 a second and 800 a day for the account.

The quota is on the queue (``governor_queues = {"emails": "10/s, 800/d"}`` in
:mod:`workers.app`), so it covers every task a worker consumes from ``emails``: both tasks
below are plain ``@app.task`` functions routed there, and they share the 10/s. A worker must
consume the queue: ``celery -A workers.app worker -Q celery,emails``.

Sending is simulated (a short sleep and a log line): these examples make no network calls.
"""

from __future__ import annotations

import logging
import time

from .app import app

logger = logging.getLogger(__name__)


@app.task(queue="emails")
def send_email(to: str, subject: str, body: str = "") -> None:
    """Send one email (simulated: stands in for the provider's API call)."""
    time.sleep(0.005)
    logger.info("email to %s: %s (simulated)", to, subject)


@app.task(queue="emails")
def send_digest(to: str, items: list[str]) -> None:
    """Send a digest of ``items``: one more email, under the same queue quota."""
    send_email.run(to, f"{len(items)} updates", "\n".join(items))
