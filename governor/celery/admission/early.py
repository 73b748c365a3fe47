"""Early deferral: in the worker's main process, a message known to be denied is deferred
before it reaches the pool.

When a limit is known to deny (a peek, cached for ``HINT_TTL``), the message is booked and
re-published right there and acknowledged. That saves the pool a round trip per denial, so a
backlog's first wave of deferrals drains fast enough for its earliest bookings. A call whose
limits depend on its arguments (a per-key limit, a callable cost) needs its message decoded
and a peek per subject: that is done for one call of a task each ``HINT_TTL``, and for all of
them for ``DENYING`` seconds after one was seen denied (or while a limit of the route
denies). Admission itself never happens here (it belongs right before the body, in the pool);
anything unusual (bookings to claim, Redis trouble, a wait too long) goes to the pool.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis
from celery.exceptions import Reject
from celery.worker.state import task_ready

from ...caps import new_token
from ...costs import Cost
from ...errors import StorageUnavailable
from ..decisions.decider import Decider, too_long
from ..metering.costs import share
from ..types import HEADER, LimitConfig, LimitSpec, Who
from ..waiting.cap_line import CapLine
from ..waiting.republish import Republisher
from .calls import Calls, Route

__all__ = ["DENYING", "EARLY_PAUSE", "HINT_TTL", "EarlyDeferral"]

logger = logging.getLogger("governor.celery")
HINT_TTL = 0.05
"""How long the worker's main process trusts a peek that found room (seconds)."""
DENYING = 1.0
"""After a call of a task whose limits depend on its arguments was seen denied, every call of
the task is worked out for this long (seconds); otherwise one each ``HINT_TTL``."""
EARLY_PAUSE = 5.0
"""After Redis failed in the worker's main process, it leaves every decision to the pool for
this long (seconds), so an outage does not stall the consumer on socket timeouts."""


