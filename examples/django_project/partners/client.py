"""A stand-in for the partner's HTTP API (5 calls a second per customer): it keeps what it
received, so the example's tests can look."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class PartnerClient:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.received: list[tuple[float, str, dict[str, Any]]] = []

    def post(self, customer: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.received.append((self.clock(), customer, payload))
        return {"ok": True, "customer": customer}


partner = PartnerClient()
