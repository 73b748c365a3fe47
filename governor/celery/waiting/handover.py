"""Publishing the messages of waiting tasks that were handed a concurrency slot (see
:mod:`.cap_line`): they go out at once, marked with the moment of the hand-over.

A waiter's message is published once: governor never sends it again while a copy of it may be
in the broker (a copy delayed past the hand-over's lease keeps its place in line, see
``lua/cap.lua``). A message the broker refuses for a passing reason is known not to be out: it
is parked (Redis), and the releasers publish it when the broker is back (run once: the parking
id is claimed). One that cannot be read, or that the broker refuses for good, goes to the dead
letters (:mod:`.dead_letters`, source ``cap:<limit>:<subject>``) and leaves that cap's line at
once, passing the slot on (:meth:`~governor.Limiter.leave`): every hand-over comes with the cap
whose slot it got (:data:`~governor.celery.types.Handed`), whatever freed it (a release, a
sweep, a decision, a refund).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..types import HEADER, TRANSIENT, Cap, Handed, handed_by
from . import dead_letters, parking
from .envelope import envelope, open_envelope

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..config.store import Store

__all__ = ["Cap", "Handover"]

logger = logging.getLogger("governor.celery")


class Handover:
    """Publishes the messages of waiting tasks that were handed a slot."""

    def __init__(self, app: Any, store: Store, settings: Settings) -> None:
        self.app = app
        self.store = store
        self.settings = settings

    def publish(self, handed: Handed) -> int:
        """Publish each (holder, message, cap); returns how many went out (or were parked).
        A slot passed on from a message that cannot go out is published here too, in a loop,
        not by recursion: a line of unreadable messages (``accept_content`` changed under a
        backlog) may pass one slot on hundreds of times."""
        sent = 0
        now = time.time()
        todo = deque(handed)
        while todo:
            holder, text, cap = todo.popleft()
            try:
                sig, _due, env = open_envelope(self.app, text)
            except Exception as exc:
                todo.extend(self._dead(cap, holder, text, f"unreadable: {exc!r}"))
                continue
            headers = dict(sig.options.get("headers") or {})
            carried = headers.get(HEADER)
            headers[HEADER] = {**(carried if isinstance(carried, dict) else {}), "woken": now}
            sig.options["headers"] = headers
            try:
                sig.apply_async()
            except TRANSIENT as exc:  # not sent: park it for the releasers
                if not self._park(holder, sig, str(env.get("label") or ""), exc):
                    continue
            except Exception as exc:  # it never can be sent
                todo.extend(self._dead(cap, holder, text, f"cannot publish: {exc!r}"))
                continue
            sent += 1
        return sent

    def _dead(self, cap: Cap, holder: str, text: str, reason: str) -> Handed:
        """Keep a handed-over message that cannot go out in the dead letters, and take it out
        of its cap's line; returns the waiters the slot went on to (to publish)."""
        lim, subject = cap
        source = f"cap:{lim.name}:{subject}"
        try:
            dead_letters.put(self.store.client, self.settings.prefix, source, holder, text, reason)
        except Exception as exc:  # Redis away: the hand-over lapses after the lease instead
            logger.error("governor: could not dead-letter %s (%s): %r", holder, reason, exc)
            return []
        try:
            left = lim.leave(subject, holder)
        except Exception as exc:  # its hand-over lapses after the lease instead
            logger.warning("governor: %s stays in the line of %s: %r", holder, source, exc)
            return []
        return handed_by(lim, subject, left.handed)

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