class EarlyDeferral:
    """The main process's side of a gate: cached hints and the deferral itself."""

    def __init__(
        self, calls: Calls, decider: Decider, republisher: Republisher, cap_line: CapLine
    ) -> None:
        self.calls = calls
        self.decider = decider
        self.republisher = republisher
        self.cap_line = cap_line
        self.hints: dict[tuple[str, str], tuple[LimitConfig, float, float]] = {}
        """(limit name, subject) -> (the limit's config, when peeked, until when it denies:
        monotonic times); a hint for another config of the limit is not used."""
        self.paused_until = 0.0
        self.sampled: dict[str, float] = {}
        """Task name -> when a call of it whose limits depend on its arguments was last
        worked out (monotonic)."""
        self.denying: dict[str, float] = {}
        """Task name -> until when its calls are all worked out: one was seen denied."""

    def defer(self, req: Any, route: Route | None = None) -> bool:
        """Defer ``req`` (a worker request, before it goes to the pool) if a limit is known
        to deny it. True if it was deferred; never raises. ``route``: the message's, when the
        caller has it at hand.

        A route whose calls depend on nothing but its limits, all seen with room by peeks
        younger than ``HINT_TTL``, is passed at once until the oldest of them expires
        (``route.clear_until``): the usual message costs the main process one comparison."""
        now = time.monotonic()
        if route is not None and route.clear_until > now:
            return False
        if now < self.paused_until:
            return False
        try:
            return self._defer(req, route)
        except Exception as exc:  # never break the consumer: the pool path decides instead
            if isinstance(exc, (StorageUnavailable, redis.RedisError)):
                self.paused_until = time.monotonic() + EARLY_PAUSE
            logger.debug("governor: early deferral skipped for %s: %r", req.id, exc)
            return False

    def _defer(self, req: Any, route: Route | None) -> bool:
        info = req.delivery_info
        if info.get("redelivered"):
            return False  # the pool drops it if it was settled before (see .redelivery)
        calls, task = self.calls, req.task
        carried = req._request_dict.get(HEADER)
        if (
            carried is not None
            and isinstance(carried, Mapping)
            and (carried.get("slots") or carried.get("parked"))
        ):
            return False  # bookings are claimed, and copies dropped, in the pool
        if route is None:
            route = calls.route(task, info)
        if route.fair:
            return False  # fair limits queue their calls in the pool (see ..fair.sharing)

        def holder() -> str:
            return f"{req.id}:{req._request_dict.get('retries') or 0}"

        opts = calls.options(task)
        if opts.key_config is None and not callable(opts.cost):
            # the usual case: decide from the cached hints before decoding anything
            if not route.specs:
                return False
            room_until = self._room_until(route.specs, opts.cost, holder)
            if room_until > 0.0:
                route.clear_until = room_until
                return False
        elif not self._worth_decoding(task.name, route, holder):
            return False
        call = calls.call(task, req._context, tuple(req.args), dict(req.kwargs))
        if any(s.config.fair_by is not None for s in call.specs):
            return False
        if not call.specs or not self.known_denied(call.specs, call.cost, holder):
            return False
        self.denying[task.name] = time.monotonic() + DENYING
        if req.revoked():  # revoked or expired: Celery's own dispatch discards it
            return False
        capped = any(s.config.concurrency is not None for s in call.specs)
        who = Who(holder(), new_token(), f"{req.hostname} main") if capped else None
        outcome = self.decider.decide(call.specs, call.cost, call.state, who=who)
        if outcome.allowed:  # room appeared meanwhile: give it back, the pool acquires
            self.decider.refund(outcome.held, call.cost)
            for spec in call.specs:
                self.hints[(spec.name, spec.subject)] = (spec.config, time.monotonic(), 0.0)
            return False
        decision = outcome.decision
        if (decision is not None and decision.retry_after == math.inf) or too_long(
            calls.max_wait(task), call.state, outcome
        ):
            self.decider.refund(outcome.held, call.cost)
            return False
        label = outcome.spec.label if outcome.spec else "governor"
        try:
            if decision is not None and decision.capped is not None:
                # in a full cap's line (anything else about caps is left to the pool)
                if decision.capped != "full" or self.cap_line.wait(call, outcome, label) is None:
                    return False
            else:
                self.republisher.republish(call, outcome, label)
        except Reject:
            return False
        task_ready(req)
        req.acknowledge()
        return True

    def _worth_decoding(self, name: str, route: Route, holder: Callable[[], str]) -> bool:
        """Whether to work out a call whose limits depend on its arguments (a per-key limit,
        a callable cost): decoding them and peeking at its subject for every message would
        cost the main process more than the task. Yes while a call of the task was seen
        denied within :data:`DENYING`, or a limit of its route denies; otherwise one call of
        the task each :data:`HINT_TTL`."""
        now = time.monotonic()
        if self.denying.get(name, 0.0) > now:
            return True
        if route.specs and self.known_denied(route.specs, 1, holder):
            return True
        if now - self.sampled.get(name, -math.inf) < HINT_TTL:
            return False
        if len(self.sampled) > 10_000:
            self.sampled.clear()
            self.denying.clear()
        self.sampled[name] = now
        return True

    def known_denied(
        self, specs: Sequence[LimitSpec], cost: Cost, holder: Callable[[], str]
    ) -> bool:
        """Whether a limit of ``specs`` denies now, by a peek at most ``HINT_TTL`` old (a
        denial is trusted until its retry_after; a full cap's, only for ``HINT_TTL``).
        ``holder()`` names the holder a peek at a cap asks for."""
        return self._room_until(specs, cost, holder) == 0.0

    def _room_until(
        self, specs: Sequence[LimitSpec], cost: Cost, holder: Callable[[], str]
    ) -> float:
        """Until when (monotonic) the hints say every limit of ``specs`` has room: when the
        oldest peek that found room stops being trusted; 0.0 when one denies now (see
        :meth:`known_denied`)."""
        now = time.monotonic()
        until = math.inf
        for spec in specs:
            key = (spec.name, spec.subject)
            hint = self.hints.get(key)
            if (
                hint is None
                or (hint[0] is not spec.config and hint[0] != spec.config)
                or (hint[2] <= now and now - hint[1] > HINT_TTL)
            ):
                lim = self.decider.store.limiter(spec.name, spec.config)
                d = lim.peek(spec.subject, share(lim, cost), holder=holder())
                wait = d.retry_after if d.capped is None else HINT_TTL
                hint = (spec.config, now, 0.0 if d.allowed else now + wait)
                if len(self.hints) > 10_000:
                    self.hints.clear()
                self.hints[key] = hint
            if hint[2] > now:
                return 0.0
            until = min(until, hint[1] + HINT_TTL)
        return until
