"""After a :class:`~governor.celery.Backoff`: pause the limit for every worker, and send the task
to run again behind the pause.

1. Which limits: the one the Backoff names, else the call's most specific (its key's, else its
   task's, else its queue's).
2. Each is paused in Redis (``pause.lua``): a block that only grows, until the moment the
   upstream named or for a capped exponential pause, on Redis's clock. Calls of that limit
   denied meanwhile wait until its end, and bookings made before it that fall inside it are
   given back when they come to claim (they wait behind the pause).
3. The task books its place at the pause's end under all its limits (where every algorithm
   books and no concurrency cap governs it), so it runs first when the pause ends, and is
   re-published like any deferral: a governance wait, never counted against ``max_retries``.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ...errors import StorageUnavailable
from .. import signals
from ..config.factors import configured
from ..config.live import LiveView
from ..config.settings import Settings
from ..config.store import Store
from ..decisions.decider import Decider
from ..types import Call, Deferred, LimitSpec, Outcome
from ..waiting.republish import Republisher
from .adaptive import decrease
from .backoff import LIMIT_KINDS, Backoff

__all__ = ["Pausing", "paused_specs"]

logger = logging.getLogger("governor.celery")
MIN_PAUSE = 0.001
"""A Backoff asking for less (seconds) pauses as one without a wait does."""


def paused_specs(specs: list[LimitSpec], limit: str | None) -> list[LimitSpec]:
    """The limits of a call that a Backoff naming ``limit`` pauses (see :class:`Backoff`); a
    name that matches none of them pauses the default, with a warning (the task is kept)."""
    if limit == "all":
        return list(specs)
    if limit is not None:
        named = [s for s in specs if s.kind == limit or s.label == limit]
        if named:
            return named
        logger.warning(
            "governor: Backoff names limit %r, which does not govern this call (%s); pausing "
            "its most specific limit instead (names: %s or a label)",
            limit,
            ", ".join(s.label for s in specs) or "none",
            ", ".join(LIMIT_KINDS),
        )
    for kind in ("key", "task", "queue"):
        for spec in specs:
            if spec.kind == kind:
                return [spec]
    return []


class Pausing:
    """The gate's step for a body that raised Backoff."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        decider: Decider,
        republisher: Republisher,
        live: LiveView | None = None,
    ) -> None:
        self.live = live
        self.settings = settings
        self.store = store
        self.decider = decider
        self.republisher = republisher

    def pause(self, call: Call, exc: Backoff) -> Deferred:
        """Pause, book behind the pause, re-publish; the Deferred is for the caller to raise."""
        settings = self.settings
        wait = exc.retry_after
        if wait is not None and wait < MIN_PAUSE:
            # "now" (Retry-After: 0), or a moment already past on this host's clock (a skewed
            # HTTP-date or reset): no usable length, yet the upstream refused. The capped
            # exponential pause, which grows if the answer repeats (never a loop at full speed)
            wait = None
        if wait is not None and wait > settings.max_pause:
            logger.warning(
                "governor: %s asked for a %.0fs pause; pausing %.0fs (governor_max_pause)",
                call.name,
                wait,
                settings.max_pause,
            )
            wait = settings.max_pause
        specs = paused_specs(call.specs, exc.limit)
        # admissions this process leased ahead would run into the pause without asking Redis
        # (every other process gives its own back at its first Backoff: one 429 each at most)
        self.decider.leases.release()
        try:
            return self._pause(call, exc, specs, wait)
        except StorageUnavailable as error:  # no pause for others: this task still waits
            delay = settings.backoff_base if wait is None else wait
            logger.warning(
                "governor: could not pause %s after %s (%s); it runs again in %.1fs",
                ", ".join(s.label for s in specs) or call.name,
                exc,
                error,
                delay,
            )
            return self.republisher.republish(call, Outcome(False, delay=delay), "backoff")

    def _pause(
        self, call: Call, exc: Backoff, specs: list[LimitSpec], wait: float | None
    ) -> Deferred:
        settings = self.settings
        until, now, label = 0.0, None, "backoff"
        for spec in specs:
            lim = self.store.limiter(spec.name, spec.config)
            paused = lim.pause(
                spec.subject,
                wait,
                f"{exc.reason} ({call.name})",
                base=settings.backoff_base,
                max_pause=settings.backoff_max,
            )
            if paused.until > until:
                until, now, label = paused.until, paused.now, spec.label
            logger.warning(
                "governor: %s paused for %.1fs: %s raised %s",
                spec.label,
                paused.seconds,
                call.name,
                exc,
            )
            if spec.config.adaptive:
                self._adapt(call, spec, paused.seconds)
            signals.limit_paused.send(
                sender=call.task,
                request=call.request,
                limit=spec.label,
                until=paused.until,
                seconds=paused.seconds,
                reason=exc.reason,
                level=paused.level,
            )
        if not specs:  # nothing governs the call: it only waits, as asked
            delay = settings.backoff_base if wait is None else wait
            return self.republisher.republish(call, Outcome(False, delay=delay), label)
        limiters = self.decider.limiters(self._now(call.specs))
        if all(lim.books and lim.cap is None for lim, _ in limiters):
            start = max(until, (now or until) + 0.001)  # a booking, never an admission now
            outcome = self.decider.reserve_all(limiters, call.cost, not_before=start)
        else:
            outcome = Outcome(False, delay=max(0.0, until - (now or until)), now=now)
        call.state.slots = None  # bookings it held were used by the run that got the answer
        return self.republisher.republish(call, outcome, label)

    def _now(self, specs: list[LimitSpec]) -> list[LimitSpec]:
        """The call's limits at their rates now: an adaptive one just lowered books the task
        behind the pause at its new rate, not at the one its 429 came under."""
        if self.live is None or not any(s.config.adaptive for s in specs):
            return specs
        return self.live.apply([replace(s, config=configured(s.config)) for s in specs])

    def _adapt(self, call: Call, spec: LimitSpec, pause: float) -> None:
        """An adaptive limit: lower its rate (once per overload; see :mod:`.adaptive`)."""
        factor, changed = decrease(self.store.client, self.settings, spec.label, pause)
        if changed:
            logger.warning("governor: %s adapts to %.0f%% of its rules", spec.label, 100 * factor)
            signals.limit_adapted.send(
                sender=call.task, request=call.request, limit=spec.label, factor=factor
            )
            if self.live is not None:
                self.live.changed()
