"""Publishing the messages of waiting tasks that were handed a concurrency slot (see
:mod:`.waiting`): they go out at once, marked with the moment of the hand-over."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..types import HEADER, Handed
from .envelope import open_envelope

__all__ = ["Handover"]

logger = logging.getLogger("governor.celery")


class Handover:
    """Publishes the messages of waiting tasks that were handed a slot."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def publish(self, handed: Handed | tuple[tuple[str, str], ...]) -> int:
        """Publish each (holder, message); returns how many went out. A message that cannot be
        published stays handed over in Redis: a sweep publishes it again after its lease."""
        sent = 0
        now = time.time()
        for holder, text in handed:
            try:
                sig, _due, _env = open_envelope(self.app, text)
                headers = dict(sig.options.get("headers") or {})
                carried = headers.get(HEADER)
                headers[HEADER] = {**(carried if isinstance(carried, dict) else {}), "woken": now}
                sig.options["headers"] = headers
                sig.apply_async()
                sent += 1
            except Exception as exc:
                logger.error(
                    "governor: could not publish %s, handed a slot (a sweep retries it after "
                    "the lease): %r",
                    holder,
                    exc,
                )
        return sent
