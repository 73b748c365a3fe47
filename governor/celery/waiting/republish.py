"""Sending a deferred call back to wait: as a short ETA through the broker, or parked in Redis.

The copy keeps the task id, arguments, headers, priority, route, links and ``retries``
(governance waits never count as retries); its ``governor`` header carries the wait state
(bookings, since when, how often). The original message is acknowledged only after the copy
is out: the gate then raises :class:`~.waits.Deferred`, an ``Ignore``, which Celery acks.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from celery.exceptions import Reject

from ...errors import GovernorError
from .. import signals
from ..config.settings import Settings
from ..config.store import Store
from ..decisions.rounds import refund
from ..types import HEADER, TRANSIENT, Call, Deferred, Outcome, WaitState
from . import parking
from .envelope import envelope
from .handover import Handover

__all__ = ["Republisher"]

logger = logging.getLogger("governor.celery")
SUMMARY_EVERY = 10.0
"""Seconds between the INFO summaries of deferrals a process logs."""


class Republisher:
    """Re-publishes deferred calls of one process, and logs a summary of them."""

    def __init__(self, app: Any, settings: Settings, store: Store, handover: Handover) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        self.handover = handover
        self._deferrals: Counter[str] = Counter()
        self._longest = 0.0
        self._summary_at = time.monotonic()

    def republish(self, call: Call, outcome: Outcome, label: str) -> Deferred:
        """Re-publish the call to run after the outcome's delay; the Deferred says why.

        Raises Reject (requeue) if the broker refuses: the original message is kept, and what
        this decision booked is given back. Raises GovernorError when the call can never be
        re-published (say, its arguments no longer serialize).
        """
        task, request, state = call.task, call.request, call.state
        if state.since is None:
            state.since = outcome.now or time.time()
        state.slots = outcome.slots
        state.booked = (outcome.now or time.time()) if outcome.slots else None
        state.waits += 1
        delay = max(0.0, outcome.delay - (time.monotonic() - outcome.at))
        park = self.settings.park_after is not None and delay > self.settings.park_after
        # a booked task arrives a little early and closes in on its slot (Settings.lead)
        lead = self.settings.lead if outcome.slots else 0.0
        if park:
            state.parked = parking.new_parking_id(
                f"{request.id}:{state.waits}:{secrets.token_hex(4)}",
                self.settings.parking_shards,
            )
        sig = task.signature_from_request(
            request,
            call.args,
            call.kwargs,
            countdown=None if park else max(0.0, delay - lead),
            retries=request.retries,
        )
        sig.options["headers"] = {**(sig.options.get("headers") or {}), HEADER: state.header()}
        try:
            if park:
                due = (outcome.now or time.time()) + outcome.delay
                parking.park(
                    self.store.client,
                    self.settings.prefix,
                    str(state.parked),
                    due,
                    envelope(self.app, sig, due, label),
                    self.settings.park_replicas,
                    self.settings.park_replica_timeout,
                )
                signals.task_parked.send(sender=task, request=request, due=due, limit=label)
            else:
                sig.apply_async()
        except TRANSIENT as exc:  # the broker (or Redis) is away: keep the original message
            self.handover.publish(refund(outcome.held, call.cost))
            logger.error("governor: could not re-publish %s, requeued: %r", call.name, exc)
            raise Reject(exc, requeue=True) from exc
        except Exception as exc:  # it can never be re-published (say, it cannot be serialized)
            self.handover.publish(refund(outcome.held, call.cost))
            raise GovernorError(
                f"task {task.name!r} [{request.id}] must wait {delay:.1f}s for {label}, but "
                f"re-publishing it failed: {exc!r}"
            ) from exc
        decision = outcome.decision
        rule = decision.rule if decision is not None else None
        blocked = decision.blocked if decision is not None else None
        signals.task_deferred.send(
            sender=task,
            request=request,
            limit=label,
            rule=rule,
            delay=delay,
            booked=bool(outcome.slots),
            blocked=blocked,
        )
        self.note(call, label, rule, delay)
        why = f"blocked ({blocked})" if blocked is not None else f"{label} {rule or ''}".strip()
        if outcome.decision is not None and outcome.decision.capped == "copy":
            why = f"a running copy of it under {label}"
        return Deferred(f"governor: waits {delay:.3f}s for {why} (wait {state.waits})")

    def message(self, call: Call, label: str) -> tuple[str, WaitState]:
        """The call's message for a concurrency cap's line, and the state it carries (one wait
        more; the caller makes it the call's once the call is queued)."""
        state = call.state
        waiting = replace(
            state,
            waits=state.waits + 1,
            since=time.time() if state.since is None else state.since,
            slots=None,
            parked=None,
            release=None,
        )
        sig = call.task.signature_from_request(
            call.request, call.args, call.kwargs, countdown=None, retries=call.request.retries
        )
        sig.options["headers"] = {**(sig.options.get("headers") or {}), HEADER: waiting.header()}
        return envelope(self.app, sig, 0.0, label), waiting

    def note(self, call: Call, label: str, rule: Any, delay: float) -> None:
        """Count a deferral for the summary log (and log it at DEBUG)."""
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "governor: %s deferred %.3fs by %s %s (wait %d)",
                call.name,
                delay,
                label,
                rule or "",
                call.state.waits,
            )
        self._deferrals[label] += 1
        self._longest = max(self._longest, delay)
        now = time.monotonic()
        if now - self._summary_at >= SUMMARY_EVERY:
            parts = ", ".join(f"{k} {v}" for k, v in self._deferrals.most_common())
            logger.info(
                "governor: deferred %d tasks in the last %.0fs (%s); longest wait %.1fs",
                sum(self._deferrals.values()),
                now - self._summary_at,
                parts,
                self._longest,
            )
            self._deferrals.clear()
            self._longest = 0.0
            self._summary_at = now
