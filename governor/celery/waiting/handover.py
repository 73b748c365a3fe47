"""Publishing the messages of waiting tasks that were handed a concurrency slot (see
:mod:`.cap_line`): they go out at once, marked with the moment of the hand-over.

A waiter's message is published once: governor never sends it again while a copy of it may be
in the broker (a copy delayed past the hand-over's lease keeps its place in line, see
``lua/cap.lua``). A message the broker refuses is known not to be out: it is parked (Redis),
and the releasers publish it when the broker is back (run once: the parking id is claimed).
One that cannot be read stays with its lapsed hand-over for :meth:`~governor.Limiter.leave`.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from ..types import HEADER, Handed
from . import parking
from .envelope import envelope, open_envelope

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..config.store import Store

__all__ = ["Handover"]

logger = logging.getLogger("governor.celery")


class Handover:
    """Publishes the messages of waiting tasks that were handed a slot."""

    def __init__(self, app: Any, store: Store, settings: Settings) -> None:
        self.app = app
        self.store = store
        self.settings = settings

    def publish(self, handed: Handed | tuple[tuple[str, str], ...]) -> int:
        """Publish each (holder, message); returns how many went out (or were parked)."""
        sent = 0
        now = time.time()
        for holder, text in handed:
            try:
                sig, _due, env = open_envelope(self.app, text)
            except Exception as exc:
                logger.error(
                    "governor: the message of %s, handed a slot, cannot be read: its hand-over "
                    "lapses after the lease and stays listed (Limiter.lapsed) until Limiter.leave "
                    "takes it: %r",
                    holder,
                    exc,
                )
                continue
            headers = dict(sig.options.get("headers") or {})
            carried = headers.get(HEADER)
            headers[HEADER] = {**(carried if isinstance(carried, dict) else {}), "woken": now}
            sig.options["headers"] = headers
            try:
                sig.apply_async()
            except Exception as exc:  # not sent: park it for the releasers
                if not self._park(holder, sig, str(env.get("label") or ""), exc):
                    continue
            sent += 1
        return sent

    def _park(self, holder: str, sig: Any, label: str, error: Exception) -> bool:
        settings = self.settings
        parked = parking.new_parking_id(
            f"{sig.id}:handed:{secrets.token_hex(4)}", settings.parking_shards
        )
        carried = sig.options["headers"][HEADER]
        sig.options["headers"][HEADER] = {**carried, "parked": parked}
        try:
            parking.park(
                self.store.client,
                settings.prefix,
                parked,
                time.time(),
                envelope(self.app, sig, time.time(), label),
                settings.park_replicas,
                settings.park_replica_timeout,
            )
        except Exception as exc:
            logger.error(
                "governor: could not publish %s, handed a slot (%r), nor park it (%r): its "
                "hand-over lapses after the lease and stays listed (Limiter.lapsed)",
                holder,
                error,
                exc,
            )
            return False
        logger.warning(
            "governor: could not publish %s, handed a slot: parked for the releasers: %r",
            holder,
            error,
        )
        return True
