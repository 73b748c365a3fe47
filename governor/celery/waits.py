"""What a governed task carries between waits, and what the gate raises to stop it.

The ``governor`` message header (:class:`WaitState`) travels with every re-published, parked
and released copy of a governed task: how often it waited, since when, its bookings, and the
parking id and release token that let a consumer drop a second copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import Ignore

__all__ = ["HEADER", "Deferred", "Duplicate", "WaitState"]

HEADER = "governor"
"""The message header a governed task carries between waits."""


class Duplicate(Ignore):  # type: ignore[misc]
    """A second copy of a released parked task: dropped (the first copy runs)."""


class Deferred(Ignore):  # type: ignore[misc]
    """Raised after a governed task was re-published to run later (Celery acks the original)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"Deferred({self.message!r})"


@dataclass(slots=True)
class WaitState:
    """What a task carries between governance waits (the ``governor`` message header)."""

    waits: int = 0
    since: float | None = None
    """Server time of the first deferral."""
    slots: dict[str, list[int]] | None = None
    """Bookings by state key: [start_us, end_us]."""
    outages: int = 0
    parked: str | None = None
    """The parking id a released message carries until a consumer claims it."""
    release: str | None = None
    """The token of the release that published this copy (see ``parking.stamp_release``)."""
    woken: float | None = None
    """When a concurrency slot was handed to this waiting copy (Unix seconds), until it starts."""
    fair: str | None = None
    """The fair-queue entry a copy sent on from a fair queue claims on arrival."""
    tag: float | None = None
    """Its place in the fair queue (kept if it must wait again)."""
    fair_waited: bool = field(default=False, compare=False)
    """This copy already waited in the pool for its room (not carried in the header)."""

    @classmethod
    def from_request(cls, request: Any) -> WaitState:
        raw = (getattr(request, "headers", None) or {}).get(HEADER)
        if not isinstance(raw, Mapping):
            return cls()
        slots = raw.get("slots")
        return cls(
            waits=int(raw.get("waits") or 0),
            since=raw.get("since"),
            slots=dict(slots) if isinstance(slots, Mapping) else None,
            outages=int(raw.get("outages") or 0),
            parked=raw.get("parked"),
            release=raw.get("release"),
            woken=raw.get("woken"),
            fair=raw.get("fair"),
            tag=raw.get("tag"),
        )

    def header(self) -> dict[str, Any]:
        return {
            "waits": self.waits,
            "since": self.since,
            "slots": self.slots,
            "outages": self.outages,
            "parked": self.parked,
            "release": self.release,
            "woken": self.woken,
            "fair": self.fair,
            "tag": self.tag,
        }
