"""Calls to a partner's API, limited per customer: 5 a second and 200 an hour each.

The partner meters each customer's account separately, so the limit is per key: the key
function gets the task's arguments by name and returns the customer. Customers do not slow
each other down; a customer over its limit waits for its next free slot (it is re-published to
run then, it does not retry in a loop). Every task sharing ``limit_name="partner-api"`` shares
these per-customer counters::

    governor -A workers.app inspect partner-api acme

The HTTP call is simulated (a short sleep): these examples make no network calls.

Enqueue calls with ``python -m workers.partner_api --customers acme,globex --calls 50``.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from .app import app, governor

if __name__ == "__main__":  # run the module the app imported: its task exists once, not twice
    from workers.partner_api import main

    main()
    raise SystemExit(0)

logger = logging.getLogger(__name__)


@governor.task(
    "5/s, 200/h",
    key=lambda customer_id, **_: customer_id,
    limit_name="partner-api",
    name="workers.partner_api.call_partner",
)
def call_partner(customer_id: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Send ``payload`` to the partner API on behalf of ``customer_id``.

    Simulated: sleeps 20 ms instead of making the request, and returns what a client would.
    """
    started = time.time()
    time.sleep(0.02)  # stands in for the HTTP round trip
    logger.info("partner API call for %s (simulated)", customer_id)
    return {"customer_id": customer_id, "status": 200, "started": started}


def enqueue(customers: list[str], calls: int) -> int:
    """Enqueue ``calls`` partner-API calls for each customer, interleaved; returns how many."""
    with app.producer_or_acquire() as producer:
        for n in range(calls):
            for customer in customers:
                call_partner.apply_async((customer, {"n": n}), producer=producer)
    return calls * len(customers)


def main(argv: list[str] | None = None) -> None:
    """Enqueue partner-API calls for a few customers (python -m workers.partner_api)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--customers", default="acme,globex", help="comma-separated customers")
    parser.add_argument("--calls", type=int, default=50, help="calls per customer")
    args = parser.parse_args(argv)
    customers = [c.strip() for c in args.customers.split(",") if c.strip()]
    sent = enqueue(customers, args.calls)
    print(f"enqueued {sent} partner-API calls for {', '.join(customers)} (5/s each)")
