"""Exports against a data warehouse that allows 3 open connections, and account rebuilds that
must never run twice at once for one account.

The warehouse's limit is on the queue (``governor_queues = {"exports": {"rules": "30/m",
"concurrency": 3}}`` in :mod:`workers.app`): every task consumed from ``exports`` holds one of
3 slots while its body runs, and at most 30 start a minute, however many worker processes
consume the queue. A rebuild is capped per account (``concurrency=1`` with a key): two rebuilds
of one account never overlap, rebuilds of different accounts run side by side. Tasks waiting
for a slot wait in Redis, not in a worker, and the one that frees a slot hands it to the next.

Exporting is simulated (a sleep and a log line): these examples make no network calls.
"""

from __future__ import annotations

import logging
import time

from governor.celery import current_permits

from .app import app, governor

logger = logging.getLogger(__name__)


@app.task(queue="exports")
def export_report(report_id: int, seconds: float = 2.0) -> None:
    """Export one report: a long query holding one of the warehouse's 3 connections."""
    fence = current_permits()[0].fence if current_permits() else None
    time.sleep(seconds)  # stands in for the query; the slot is renewed meanwhile
    logger.info("report %s exported (fencing token %s)", report_id, fence)


@governor.task(concurrency=1, key=lambda account_id, **_: account_id, limit_name="rebuild")
def rebuild_account(account_id: str, seconds: float = 1.0) -> None:
    """Rebuild one account's caches: never two at once for the same account."""
    time.sleep(seconds)
    logger.info("account %s rebuilt", account_id)
