"""The admission gate: runs in the pool process right before a governed task's body.

A call is governed by up to three limits (queue, task, key). The gate admits it only when all
of them do, atomically per limit and with what was taken given back when another denies. When
the algorithms can book (sliding_log, gcra), a denied call books the earliest moment every limit
admits it and is re-published to run then; it proves its booking on arrival (``claim``), so it is
not denied again. Otherwise it is re-published after the exact ``retry_after``.

:meth:`Gate.admit` is a short sequence of steps, each in a module of its own:

1. what governs the call: its limits, cost and wait state (:mod:`.calls`);
2. a copy the broker delivered again after its acknowledgement was lost is dropped
   (:mod:`..waiting.redelivery`); a released copy of a parked task claims its release, a second
   copy is dropped (:mod:`..waiting.parking`); a call sent on from a fair queue claims its entry
   (:mod:`..fair.sharing`);
3. one answer under every limit: bookings, admission leases, or Redis
   (:mod:`..decisions.decider`), with ``governor_fail_mode`` when Redis is away; shadow limits
   are asked after an admission, and never defer (:mod:`.shadow`);
4. admitted: the task runs, holding the concurrency slots it took until its body ends
   (:mod:`.holding`); denied: it is re-published to wait (:mod:`..waiting.republish`), or waits
   in a full cap's line (:mod:`..waiting.cap_line`).

Under a fair limit (``fair_by``) a denied call waits in the limit's fair queue instead of booking
(:mod:`..fair.sharing`), and comes back through a dispatcher (:mod:`..fair.dispatcher`).

A body that raises :class:`~governor.celery.Backoff` comes back through :meth:`Gate.back_off`:
its limit is paused for every worker and it waits behind the pause (:mod:`..feedback.pausing`).

The whole path of one task, step by step: docs/architecture.md.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Mapping
from typing import Any

import redis

from ...caps import new_token
from ...errors import CostError, GovernorError, GovernorTimeout, StorageUnavailable
from ...keys import subject_text
from ...limiter import Limiter
from .. import signals
from ..config.live import LiveView
from ..config.settings import Settings
from ..config.store import Store
from ..config.task_limits import call_with_arguments
from ..decisions.carried import Carried
from ..decisions.decider import Decider, too_long, waited_so_far
from ..decisions.leases import AdmissionLeases
from ..fair.sharing import FairSharing, fair_spec
from ..feedback.backoff import Backoff
from ..feedback.pausing import Pausing
from ..metering import costs
from ..metering.learned import Learning
from ..metering.settling import Reservations
from ..metering.sync import sync_quotas
from ..types import (
    HEADER,
    Call,
    Deferred,
    Duplicate,
    Handed,
    LimitSpec,
    Outcome,
    TaskOptions,
    WaitState,
    Who,
)
from ..waiting import parking, redelivery
from ..waiting.cap_line import CapLine, holder_of
from ..waiting.handover import Handover
from ..waiting.republish import Republisher
from .calls import Calls, Route
from .early import EarlyDeferral
from .holding import Holding, holder_info
from .lanes import LeaseLane, leasable, slot_only
from .shadow import Shadow

__all__ = ["Deferred", "Duplicate", "Gate", "WaitState"]

logger = logging.getLogger("governor.celery")


class Gate:
    """governor's per-process state and the admission of each governed call."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.store = Store(settings)
        self.live = LiveView(lambda: self.store.client, settings)
        self.calls = Calls(app, settings, self.live)
        self.handover = Handover(app, self.store, settings)
        self.decider = Decider(settings, self.store, self.handover.publish, self.live)
        self.republisher = Republisher(app, settings, self.store, self.handover)
        self.cap_line = CapLine(settings, self.store, self.republisher)
        self.carried = Carried(self.handover.publish)
        self.decider.carried = self.carried
        self.holding = Holding(self.calls, self.store, self.handover, self.carried)
        self.early = EarlyDeferral(self.calls, self.decider, self.republisher, self.cap_line)
        self.pausing = Pausing(settings, self.store, self.decider, self.republisher, self.live)
        self.shadow = Shadow(self.store)
        self.fair = FairSharing(settings, self.store, self.republisher)
        self.learning = Learning(settings, lambda: self.store.client)
        self.calls.learning = self.learning
        self.reservations = Reservations(self.learning)
        self.admitted = 0
        """Calls this process's gate admitted so far (a plain count: benchmarks read it)."""

    # -- what others use ---------------------------------------------------------------------

    @property
    def client(self) -> redis.Redis:
        return self.store.client

    @property
    def leases(self) -> AdmissionLeases:
        return self.decider.leases

    def options(self, task: Any) -> TaskOptions:
        return self.calls.options(task)

    def cost(self, task: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        return self.calls.cost(task, args, kwargs)

    def dropped(self, task: Any, request: Any) -> None:
        """In the worker's main process: Celery dropped ``request`` (a worker request) before
        the gate, revoked or expired: it leaves every cap's line it is in, so a slot handed to it
        passes on at once (:meth:`.CapLine.leave`). Never raises."""
        retries = (getattr(request, "request_dict", None) or {}).get("retries") or 0
        holder = f"{request.id}:{retries}"
        try:
            args, kwargs = tuple(request.args), dict(request.kwargs)
            specs = self.calls.specs(task, request, args, kwargs)
        except Exception as exc:  # its key could not be worked out: a hand-over lapses instead
            logger.warning("governor: dropped %s[%s] left to lapse: %r", task.name, holder, exc)
            return
        for spec in specs:
            if spec.config.concurrency is not None:
                self.cap_line.leave(spec, holder)

    def defer_early(self, req: Any) -> bool:
        """In the worker's main process: defer a message known to be denied before it reaches
        the pool (see :mod:`governor.celery.admission.early`). True if it was deferred."""
        return self.early.defer(req)

    # -- the gate ---------------------------------------------------------------------------

    def admit(self, task: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Deferred | None:
        """Decide for the running task (in the pool process, just before its body).

        Returns None when it may run; otherwise re-publishes it and returns the
        :class:`Deferred` for the caller to raise (raised there, the traceback Celery walks for
        it is short). Raises GovernorTimeout or GovernorError when the task must fail.
        """
        request = task.request
        if getattr(request, "is_eager", False) or getattr(request, "called_directly", False):
            return None
        try:
            if self._leased(task, request, args, kwargs):
                return None
        except StorageUnavailable as exc:  # (a new lease was asked for)
            return self._unavailable(self.calls.call(task, request, args, kwargs), exc)
        call = self.calls.call(task, request, args, kwargs)
        if not call.specs and not call.shadows and call.state.parked is None:
            return None
        try:
            if redelivery.settled(self.client, self.settings.prefix, request, call.state.waits):
                return Duplicate(f"governor: {call.name} ran or waits already")
            if not self._first_copy(call) or not self.fair.claim(call):
                return Duplicate(f"governor: a second copy of {call.name}")
            deferred = self._decide(call) if call.specs else None
        except StorageUnavailable as exc:
            return self._unavailable(call, exc)
        if deferred is None and call.shadows:
            self.shadow.observe(call)
        return deferred

    def _leased(
        self, task: Any, request: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> bool:
        """Admit the usual call from a lease, the short way: what the steps below come to for
        a message delivered for the first time without governor's header (nothing to claim or
        drop), of a task with a fixed cost whose limits all lease (see :mod:`.lanes`; a fair
        limit only while this process has not seen its queue in use): from the leases this
        process holds, or new ones for the limits whose lease ran out. False: take the long
        way."""
        headers = getattr(request, "headers", None)
        info = getattr(request, "delivery_info", None)
        if (headers and HEADER in headers) or (info and info.get("redelivered")):
            return False
        opts = self.calls.options(task)
        if type(opts.cost) is not int:  # callable, or per meter
            return False
        lane = self._lane(self.calls.route(task, info), task, opts)
        if lane is None or (lane.fair and self.fair.in_use(lane.fair)):
            return False
        limiters = lane.limiters
        if lane.key is not None:
            try:
                subject = subject_text(call_with_arguments(task, opts.key, args, kwargs))
            except Exception:  # the long way raises it, naming the task
                return False
            limiters = lane.with_key(subject)
        if lane.caps:
            return self._slotted(task, request, args, kwargs, opts.cost, limiters, lane.caps)
        leases = self.decider.leases
        told = signals.task_admitted.receivers or logger.isEnabledFor(logging.DEBUG)
        if not told and leases.use(limiters, opts.cost):  # the usual admission: nothing to tell
            self.admitted += 1
            return True
        outcome = leases.take(limiters, opts.cost) or leases.grant(limiters, opts.cost)
        if outcome is None:  # no room known, or too little: the decider asks Redis
            return False
        self.admitted += 1
        if told:
            specs = [spec for _, spec in limiters]
            call = Call(task, request, args, kwargs, specs, opts.cost, WaitState())
            self._admitted(call, outcome)
        return True

    def _slotted(
        self,
        task: Any,
        request: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        cost: int,
        limiters: list[tuple[Limiter, LimitSpec]],
        caps: list[tuple[Limiter, LimitSpec]],
    ) -> bool:
        """The short way of a call with concurrency caps: while this process carries a slot
        of each cap from its previous task (the caps have room), the other limits from leases
        and the slots in one script each, which gives the carried slot back. False: the long
        way (no slot carried, no lease with room, or a cap turned it away: rare with room)."""
        carried = self.carried
        if not all(carried.holds(lim, spec.subject) for lim, spec in caps):
            return False
        retries = getattr(request, "retries", None) or 0
        who = Who(f"{request.id}:{retries}", new_token(), holder_info(request))
        handed: Handed = []
        try:
            outcome = self.decider.leased_with_caps([*limiters, *caps], caps, cost, who, handed)
        finally:
            if handed:
                self.handover.publish(handed)
        if outcome is None or not outcome.allowed:
            return False
        self.admitted += 1
        self.holding.hold(task, request, None, outcome.held)
        if signals.task_admitted.receivers or logger.isEnabledFor(logging.DEBUG):
            specs = [spec for _, spec in limiters] + [spec for _, spec in caps]
            self._admitted(Call(task, request, args, kwargs, specs, cost, WaitState()), outcome)
        return True

    def _lane(self, route: Route, task: Any, opts: TaskOptions) -> LeaseLane | None:
        """How a route's calls are admitted from leases (see :mod:`.lanes`), or None (the long
        way); worked out once per route and Redis client (a forked process makes its own)."""
        client = self.store.client
        lane = route.lane
        if lane is None or lane[0] is not client:
            lane = route.lane = (client, self._new_lane(client, route, task, opts))
        found: LeaseLane | None = lane[1]
        return found

    def _new_lane(
        self, client: Any, route: Route, task: Any, opts: TaskOptions
    ) -> LeaseLane | None:
        if route.shadows:
            return None
        limiters = self.decider.limiters(list(route.specs))
        key = None
        if opts.key_config is not None:
            name = getattr(task, "governor_name", None) or task.name
            spec = LimitSpec("key", name, opts.key_config, "")
            _, factors = self.live.current()
            if spec.config.adaptive and spec.label in factors:  # its rate moves call by call
                return None
            [spec] = self.live.apply([spec])
            if spec.config.shadow or spec.config.fair_by is not None:
                return None
            key = (self.store.limiter(spec.name, spec.config), spec)
        caps = [(lim, spec) for lim, spec in limiters if slot_only(lim)]
        limiters = [(lim, spec) for lim, spec in limiters if not slot_only(lim)]
        pairs = limiters if key is None else [*limiters, key]
        if not (pairs or caps) or not all(leasable(lim) for lim, _ in pairs):
            return None
        fair = tuple((s.name, s.subject) for s in route.specs if s.config.fair_by is not None)
        return LeaseLane(client, limiters, key, fair, caps)

    def back_off(
        self, task: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], exc: Backoff
    ) -> Deferred:
        """The body raised Backoff: pause its limit for every worker and send the task to run
        again behind the pause (see :mod:`..feedback.pausing`). Returns the Deferred to raise."""
        call = self.calls.call(task, task.request, args, kwargs)
        reservation = self.reservations.of(task.request.id)
        if reservation is not None:  # the upstream refused it: nothing was used, then its view
            every = {m for lim, _, _ in reservation.held for m in lim.meters}
            self.reservations.settle(task.request.id, dict.fromkeys(every, 0))
            quotas = getattr(exc, "quotas", None)
            if quotas:
                sync_quotas(task, reservation.held, quotas, limit=exc.limit)
        return self.pausing.pause(call, exc)

    def _decide(self, call: Call) -> Deferred | None:
        """Admit the call, or send it to wait: for a moment, or in a full cap's line."""
        queued = self.fair.behind(call)
        if queued is not None:
            return queued
        who = who_for(call)
        if not isinstance(call.cost, int):  # per meter: a call that can never run fails now
            costs.check(call.task.name, call.cost, self.decider.limiters(call.specs))
        for _attempt in range(3):
            try:
                outcome = self.decider.decide(
                    call.specs, call.cost, call.state, lease=True, who=who
                )
            except CostError as exc:
                raise CostError(f"task {call.task.name!r} [{call.request.id}]: {exc}") from None
            call.state.outages = 0
            if outcome.allowed:
                self.admitted += 1
                self.holding.take(call, outcome)
                self.reservations.keep(call, outcome.held)
                self._admitted(call, outcome)
                return None
            label = outcome.spec.label if outcome.spec else "governor"
            self._check_wait(call, outcome, label)
            fair = fair_spec(call)
            decision = outcome.decision
            if fair is not None and outcome.spec == fair and decision and decision.rule:
                if self.fair.sent_early(call, decision.retry_after):
                    continue  # sent on just ahead of its room: it waited the rest
                return self.fair.wait(call, outcome, fair)  # a rate: wait in its queue
            if outcome.decision is None or outcome.decision.capped is None:
                return self.republisher.republish(call, outcome, label)
            call.state.slots = None  # a full cap gave the bookings back
            deferred = self.cap_line.wait(call, outcome, label)
            if deferred is not None:
                return deferred
        # a slot kept freeing and going to others: come back in a moment
        return self.republisher.republish(call, Outcome(False, delay=0.05), label)

    def _first_copy(self, call: Call) -> bool:
        """A released copy of a parked task claims its parking id: False for a second copy
        (dropped), True otherwise (the id is then forgotten: it is used up)."""
        state, request = call.state, call.request
        if state.parked is None:
            return True
        if not parking.claim_first_delivery(
            self.client, self.settings.prefix, state.parked, state.release
        ):
            logger.info("governor: %s dropped: a second copy of a released task", call.name)
            return False
        state.parked = state.release = None
        request.headers[HEADER] = state.header()
        return True

    def _unavailable(self, call: Call, exc: StorageUnavailable) -> Deferred | None:
        """Redis is away: run ungoverned (fail open) or come back after a backoff (closed)."""
        fail_mode = self.settings.fail_mode
        signals.storage_unavailable.send(
            sender=call.task, request=call.request, error=exc, fail_mode=fail_mode
        )
        if fail_mode == "open":
            logger.warning("governor: Redis unavailable, running %s ungoverned: %s", call.name, exc)
            return None
        state = call.state
        state.outages += 1
        delay = min(300.0, self.settings.outage_retry * 2 ** (state.outages - 1))
        delay *= random.uniform(1.0, 1.25)
        if self.settings.park_after is not None:  # parking needs Redis: stay a short ETA
            delay = min(delay, self.settings.park_after)
        logger.warning(
            "governor: Redis unavailable, %s retries in %.1fs: %s", call.name, delay, exc
        )
        return self.republisher.republish(call, Outcome(False, delay=delay), "redis")

    def _check_wait(self, call: Call, outcome: Outcome, label: str) -> None:
        """Fail a call that can never run, or that would wait longer than its max_wait (a
        wait for a concurrency slot has no known length: only the time waited so far counts)."""
        decision = outcome.decision
        if decision is not None and decision.capped is not None:
            max_wait = self.calls.max_wait(call.task)
            if max_wait is not None and waited_so_far(call.state, outcome) > max_wait:
                raise GovernorTimeout(
                    f"task {call.task.name!r} [{call.request.id}] waited "
                    f"{waited_so_far(call.state, outcome):.1f}s in total, more than "
                    f"governor_max_wait={max_wait}s, and {label} has no free slot"
                )
            return
        if decision is not None and decision.retry_after == math.inf:
            raise GovernorError(
                f"task {call.task.name!r} costs {call.cost}, more than rule {decision.rule} of "
                f"limit {label} allows: it can never run"
            )
        max_wait = self.calls.max_wait(call.task)
        if too_long(max_wait, call.state, outcome):
            self.decider.refund(outcome.held, call.cost)
            raise GovernorTimeout(
                f"task {call.task.name!r} [{call.request.id}] would wait "
                f"{waited_so_far(call.state, outcome) + outcome.delay:.1f}s in total for {label}, "
                f"more than governor_max_wait={max_wait}s"
            )

    def _admitted(self, call: Call, outcome: Outcome) -> None:
        state, request = call.state, call.request
        if state.slots is not None or state.since is not None or state.woken is not None:
            # used up: a retry of this task (self.retry copies the headers) must neither claim
            # these bookings nor count its governance wait from this one's first deferral
            request.headers[HEADER] = {
                **state.header(),
                "slots": None,
                "booked": None,
                "since": None,
                "woken": None,
            }
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "governor: %s admitted by %s after %d waits",
                call.name,
                ", ".join(s.label for s in call.specs),
                state.waits,
            )
        if not signals.task_admitted.receivers:  # no one listens: nothing to work out for it
            return
        lateness = None
        if state.slots is not None:
            lateness = max(d.now - d.slot.start for _, _, d in outcome.held if d.slot)
        # when the rules counted it: a booking's slot start; an admission's slot starts at its
        # decision's time (limits with only a concurrency cap count no rate)
        counted = [d.slot.start if d.slot else d.now for _, s, d in outcome.held if s.config.rules]
        labels = [s.label for s in call.specs]
        spec = fair_spec(call)
        fair = None
        if spec is not None and state.since is not None:
            fair = (spec.label, spec.tenant or "", time.time() - state.since)
        signals.task_admitted.send(
            sender=call.task,
            request=request,
            limits=labels,
            waits=state.waits,
            lateness=lateness,
            fair=fair,
            counted_at=min(counted, default=None),
        )


def who_for(call: Call) -> Who | None:
    """Who holds the concurrency slots the call's admission takes (None: no cap governs it)."""
    if not any(s.config.concurrency is not None for s in call.specs):
        return None
    return Who(holder_of(call), new_token(), holder_info(call.request))
