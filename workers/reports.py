"""Reports rendered by a shared service that takes 2 a second in all, shared fairly between
customers.

The limit is on the queue (``governor_queues = {"reports": {"rules": "2/s", "fair_by":
"customer", "weights": {"acme": 2}}}`` in :mod:`workers.app`): a customer who drops 60 reports
at once does not make the others wait behind them. Calls the limit denies wait in the queue's
fair queue in Redis, ordered so each customer gets its share of the 2 a second (acme, on a plan
with weight 2, twice the others' while several wait); a customer alone gets all of it. A worker
must consume the queue: ``celery -A workers.app worker -Q celery,emails,exports,reports``.

Rendering is simulated (a short sleep and a log line): these examples make no network calls.

Enqueue reports with ``python -m workers.reports --customers globex=60,acme=10,initech=10``.
"""

from __future__ import annotations

import argparse
import logging
import time

from .app import app

if __name__ == "__main__":  # run the module the app imported: its task exists once, not twice
    from workers.reports import main

    main()
    raise SystemExit(0)

logger = logging.getLogger(__name__)


@app.task(queue="reports", name="workers.reports.build_report")
def build_report(customer: str, report: str) -> None:
    """Render one of ``customer``'s reports (simulated: a short sleep)."""
    time.sleep(0.05)
    logger.info("report %s for %s rendered (simulated)", report, customer)


def enqueue(counts: dict[str, int]) -> int:
    """Enqueue ``counts[customer]`` reports for each customer, one customer after the other
    (the way a customer's batch arrives); returns how many were sent."""
    with app.producer_or_acquire() as producer:
        for customer, count in counts.items():
            for n in range(count):
                build_report.apply_async((customer, f"r{n}"), producer=producer)
    return sum(counts.values())


def parse_counts(text: str) -> dict[str, int]:
    """``"globex=60,acme=10"`` -> ``{"globex": 60, "acme": 10}`` (a bare name: 10 reports)."""
    counts: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = item.partition("=")
        counts[name.strip()] = int(count) if count else 10
    return counts


def main(argv: list[str] | None = None) -> None:
    """Enqueue reports for a few customers (python -m workers.reports)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument(
        "--customers",
        default="globex=60,acme=10,initech=10",
        help="comma-separated CUSTOMER=COUNT (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        counts = parse_counts(args.customers)
    except ValueError:
        parser.error(f"--customers takes CUSTOMER=COUNT,..., got {args.customers!r}")
    if not counts or min(counts.values()) < 1:
        parser.error("--customers needs at least one customer and counts of at least 1")
    sent = enqueue(counts)
    print(f"enqueued {sent} reports for {', '.join(counts)} (2/s shared fairly)")
