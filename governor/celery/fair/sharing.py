"""Fair sharing of a limit between tenants: one tenant's flood does not starve the others.

>>> app.conf.governor_queues = {
...     "reports": {"rules": "20/s, 10000/d", "fair_by": "customer_id",
...                 "weights": {"enterprise-co": 4}},
... }

A fair limit books nothing ahead: a call it denies waits in the limit's **fair queue** in Redis,
placed by a virtual start tag (start-time fair queuing, as Temporal's task-queue fairness):
``max(V, the tenant's last tag) + cost / weight``, V being the tag of the last call sent on. So
each tenant's calls follow each other at intervals of cost / weight, and a tenant that arrives
late starts at V, level with the others' next calls, not behind their backlog; a tenant that
was idle banks no credit. A dispatcher in every worker (:mod:`.dispatcher`) sends on the
lowest tags as the limit has room, and each arrives to be admitted like any call (it claims its
entry first, so a second copy is dropped; denied again, it keeps its tag). Within a tenant,
calls go first come, first served.

Where the calls wait and how they are taken: :mod:`.queue`; who sends them on:
:mod:`.dispatcher`; which tenant a call is for: :mod:`.tenants`.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import replace

from redis.exceptions import RedisClusterException, RedisError

from ...errors import StorageUnavailable
from .. import signals
from ..config.settings import Settings
from ..config.store import Store
from ..metering.costs import fair_step
from ..types import HEADER, Call, Deferred, LimitSpec, Outcome
from ..waiting.republish import Republisher
from .queue import FairQueue, copy_marks, fair_due_key

__all__ = ["FairSharing", "fair_spec"]

logger = logging.getLogger("governor.celery")
EARLY_WAIT = 0.1
"""The longest a call sent on waits in the pool process for its limit's room (see
``dispatcher.AHEAD``)."""
IN_USE = 5.0
"""Seconds a process treats a fair queue as in use after it put a call in or saw one arrive."""


def fair_spec(call: Call) -> LimitSpec | None:
    """The call's fair limit, if one governs it."""
    for spec in call.specs:
        if spec.config.fair_by is not None:
            return spec
    return None


class FairSharing:
    """The gate's step for fair limits: queue a denied call; claim a call sent on."""

    def __init__(self, settings: Settings, store: Store, republisher: Republisher) -> None:
        self.settings = settings
        self.store = store
        self.republisher = republisher
        self.busy: dict[tuple[str, str], float] = {}
        """Fair queues this process saw in use lately (monotonic time until which it trusts
        it): a new call for one goes straight into it, behind those already waiting."""

    def behind(self, call: Call) -> Deferred | None:
        """A new call of a fair limit whose queue is in use waits in it at once, so it does
        not pass the calls queued before it (and costs one script, the put, as a denial
        would). None: decide as usual."""
        spec = fair_spec(call)
        if spec is None or call.state.tag is not None:
            return None
        until = self.busy.get((spec.name, spec.subject))
        if until is None or until < time.monotonic():
            return None
        return self.wait(call, Outcome(False), spec)

    def in_use(self, queues: tuple[tuple[str, str], ...]) -> bool:
        """Whether this process saw any of these fair queues ((name, subject)) in use lately:
        a new call of one waits in it (:meth:`behind`), so it is not admitted from a lease."""
        now = time.monotonic()
        busy = self.busy
        return any(busy.get(queue, 0.0) > now for queue in queues)

    def sent_early(self, call: Call, retry_after: float) -> bool:
        """A call sent on from the fair queue arrived just before its limit had room (the
        dispatcher sends it ahead by the trip of its message): wait the rest here, once.
        True when it waited (decide again); False: it waits in the queue again, in its place."""
        if call.state.tag is None or call.state.fair_waited or retry_after > EARLY_WAIT:
            return False
        call.state.fair_waited = True
        time.sleep(max(0.0, retry_after))
        return True

    def _in_use(self, spec: LimitSpec) -> None:
        if len(self.busy) > 10_000:
            self.busy.clear()
        self.busy[(spec.name, spec.subject)] = time.monotonic() + IN_USE

    def queue(self, spec: LimitSpec) -> FairQueue:
        return FairQueue(self.store.limiter(spec.name, spec.config), spec.subject)

    def claim(self, call: Call) -> bool:
        """A call sent on from a fair queue: True if this copy may go on (the first, or the
        same copy redelivered)."""
        state, spec = call.state, fair_spec(call)
        if state.fair is None:
            return True
        if spec is None:  # the limit is no longer fair (changed live): nothing to claim
            state.fair = None
            return True
        sent, copy = copy_marks((getattr(call.request, "headers", None) or {}).get(HEADER))
        first = self.queue(spec).claim(
            self.store.client, state.fair, state.release or "", sent=sent, copy=copy
        )
        state.fair = state.release = None
        self._in_use(spec)
        return first

    def wait(self, call: Call, outcome: Outcome, spec: LimitSpec) -> Deferred:
        """Queue the call in its fair limit's queue; the Deferred is for the caller to raise."""
        client = self.store.client
        queue = self.queue(spec)
        tenant = spec.tenant or ""
        text, waiting_state = self.republisher.message(call, spec.label)
        step = fair_step(spec.config, call.cost) / spec.config.weight(tenant)
        try:  # the gate's fail_mode decides what Redis away means
            client.zadd(fair_due_key(self.settings.prefix), {queue.describe(): time.time()})
        except (RedisError, RedisClusterException) as exc:
            raise StorageUnavailable(f"Redis did not answer for fair queues: {exc}") from exc
        member = f"{call.request.id}:{secrets.token_hex(4)}"
        tag, waiting = queue.put(client, member, tenant, step, call.state.tag, text)
        call.state = replace(waiting_state, tag=tag)
        self._in_use(spec)
        signals.task_deferred.send(
            sender=call.task,
            request=call.request,
            limit=spec.label,
            rule=outcome.decision.rule if outcome.decision is not None else "fair",
            delay=None,
            booked=False,
            blocked=None,
            fair=tenant,
        )
        self.republisher.note(call, spec.label, "fair", 0.0)
        return Deferred(
            f"governor: waits in the fair queue of {spec.label} as tenant {tenant!r} "
            f"(tag {tag:g}, {waiting} waiting)"
        )
