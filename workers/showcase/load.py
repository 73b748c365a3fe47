"""The showcase's producer: several of the example apps' limits flooded at once.

=====================  ==========================================================================
limit                  what arrives
=====================  ==========================================================================
queue ``emails``       600 emails at once against 10/s: a minute of bookings ahead
task ``nightly``       a batch of 1000 jobs booked up front under 1/s, 20/m, 200/h, 800/d: most
                       are parked in Redis until nearly due, the last ones tomorrow
``partner-api``        150 calls each for acme and umbrella at once (3/s each: the live
                       limit); globex's and initech's calls come as they happen, 2 a second
                       (:class:`Trickle`); the partner answers globex 429 after 15 calls
queue ``exports``      10 exports of 2 minutes: 3 hold the warehouse's connections, 7 wait in line
``rebuild``            two rebuilds of globex: one runs, one waits for it
queue ``reports``      globex drops 100 reports, then acme 60 and initech 20: they wait in
                       the fair queue, each customer served its share of the 2/s
=====================  ==========================================================================

The example apps read their Redis from the environment at import, so :func:`flood` is called
with the scene's environment and imports them then.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["FLOODED", "Trickle", "flood"]

FLOODED = ("acme", "umbrella")
"""The customers whose partner-API calls arrive all at once."""
HOLD = 120.0
"""Seconds an export or a rebuild holds its slot: longer than the showcase runs."""


def flood(env: Mapping[str, str]) -> dict[str, int]:
    """Send the whole load (see the module's table); how many tasks of each kind."""
    os.environ.update(env)
    from workers import emails, exports, nightly, partner_api, reports
    from workers.app import app  # configured from the environment, at import

    sent: dict[str, Any] = {}
    with app.producer_or_acquire() as producer:
        for n in range(600):
            emails.send_email.apply_async(
                (f"user{n}@example.com", "your weekly summary"), producer=producer
            )
        sent["emails"] = 600
        for n in range(10):
            exports.export_report.apply_async((n,), {"seconds": HOLD}, producer=producer)
        sent["exports"] = 10
        for _ in range(2):
            exports.rebuild_account.apply_async(("globex",), {"seconds": HOLD}, producer=producer)
        sent["rebuilds"] = 2
    sent["partner-api"] = partner_api.enqueue(list(FLOODED), 150)
    sent["reports"] = reports.enqueue({"globex": 100, "acme": 60, "initech": 20})
    sent["nightly"] = nightly.enqueue(1000)
    return sent


class Trickle(threading.Thread):
    """One customer's partner-API calls as they happen, ``per_second``, until :meth:`stop`
    (after :func:`flood`, which configured the app)."""

    def __init__(self, customer: str, per_second: float) -> None:
        super().__init__(name=f"trickle-{customer}", daemon=True)
        self.customer, self.pause = customer, 1.0 / per_second
        self.stopped = threading.Event()
        self.sent = 0

    def run(self) -> None:
        from workers import partner_api
        from workers.app import app

        with app.producer_or_acquire() as producer:
            while not self.stopped.wait(self.pause):  # the pace of the customer's users
                partner_api.call_partner.apply_async(
                    (self.customer, {"n": self.sent}), producer=producer
                )
                self.sent += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)
