"""Publishing the messages of waiting tasks that were handed a concurrency slot (see
:mod:`.cap_line`): they go out at once, marked with the moment of the hand-over. One that cannot
be read, or that the broker refuses for good, goes to the dead letters (:mod:`.dead_letters`,
source ``cap:<limit>:<subject>``, or ``cap`` where the caller does not say which cap)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..types import HEADER, Handed
from . import dead_letters
from .envelope import open_envelope

__all__ = ["Handover"]

logger = logging.getLogger("governor.celery")


class Handover:
    """Publishes the messages of waiting tasks that were handed a slot."""

    def __init__(
        self,
        app: Any,
        client: Callable[[], Any] | None = None,
        prefix: str | None = None,
    ) -> None:
        self.app = app
        self.client = client
        """The process's Redis client, for the dead letters (None: log only)."""
        self.prefix = prefix

    def publish(self, handed: Handed | tuple[tuple[str, str], ...], cap: str | None = None) -> int:
        """Publish each (holder, message); returns how many went out. A message that cannot be
        published now (the broker is away) stays handed over in Redis: a sweep publishes it
        again after its lease. One that never can is dead-lettered (``cap``: the cap's
        ``<limit>:<subject>``, when the caller knows it)."""
        from .republish import TRANSIENT  # here: republish imports this module

        sent = 0
        now = time.time()
        for holder, text in handed:
            try:
                sig, _due, _env = open_envelope(self.app, text)
            except Exception as exc:
                self._dead(cap, holder, text, f"unreadable: {exc!r}")
                continue
            headers = dict(sig.options.get("headers") or {})
            carried = headers.get(HEADER)
            headers[HEADER] = {**(carried if isinstance(carried, dict) else {}), "woken": now}
            sig.options["headers"] = headers
            try:
                sig.apply_async()
            except TRANSIENT as exc:
                logger.error(
                    "governor: could not publish %s, handed a slot (a sweep retries it after "
                    "the lease): %r",
                    holder,
                    exc,
                )
                continue
            except Exception as exc:
                self._dead(cap, holder, text, f"cannot publish: {exc!r}")
                continue
            sent += 1
        return sent

    def _dead(self, cap: str | None, holder: str, text: str, reason: str) -> None:
        """Keep a handed-over message that cannot go out in the dead letters. (It stays in the
        cap's line until the line can forget a named entry: a sweep hands it over again after
        the lease, and it is counted again, not duplicated.)"""
        source = f"cap:{cap}" if cap else "cap"
        if self.client is None or self.prefix is None:
            logger.error(
                "governor: cannot publish %s (%s), handed a slot: %s", holder, source, reason
            )
            return
        try:
            dead_letters.put(self.client(), self.prefix, source, holder, text, reason)
        except Exception as exc:  # Redis away: a sweep hands it over again after the lease
            logger.error("governor: could not dead-letter %s (%s): %r", holder, reason, exc)
