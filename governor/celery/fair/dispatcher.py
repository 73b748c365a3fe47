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
from collections.abc import Mapping
from typing import Any

from celery.signals import task_revoked

from .. import fork_guard
from ..config.limit_config import limit_config
from ..config.settings import Settings
from ..config.store import Store
from ..types import HEADER, TRANSIENT
from ..waiting import dead_letters
from ..waiting.envelope import open_envelope
from .queue import FairQueue, Sent, Taken, copy_marks, fair_due_key

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
        self._round = threading.Lock()
        """Held through each look: a fork of the process waits for it (see .fork_guard)."""

    def dispatch_once(self, now: float | None = None) -> tuple[int, int, float]:
        """One look at every fair limit: (calls sent on, calls still waiting, seconds until
        the next look could send one). ``now``: Unix seconds for tests (None: Redis's clock).
        A limit whose look fails (Redis, the broker) is logged and looked at again next time;
        the others' looks go on."""
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
            try:
                d = queue.limiter.peek(queue.subject, now=now)
                room = min(d.remaining, pace(queue)) if d.allowed else 0
                eta = 0.0
                if not room and d.blocked is None and d.retry_after <= AHEAD:
                    room, eta = 1, d.retry_after  # sent now, due when the limit frees room
                taken = queue.take(client, room, self.batch, now=now)
                sent += self.send_on(queue, taken, eta)
            except Exception as exc:  # what it took stays in transit: sent again later
                logger.warning("governor: sending on calls of %s failed: %r", queue.label, exc)
                continue
            waiting += taken.waiting
            if taken.waiting and not room:  # look again when the limit has room for the next
                wake = min(wake, max(MIN_WAIT, d.retry_after - AHEAD))
            idle = taken.waiting == 0 and taken.flying == 0
            if idle and seen < (now or time.time()) - FORGET_AFTER:
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

    def send_on(self, queue: FairQueue, taken: Taken, eta: float = 0.0) -> int:
        """Publish what a take returned; returns how many went out. A broker error that may
        pass stops here: what is left stays in transit, and is sent again."""
        return sum(self._send(queue, call, taken.now, eta) for call in taken.calls)

    def _send(self, queue: FairQueue, call: Sent, sent_at: float, eta: float = 0.0) -> int:
        """Publish a call taken from a fair queue ("tenant\\ntag\\nenvelope"), marked with what
        its arrival claims (its member, a token of this copy, when it was sent, which copy it
        is). One that cannot be read, or that the broker refuses for good, goes to the dead
        letters: kept and counted, and it takes no more room. Returns how many went out."""
        tenant, tag, env = [*call.text.split("\n", 2), "", ""][:3]
        try:
            sig, _due, _env = open_envelope(self.app, env)
        except Exception as exc:  # unreadable: taking it again would stall the queue
            self._dead(queue, call, tenant, env, f"unreadable: {exc!r}")
            return 0
        headers = dict(sig.options.get("headers") or {})
        carried = dict(headers.get(HEADER) or {})
        carried.update(
            fair=call.member,
            release=secrets.token_hex(8),
            sent=sent_at,
            copy=call.copy,
            fq=queue.describe(),
        )
        if tag:
            carried["tag"] = float(tag)
        headers[HEADER] = carried
        sig.options["headers"] = headers
        try:
            sig.apply_async(countdown=eta or None)
        except TRANSIENT:
            raise  # the broker is away: it stays in transit, and is sent again
        except Exception as exc:  # refused for good (say, an unknown serializer)
            self._dead(queue, call, tenant, env, f"cannot publish: {exc!r}")
            return 0
        return 1

    def _dead(self, queue: FairQueue, call: Sent, tenant: str, env: str, reason: str) -> None:
        """Move a call that cannot be sent on to the dead letters, then forget it here."""
        client = self.store.client
        where = {"queue": queue.describe(), "tenant": tenant, "tag": call.tag, "copy": call.copy}
        dead_letters.put(
            client,
            self.settings.prefix,
            f"fair:{queue.label}",
            call.member,
            env,
            reason,
            where=where,
        )
        queue.drop(client, call.member)

    def forget_revoked(self, request: Any = None, now: float | None = None, **_: Any) -> None:
        """Celery's ``task_revoked`` (in this worker's main process): a copy sent on from a
        fair queue was revoked, or arrived after its ``expires``, and was discarded. Its call
        is claimed in its name, so it leaves the queue's transit and is not sent again (a
        revoke lasts; each copy would be discarded in turn). ``now``: Unix seconds for tests
        (None: Redis's clock)."""
        carried = getattr(request, HEADER, None)
        if not isinstance(carried, Mapping):
            carried = (getattr(request, "headers", None) or {}).get(HEADER)
        if not isinstance(carried, Mapping) or not carried.get("fair") or not carried.get("fq"):
            return
        try:
            client = self.store.client
            queue = FairQueue.described(client, self.settings.prefix, carried["fq"])
            sent, copy = copy_marks(carried)
            token = str(carried.get("release") or "")
            queue.claim(client, str(carried["fair"]), token, now=now, sent=sent, copy=copy)
            logger.info(
                "governor: %s was discarded (revoked or expired): it leaves the fair queue of %s",
                getattr(request, "id", "?"),
                queue.label,
            )
        except Exception as exc:  # its transit runs out; a later copy is discarded in turn
            logger.warning("governor: could not forget a revoked fair-queue call: %r", exc)

    def run(self) -> None:
        pause = IDLE
        while not self._stop.wait(pause):
            try:
                with self._round:
                    sent, waiting, wake = self.dispatch_once()
                pause = wake if waiting or sent else IDLE
            except Exception as exc:  # Redis trouble: try again soon
                logger.warning("governor: sending on fair-queue calls failed: %r", exc)
                pause = IDLE

    def start(self) -> None:
        fork_guard.guard(self._round)
        task_revoked.connect(self.forget_revoked, weak=False, dispatch_uid=self._uid)
        self._thread = threading.Thread(target=self.run, name="governor-fair", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        task_revoked.disconnect(self.forget_revoked, dispatch_uid=self._uid)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        fork_guard.forget(self._round)

    @property
    def _uid(self) -> str:
        return f"governor.fair.revoked.{id(self)}"
