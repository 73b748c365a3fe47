"""The admission gate: runs in the pool process right before a governed task's body.

A call is governed by up to three limits (queue, task, key). The gate admits it only when all
of them do, atomically per limit and with what was taken given back when another denies. When
the algorithms can book (sliding_log, gcra), a denied call books the earliest moment every limit
admits it and is re-published to run then; it proves its booking on arrival (``claim``), so it is
not denied again. Otherwise it is re-published after the exact ``retry_after``.

Re-publishing keeps the task id, arguments, headers, priority, route, links and ``retries``
(governance waits never count as retries); the original message is acknowledged only after the
new one is out (the task raises :class:`Deferred`, an ``Ignore``, which Celery acks).
"""

from __future__ import annotations

import logging
import math
import os
import random
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
from celery.exceptions import Reject
from kombu.exceptions import OperationalError as BrokerError

from ..errors import GovernorError, GovernorTimeout, StorageUnavailable
from ..limiter import Limiter
from . import parking, signals
from .decide import Held, Outcome, acquire_all, claim_all, refund, reserve_all
from .early import EarlyDeferral
from .leases import Leases
from .limits import (
    LimitSpec,
    call_with_arguments,
    consumed_queue,
    key_config,
    key_spec,
    option,
    task_limit_config,
)
from .settings import LimitConfig, Settings
from .waits import HEADER, Deferred, Duplicate, WaitState

__all__ = ["Deferred", "Duplicate", "Gate", "WaitState"]

logger = logging.getLogger("governor.celery")
SUMMARY_EVERY = 10.0
TRANSIENT = (StorageUnavailable, redis.RedisError, BrokerError, OSError)
"""Errors that may pass: a re-publish that fails with one keeps the original message."""


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """What governs a task, from settings and its ``governor_*`` attributes."""

    task_spec: LimitSpec | None
    key_config: LimitConfig | None
    cost: Any
    max_wait: float | None


