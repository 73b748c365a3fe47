"""Early deferral: in the worker's main process, a message known to be denied is deferred
before it reaches the pool.

When a limit is known to deny (a peek, cached for ``HINT_TTL``), the message is booked and
re-published right there and acknowledged. That saves the pool a round trip per denial, so a
backlog's first wave of deferrals drains fast enough for its earliest bookings. Admission
itself never happens here (it belongs right before the body, in the pool); anything unusual
(bookings to claim, Redis trouble, a wait too long) goes to the pool.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis
from celery.exceptions import Reject
from celery.worker.state import task_ready

from ..errors import StorageUnavailable
from .limits import LimitSpec
from .settings import LimitConfig
from .waits import HEADER, WaitState

if TYPE_CHECKING:
    from .gate import Gate

__all__ = ["EARLY_PAUSE", "HINT_TTL", "EarlyDeferral"]

logger = logging.getLogger("governor.celery")
HINT_TTL = 0.05
"""How long the worker's main process trusts a peek that found room (seconds)."""
EARLY_PAUSE = 5.0
"""After Redis failed in the worker's main process, it leaves every decision to the pool for
this long (seconds), so an outage does not stall the consumer on socket timeouts."""


class EarlyDeferral:
    """The main process's side of a gate: cached hints and the deferral itself."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.hints: dict[tuple[str, str, LimitConfig], tuple[float, float]] = {}
        """(limit name, subject, config) -> (when peeked, until when it denies), monotonic."""
        self.paused_until = 0.0

    def defer(self, req: Any) -> bool:
        """Defer ``req`` (a worker request, before it goes to the pool) if a limit is known
        to deny it. True if it was deferred; never raises."""
        if time.monotonic() < self.paused_until:
            return False
        try:
            return self._defer(req)
        except Exception as exc:  # never break the consumer: the pool path decides instead
            if isinstance(exc, (StorageUnavailable, redis.RedisError)):
                self.paused_until = time.monotonic() + EARLY_PAUSE
            logger.debug("governor: early deferral skipped for %s: %r", req.id, exc)
            return False

    def _defer(self, req: Any) -> bool:
        gate, task = self.gate, req.task
        carried = req._request_dict.get(HEADER)
        if isinstance(carried, Mapping) and (carried.get("slots") or carried.get("parked")):
            return False  # bookings are claimed, and copies dropped, in the pool
        opts = gate.options(task)
        if opts.key_config is None and not callable(opts.cost):
            # the usual case: decide from the cached hint before decoding anything
            specs = gate.fixed_specs(task, req.delivery_info)
            if not specs or not self.known_denied(specs, opts.cost):
                return False
        request = req._context
        state = WaitState.from_request(request)
        args, kwargs = tuple(req.args), dict(req.kwargs)
        specs = gate.specs(task, request, args, kwargs)
        if not specs:
            return False
        cost = gate.cost(task, args, kwargs)
        if not self.known_denied(specs, cost):
            return False
        if req.revoked():  # revoked or expired: Celery's own dispatch discards it
            return False
        outcome = gate.decide(specs, cost, state)
        if outcome.allowed:  # room appeared meanwhile: give it back, the pool acquires
            gate.refund(outcome.held, cost)
            for spec in specs:
                self.hints[(spec.name, spec.subject, spec.config)] = (time.monotonic(), 0.0)
            return False
        decision = outcome.decision
        if (decision is not None and decision.retry_after == math.inf) or gate.too_long(
            task, state, outcome
        ):
            gate.refund(outcome.held, cost)
            return False
        label = outcome.spec.label if outcome.spec else "governor"
        try:
            gate.republish(task, request, args, kwargs, state, outcome, label, cost)
        except Reject:
            return False
        task_ready(req)
        req.acknowledge()
        return True

    def known_denied(self, specs: list[LimitSpec], cost: int) -> bool:
        """Whether a limit of ``specs`` denies now, by a peek at most ``HINT_TTL`` old (a
        denial is trusted until its retry_after)."""
        now = time.monotonic()
        for spec in specs:
            key = (spec.name, spec.subject, spec.config)
            hint = self.hints.get(key)
            if hint is None or (hint[1] <= now and now - hint[0] > HINT_TTL):
                d = self.gate.limiter(spec.name, spec.config).peek(spec.subject, cost)
                hint = (now, now + d.retry_after if not d.allowed else 0.0)
                if len(self.hints) > 10_000:
                    self.hints.clear()
                self.hints[key] = hint
            if hint[1] > now:
                return True
        return False
