"""Calls to a partner's API, limited per customer: 5 a second and 200 an hour each.

The partner meters each customer's account separately, so the limit is per key: the key
function gets the task's arguments by name and returns the customer. Customers do not slow
each other down; a customer over its limit waits for its next free slot (it is re-published to
run then, it does not retry in a loop). Every task sharing ``limit_name="partner-api"`` shares
these per-customer counters::

    governor -A workers.app inspect partner-api acme

The HTTP call is simulated (a short sleep) unless ``PARTNER_API_URL`` names a partner to call:
then each call is a POST to ``PARTNER_API_URL/customers/CUSTOMER/calls``, and an answer of 429
or 503 raises :meth:`Backoff.from_response <governor.celery.Backoff.from_response>`, which
pauses that customer's calls on every worker until the moment its ``Retry-After`` names (the
other customers go on). ``python -m workers.showcase`` plays such a partner on loopback.

Enqueue calls with ``python -m workers.partner_api --customers acme,globex --calls 50``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from governor.celery import Backoff

from .app import app, governor

if __name__ == "__main__":  # run the module the app imported: its task exists once, not twice
    from workers.partner_api import main

    main()
    raise SystemExit(0)

logger = logging.getLogger(__name__)

PARTNER_API_URL = os.environ.get("PARTNER_API_URL", "").rstrip("/")
"""The partner's base URL (``http://127.0.0.1:8080/v1``); empty: the calls are simulated."""
MAX_ANSWER = 64 * 1024
"""The most of an answer's body read: it comes from outside."""


@governor.task(
    "5/s, 200/h",
    key=lambda customer_id, **_: customer_id,
    limit_name="partner-api",
    name="workers.partner_api.call_partner",
)
def call_partner(customer_id: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Send ``payload`` to the partner API on behalf of ``customer_id``.

    Simulated (a 20 ms sleep, and what a client would return) unless ``PARTNER_API_URL`` is set.
    """
    started = time.time()
    if not PARTNER_API_URL:
        time.sleep(0.02)  # stands in for the HTTP round trip
        logger.info("partner API call for %s (simulated)", customer_id)
        return {"customer_id": customer_id, "status": 200, "started": started}
    status = post(customer_id, payload or {})
    logger.info("partner API call for %s: HTTP %d", customer_id, status)
    return {"customer_id": customer_id, "status": status, "started": started}


def post(customer_id: str, payload: dict[str, Any]) -> int:
    """POST ``payload`` to the partner for ``customer_id``; its HTTP status. A 429 or 503
    raises :class:`Backoff` from the answer's headers (``Retry-After`` and the like)."""
    url = f"{PARTNER_API_URL}/customers/{urllib.parse.quote(customer_id, safe='')}/calls"
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read(MAX_ANSWER)
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        with refused:
            if refused.code in (429, 503):  # the partner's quota for this customer: pause it
                raise Backoff.from_response(refused) from None
            raise


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