class Gate:
    """governor's per-process state: one Redis client, the limiters, the decisions."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._pid: int | None = None
        self._client: redis.Redis | None = None
        self._limiters: dict[tuple[str, LimitConfig], Limiter] = {}
        self._options: dict[str, TaskOptions] = {}
        self._fixed: dict[tuple[Any, ...], tuple[LimitSpec, ...]] = {}
        self._deferrals: Counter[str] = Counter()
        self._longest = 0.0
        self._summary_at = time.monotonic()
        self.early = EarlyDeferral(self)
        self.leases = Leases(settings.lease_span)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def client(self) -> redis.Redis:
        if self._client is None or self._pid != os.getpid():
            self._client = redis.Redis.from_url(
                self.settings.require_redis(),
                socket_timeout=self.settings.socket_timeout,
                socket_connect_timeout=self.settings.socket_timeout,
            )
            self._pid = os.getpid()
        return self._client

    def limiter(self, name: str, config: LimitConfig) -> Limiter:
        lim = self._limiters.get((name, config))
        if lim is None or lim.client is not self.client:
            lim = Limiter(
                self.client,
                config.rules,
                algorithm=config.algorithm,
                name=name,
                prefix=self.settings.prefix,
            )
            self._limiters[(name, config)] = lim
        return lim

    def options(self, task: Any) -> TaskOptions:
        """A task's governor options, read once per task (they are fixed after start-up)."""
        opts = self._options.get(task.name)
        if opts is None:
            wait = getattr(task, "governor_max_wait", None) or self.settings.max_wait
            task_config = task_limit_config(task, self.settings)
            opts = TaskOptions(
                task_spec=None
                if task_config is None
                else LimitSpec("task", "task", task_config, task.name),
                key_config=key_config(task, self.settings),
                cost=option(task, "governor_cost", 1),
                max_wait=None if wait is None else float(wait),
            )
            self._options[task.name] = opts
        return opts

    def fixed_specs(self, task: Any, delivery_info: Mapping[str, Any] | None) -> list[LimitSpec]:
        """The limits that do not depend on the arguments: the queue's, then the task's
        (worked out once per task and route: every message asks, in both processes)."""
        info = delivery_info or {}
        route = (task.name, info.get("routing_key"), info.get("exchange"), info.get("queue"))
        specs = self._fixed.get(route)
        if specs is None:
            out = []
            queue = consumed_queue(self.app, delivery_info)
            if queue is not None and queue in self.settings.queues:
                out.append(LimitSpec("queue", "queue", self.settings.queues[queue], queue))
            opts = self.options(task)
            if opts.task_spec is not None:
                out.append(opts.task_spec)
            specs = tuple(out)
            if len(self._fixed) > 10_000:  # routing keys are open-ended (topic exchanges)
                self._fixed.clear()
            self._fixed[route] = specs
        return list(specs)

    def specs(
        self, task: Any, request: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> list[LimitSpec]:
        """Every limit that governs this call, queue first."""
        out = self.fixed_specs(task, getattr(request, "delivery_info", None))
        config = self.options(task).key_config
        if config is not None:
            out.append(key_spec(task, config, args, kwargs))
        return out

    def governs(self, task: Any, delivery_info: Mapping[str, Any] | None) -> bool:
        """Whether a message may be governed (checked in the worker's main process)."""
        return bool(self.fixed_specs(task, delivery_info)) or (
            self.options(task).key_config is not None
        )

    def cost(self, task: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
        cost = self.options(task).cost
        return int(call_with_arguments(task, cost, args, kwargs)) if callable(cost) else cost

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
        state = WaitState.from_request(request)
        specs = self.specs(task, request, args, kwargs)
        if not specs and state.parked is None:
            return None
        cost = self.cost(task, args, kwargs) if specs else 0
        try:
            if state.parked is not None:
                if not parking.claim_first_delivery(
                    self.client, self.settings.prefix, state.parked, state.release
                ):
                    logger.info(
                        "governor: %s[%s] dropped: a second copy of a released task",
                        task.name,
                        request.id,
                    )
                    return Duplicate(f"governor: second copy of parked task {state.parked}")
                state.parked = state.release = None
                request.headers[HEADER] = state.header()
            if not specs:
                return None
            outcome = self.decide(specs, cost, state, lease=True)
        except StorageUnavailable as exc:
            signals.storage_unavailable.send(
                sender=task, request=request, error=exc, fail_mode=self.settings.fail_mode
            )
            if self.settings.fail_mode == "open":
                logger.warning(
                    "governor: Redis unavailable, running %s[%s] ungoverned: %s",
                    task.name,
                    request.id,
                    exc,
                )
                return None
            state.outages += 1
            delay = min(300.0, self.settings.outage_retry * 2 ** (state.outages - 1))
            delay *= random.uniform(1.0, 1.25)
            if self.settings.park_after is not None:  # parking needs Redis: stay a short ETA
                delay = min(delay, self.settings.park_after)
            logger.warning(
                "governor: Redis unavailable, %s[%s] retries in %.1fs: %s",
                task.name,
                request.id,
                delay,
                exc,
            )
            return self.republish(
                task, request, args, kwargs, state, Outcome(False, delay=delay), "redis", cost
            )
        state.outages = 0
        if outcome.allowed:
            self._admitted(task, request, specs, state, outcome)
            return None
        label = outcome.spec.label if outcome.spec else "governor"
        decision = outcome.decision
        if decision is not None and decision.retry_after == math.inf:
            raise GovernorError(
                f"task {task.name!r} costs {cost}, more than rule {decision.rule} of limit "
                f"{label} allows: it can never run"
            )
        if self.too_long(task, state, outcome):
            self.refund(outcome.held, cost)
            raise GovernorTimeout(
                f"task {task.name!r} [{request.id}] would wait "
                f"{self._waited(state, outcome) + outcome.delay:.1f}s in total for {label}, "
                f"more than governor_max_wait={self._max_wait(task)}s"
            )
        return self.republish(task, request, args, kwargs, state, outcome, label, cost)

    def defer_early(self, req: Any) -> bool:
        """In the worker's main process: defer a message known to be denied before it reaches
        the pool (see :mod:`governor.celery.early`). True if it was deferred."""
        return self.early.defer(req)

    def _max_wait(self, task: Any) -> float | None:
        wait: float | None = self.options(task).max_wait
        return wait

    @staticmethod
    def _waited(state: WaitState, outcome: Outcome) -> float:
        now = outcome.now or time.time()
        return now - state.since if state.since is not None else 0.0

    def too_long(self, task: Any, state: WaitState, outcome: Outcome) -> bool:
        """Whether this wait would take the task past its ``governor_max_wait`` in total."""
        max_wait = self._max_wait(task)
        return max_wait is not None and self._waited(state, outcome) + outcome.delay > max_wait

    def _admitted(
        self, task: Any, request: Any, specs: list[LimitSpec], state: WaitState, outcome: Outcome
    ) -> None:
        lateness = None
        if state.slots is not None:
            lateness = max(d.now - d.slot.start for _, _, d in outcome.held if d.slot)
        if state.slots is not None or state.since is not None:
            # used up: a retry of this task (self.retry copies the headers) must neither claim
            # these bookings nor count its governance wait from this one's first deferral
            request.headers[HEADER] = {**state.header(), "slots": None, "since": None}
        signals.task_admitted.send(
            sender=task,
            request=request,
            limits=[s.label for s in specs],
            waits=state.waits,
            lateness=lateness,
        )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "governor: %s[%s] admitted by %s after %d waits",
                task.name,
                request.id,
                ", ".join(s.label for s in specs),
                state.waits,
            )

    def decide(
        self, specs: list[LimitSpec], cost: int, state: WaitState, *, lease: bool = False
    ) -> Outcome:
        """One answer for a call under ``specs``; ``lease``: the task starts right after an
        admission (the pool), so it may come from a lease (see :mod:`.leases`)."""
        limiters = [(self.limiter(s.name, s.config), s) for s in specs]
        if not all(lim.algorithm.books for lim, _ in limiters):
            return acquire_all(limiters, cost)
        if state.slots:
            outcome = claim_all(
                limiters, cost, state.slots, self.settings.late_tolerance, self.settings.early_sleep
            )
            if outcome is not None:
                return outcome
        elif lease:
            outcome = self.leases.take(limiters, cost) or self.leases.grant(limiters, cost)
            if outcome is not None:
                return outcome
        outcome = self.reserve_all(limiters, cost)
        if lease:
            self.leases.observe(outcome.held)
        return outcome

    def refund(self, held: Held, cost: int) -> None:
        refund(held, cost)

    def reserve_all(
        self,
        limiters: list[tuple[Limiter, LimitSpec]],
        cost: int,
        not_before: float | None = None,
    ) -> Outcome:
        return reserve_all(limiters, cost, self.settings.late_tolerance, not_before)

    # -- re-publishing ----------------------------------------------------------------------

    def republish(
        self,
        task: Any,
        request: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        state: WaitState,
        outcome: Outcome,
        label: str,
        cost: int,
    ) -> Deferred:
        """Re-publish the call to run after the outcome's delay; the Deferred says why.

        Raises Reject (requeue) if the broker refuses: the original message is kept, and what
        this decision booked is given back.
        """
        if state.since is None:
            state.since = outcome.now or time.time()
        state.slots = outcome.slots
        state.waits += 1
        delay = max(0.0, outcome.delay - (time.monotonic() - outcome.at))
        park = self.settings.park_after is not None and delay > self.settings.park_after
        # a booked task arrives a little early and closes in on its slot (Settings.lead)
        lead = self.settings.lead if outcome.slots else 0.0
        if park:
            state.parked = f"{request.id}:{state.waits}:{secrets.token_hex(4)}"
        sig = task.signature_from_request(
            request,
            args,
            kwargs,
            countdown=None if park else max(0.0, delay - lead),
            retries=request.retries,
        )
        sig.options["headers"] = {**(sig.options.get("headers") or {}), HEADER: state.header()}
        try:
            if park:
                due = (outcome.now or time.time()) + outcome.delay
                parking.park(
                    self.client,
                    self.settings.prefix,
                    str(state.parked),
                    due,
                    parking.envelope(self.app, sig, due, label),
                )
                signals.task_parked.send(sender=task, request=request, due=due, limit=label)
            else:
                sig.apply_async()
        except TRANSIENT as exc:  # the broker (or Redis) is away: keep the original message
            self.refund(outcome.held, cost)
            logger.error(
                "governor: could not re-publish %s[%s], requeued: %r", task.name, request.id, exc
            )
            raise Reject(exc, requeue=True) from exc
        except Exception as exc:  # it can never be re-published (say, it cannot be serialized)
            self.refund(outcome.held, cost)
            raise GovernorError(
                f"task {task.name!r} [{request.id}] must wait {delay:.1f}s for {label}, but "
                f"re-publishing it failed: {exc!r}"
            ) from exc
        rule = outcome.decision.rule if outcome.decision is not None else None
        blocked = outcome.decision.blocked if outcome.decision is not None else None
        signals.task_deferred.send(
            sender=task,
            request=request,
            limit=label,
            rule=rule,
            delay=delay,
            booked=bool(outcome.slots),
            blocked=blocked,
        )
        self._note(task, request, label, rule, delay, state)
        why = f"blocked ({blocked})" if blocked is not None else f"{label} {rule or ''}".strip()
        return Deferred(f"governor: waits {delay:.3f}s for {why} (wait {state.waits})")

    def _note(
        self, task: Any, request: Any, label: str, rule: Any, delay: float, state: WaitState
    ) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "governor: %s[%s] deferred %.3fs by %s %s (wait %d)",
                task.name,
                request.id,
                delay,
                label,
                rule or "",
                state.waits,
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
