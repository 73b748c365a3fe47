"""The fair dispatcher: a thread in every worker's main process that sends on the calls waiting
in fair queues (see :mod:`.sharing`), lowest tag first, as their limit has room.

While calls wait, for each fair limit with calls waiting (``<prefix>:{fair}:due``) it asks the
limit how much room it has now (a peek) and takes that many calls, less those sent on and not
yet arrived, in one script; then it publishes them. It looks again after :data:`INTERVAL`, or
sooner, when the limit said it frees room for the next call (so a slot's reuse lags only by
the trip of its message, not by the look). Several workers' dispatchers may
run at once: a take is atomic, so a call is taken once (and, if its sender dies, taken again
when its lease runs out, the copy that arrives second being dropped). A limit whose queue has
been empty for a minute leaves the index.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
import time
from typing import Any

from ..config.limit_config import limit_config
from ..config.settings import Settings
from ..config.store import Store
from ..types import HEADER
from ..waiting.envelope import open_envelope
from .queue import FairQueue, fair_due_key

__all__ = ["INTERVAL", "FairDispatcher"]

logger = logging.getLogger("governor.celery")
INTERVAL = 0.05
"""Seconds between looks while calls wait, at most: a look whose limit had no room looks again
when the limit says it will have (each look costs a peek and a take per fair limit)."""
IDLE = 0.5
"""Seconds between looks at the index while no call waits."""
AHEAD = 0.05
"""A call is sent on up to this long before the limit frees room for it, due then (an ETA the
worker keeps, not a pool process): it starts about when the room frees, waiting in the pool
process for what is left, if anything (see ``Fairness.sent_early``)."""
MIN_WAIT = 0.005
"""The shortest pause between looks (when the limit frees room that soon)."""
PACE = 0.25
"""A look sends on at most what the limit's slowest rule admits in this many seconds: a window
that opens all at once is handed out over a few looks, so a tenant arriving meanwhile gets
its turn in it."""
FORGET_AFTER = 60.0
"""A fair limit leaves the index after its queue stayed empty this long."""


def pace(queue: FairQueue) -> int:
    """At most this many calls a look (see :data:`PACE`)."""
    rules = queue.limiter.rules
    rate = min(r.limit / r.period for r in rules) if rules else 1.0
    return max(1, math.ceil(rate * PACE))


class FairDispatcher:
    """Sends on calls from fair queues. One per worker (main process)."""

    def __init__(self, app: Any, store: Store, settings: Settings, batch: int = 200) -> None:
        self.app = app
        self.store = store
        self.settings = settings
        self.batch = batch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def dispatch_once(self, now: float | None = None) -> tuple[int, int, float]:
        """One look at every fair limit: (calls sent on, calls still waiting, seconds until
        the next look could send one). ``now``: Unix seconds for tests (None: Redis's clock)."""
        client = self.store.client
        key = fair_due_key(self.settings.prefix)
        sent = waiting = 0
        wake = INTERVAL
        listed: list[tuple[Any, float]] = list(client.zrange(key, 0, -1, withscores=True))  # type: ignore[arg-type]
        for raw, seen in listed:
            try:
                queue = self._queue(raw)
            except Exception as exc:  # not ours to read: leave it, say so once a look
                logger.warning("governor: unreadable fair-queue entry %r: %r", raw, exc)
                continue
            d = queue.limiter.peek(queue.subject, now=now)
            room = min(d.remaining, pace(queue)) if d.allowed else 0
            eta = 0.0
            if not room and d.blocked is None and d.retry_after <= AHEAD:
                room, eta = 1, d.retry_after  # sent now, due when the limit frees room
            left, flying, taken = queue.take(client, room, self.batch, now=now)
            for member, text, _ in taken:
                sent += self._send(member, text, eta)
            waiting += left
            if left and not room:  # look again when the limit has room for the next one
                wake = min(wake, max(MIN_WAIT, d.retry_after - AHEAD))
            if left == 0 and flying == 0 and seen < (now or time.time()) - FORGET_AFTER:
                client.zrem(key, raw)
        return sent, waiting, wake

    def _queue(self, raw: Any) -> FairQueue:
        desc = json.loads(raw)
        config = limit_config(
            {"rules": desc["rules"], "algorithm": desc["algorithm"]},
            self.settings.algorithm,
            "fair queue",
        )
        return FairQueue(self.store.limiter(str(desc["name"]), config), str(desc["subject"]))

    def _send(self, member: str, text: str, eta: float = 0.0) -> int:
        """Publish a call taken from a fair queue ("tenant\\ntag\\nenvelope")."""
        _tenant, tag, env = [*text.split("\n", 2), "", ""][:3]
        try:
            sig, _due, _env = open_envelope(self.app, env)
        except Exception as exc:  # unreadable: its lease runs out and it is taken again
            logger.error("governor: cannot read a fair-queue call %s: %r", member, exc)
            return 0
        headers = dict(sig.options.get("headers") or {})
        carried = dict(headers.get(HEADER) or {})
        carried["fair"], carried["release"] = member, secrets.token_hex(8)
        if tag:
            carried["tag"] = float(tag)
        headers[HEADER] = carried
        sig.options["headers"] = headers
        sig.apply_async(countdown=eta or None)
        return 1

    def run(self) -> None:
        pause = IDLE
        while not self._stop.wait(pause):
            try:
                sent, waiting, wake = self.dispatch_once()
                pause = wake if waiting or sent else IDLE
            except Exception as exc:  # Redis or broker trouble: try again soon
                logger.warning("governor: sending on fair-queue calls failed: %r", exc)
                pause = IDLE

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="governor-fair", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
