"""One answer for a call under its limits: start on its bookings, take from a lease, or ask.

A call that carries bookings claims them (:func:`~.decide.claim_all`; one booked before an
adaptive limit's rate went down is paced at the rate now, :mod:`.pacing`); in a pool process, a
call without bookings may be admitted from a lease (:mod:`.leases`); otherwise every limit is
asked at once (:func:`~.decide.reserve_all`, or :func:`~.decide.acquire_all` for algorithms
that cannot book).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...costs import Cost
from ...limiter import Limiter
from ..config.live import LiveView
from ..config.settings import Settings
from ..config.store import Store
from ..types import Handed, Held, LimitSpec, Outcome, WaitState, Who
from .carried import Carried
from .leases import AdmissionLeases
from .pacing import Pacing
from .rounds import acquire_all, claim_all, refund, reserve_all

__all__ = ["Decider", "too_long", "waited_so_far"]


Publish = Callable[[Handed], object]


class Decider:
    """Decisions of one process (the gate's, and early deferral's). ``publish`` sends the
    messages of waiting tasks that a decision or a refund handed a concurrency slot to."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        publish: Publish | None = None,
        live: LiveView | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.leases = AdmissionLeases(settings.lease_span)
        self.publish: Publish = publish or (lambda handed: None)
        self.pacing = Pacing(store, live) if live is not None else None
        """Stale bookings of adaptive limits (:mod:`.pacing`); None without live limits."""
        self.carried: Carried | None = None
        """Slots of this process's ended tasks, given back in the next decision of their cap
        (:mod:`.carried`); None: every slot is given back at its task's end."""

    def limiters(self, specs: list[LimitSpec]) -> list[tuple[Limiter, LimitSpec]]:
        return [(self.store.limiter(s.name, s.config), s) for s in specs]

    def decide(
        self,
        specs: list[LimitSpec],
        cost: Cost,
        state: WaitState,
        *,
        lease: bool = False,
        who: Who | None = None,
    ) -> Outcome:
        """One answer for a call under ``specs``; ``lease``: the task starts right after an
        admission (the pool), so it may come from a lease (see :mod:`.leases`); ``who``: the
        holder of the concurrency slots an admission takes."""
        handed: Handed = []
        try:
            return self._decide(self.limiters(specs), cost, state, lease, who, handed)
        finally:
            if handed:
                self.publish(handed)

    def _decide(
        self,
        limiters: list[tuple[Limiter, LimitSpec]],
        cost: Cost,
        state: WaitState,
        lease: bool,
        who: Who | None,
        handed: Handed,
    ) -> Outcome:
        fair = any(spec.config.fair_by is not None for _, spec in limiters)
        per_meter = type(cost) is not int
        if ((fair or per_meter) and not state.slots) or not all(lim.books for lim, _ in limiters):
            # a fair limit books nothing ahead: its waiting calls queue by tag (.fairness),
            # and its dispatcher books the few it sends on (they claim it below). A cost per
            # meter is an estimate that settling corrects: a booking far ahead would keep its
            # place at the estimate; such a call asks again when the meters will have room
            # (it claims only the booking a Backoff made for it behind the pause)
            if fair and lease and type(cost) is int and not state.slots:
                return self._fair_leased(limiters, cost, who, handed)
            return acquire_all(limiters, cost, who, handed)
        if state.slots:
            settings = self.settings
            outcome = claim_all(
                limiters,
                cost,
                state.slots,
                settings.late_tolerance,
                settings.early_sleep,
                who,
                handed,
            )
            if (
                outcome is not None
                and outcome.allowed
                and self.pacing is not None
                and type(cost) is int  # adaptive limits take no meters
            ):
                outcome = self.pacing.pace(limiters, cost, state, outcome, handed)
            if outcome is not None or fair or per_meter:
                return outcome or acquire_all(limiters, cost, who, handed)
        elif lease and type(cost) is int:
            caps = [(lim, spec) for lim, spec in limiters if lim.cap is not None]
            if not caps:
                outcome = self.leases.take(limiters, cost) or self.leases.grant(limiters, cost)
                if outcome is not None:
                    return outcome
            else:
                outcome = self.leased_with_caps(limiters, caps, cost, who, handed)
                if outcome is not None:
                    return outcome
        outcome = reserve_all(limiters, cost, self.settings.late_tolerance, None, who, handed)
        if lease:
            self.leases.observe(outcome.held)
        return outcome

    def _fair_leased(
        self,
        limiters: list[tuple[Limiter, LimitSpec]],
        cost: int,
        who: Who | None,
        handed: Handed,
    ) -> Outcome:
        """A call under a fair limit whose queue this process has not seen in use (the gate
        queues the others first): from leases while the limits have plenty of room (a lease
        is counted now and starts within its span: no booking ahead), else asked now."""
        caps = [(lim, spec) for lim, spec in limiters if lim.cap is not None]
        if caps:
            outcome = self.leased_with_caps(limiters, caps, cost, who, handed)
        else:
            outcome = self.leases.take(limiters, cost) or self.leases.grant(limiters, cost)
        if outcome is not None:
            return outcome
        outcome = acquire_all(limiters, cost, who, handed, self.carried)
        self.leases.observe(outcome.held)
        return outcome

    def leased_with_caps(
        self,
        limiters: list[tuple[Limiter, LimitSpec]],
        caps: list[tuple[Limiter, LimitSpec]],
        cost: int,
        who: Who | None,
        handed: Handed,
    ) -> Outcome | None:
        """The limits without a cap from leases, the capped ones asked now (a slot is taken
        now or the cap is full, nothing is booked; a slot this process's previous task left
        lingering is given back in the same call). None: a limit has no lease with room, or a
        capped limit's own rules deny (the caller asks for everything as usual: bookings)."""
        if not all(self.leases.roomy(lim, spec.subject) for lim, spec in caps if lim.rules):
            return None  # a capped limit's rules may deny: booked the usual way
        rates = [(lim, spec) for lim, spec in limiters if lim.cap is None]
        if rates:
            leased = self.leases.take(rates, cost) or self.leases.grant(rates, cost)
        else:
            leased = Outcome(True, held=[])
        if leased is None:
            return None
        try:
            slots = acquire_all(caps, cost, who, handed, self.carried)
        except BaseException:  # (Redis away) the task does not start: the units go back
            self.leases.untake(rates, cost)
            raise
        if not slots.allowed:
            self.leases.untake(rates, cost)
            decision = slots.decision
            return slots if decision is not None and decision.capped is not None else None
        self.leases.observe(slots.held)  # (a capped limit's rules: their room now)
        rate_held, slot_held = iter(leased.held), iter(slots.held)  # each in limiters' order
        held: Held = [next(rate_held if lim.cap is None else slot_held) for lim, _ in limiters]
        return Outcome(True, now=slots.held[-1][2].now, held=held)

    def reserve_all(
        self,
        limiters: list[tuple[Limiter, LimitSpec]],
        cost: Cost,
        not_before: float | None = None,
    ) -> Outcome:
        """A booking for a batch (no concurrency slot is ever taken by a booking)."""
        return reserve_all(limiters, cost, self.settings.late_tolerance, not_before)

    def refund(self, held: Held, cost: Cost) -> None:
        """Give back what a decision took, and publish whom freed slots went to."""
        handed = refund(held, cost)
        if handed:
            self.publish(handed)


def waited_so_far(state: WaitState, outcome: Outcome) -> float:
    """Seconds a call has waited so far (since its first deferral, on the server's clock)."""
    now = outcome.now or time.time()
    return now - state.since if state.since is not None else 0.0


def too_long(max_wait: float | None, state: WaitState, outcome: Outcome) -> bool:
    """Whether this wait would take the call past ``max_wait`` seconds in total."""
    return max_wait is not None and waited_so_far(state, outcome) + outcome.delay > max_wait
