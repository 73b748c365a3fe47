"""Submit a batch under caps: every call is booked before it is sent, so none is ever denied.

>>> from governor.celery import submit_batch
>>> results = submit_batch(sync_account.s(account) for account in accounts)

Each call books the earliest moment every limit that governs it admits it (its queue's quota,
its task rules, its per-key rule), one after another, so the batch runs as early as the rules
allow and in order. A call due within ``governor_park_after`` is published with that ETA and
its booking; a later one is parked in Redis and released when nearly due. Compare
``governor plan`` (the same schedule, offline) and ``governor submit`` (this, with a progress
bar). Under a fair limit (``fair_by``) nothing is booked: the calls are sent at once and
wait in the limit's fair queue, so a batch takes its tenant's share, not the whole quota.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from celery import Signature
from celery.result import AsyncResult

from ..errors import ConfigError
from . import registry, signals
from .config.task_limits import key_spec
from .types import HEADER, WaitState
from .waiting import parking
from .waiting.envelope import envelope

__all__ = ["submit_batch"]

Progress = Callable[[int, float | None], None]


def _queue_of(app: Any, sig: Signature) -> str:
    queue = sig.options.get("queue")
    if queue:
        return str(getattr(queue, "name", queue))
    route = app.amqp.router.route(dict(sig.options), sig.task, sig.args, sig.kwargs)
    queue = route.get("queue")
    return str(getattr(queue, "name", queue or app.conf.task_default_queue))


def submit_batch(
    signatures: Iterable[Signature],
    *,
    start_in: float = 1.0,
    progress: Progress | None = None,
) -> list[AsyncResult]:
    """Book and send every call; returns their results in order.

    ``start_in``: seconds from now before the first call may start, to cover publishing and
    delivery (a booking is only honoured within ``governor_late_tolerance`` of its slot).
    ``progress(done, due)`` is called after each call (``due``: when it is booked to start,
    Unix seconds, or None when no limit governs it).
    """
    results: list[AsyncResult] = []
    for done, sig in enumerate(signatures, 1):
        result, due = _submit(sig, start_in)
        results.append(result)
        if progress is not None:
            progress(done, due)
    return results


def _submit(sig: Signature, start_in: float) -> tuple[AsyncResult, float | None]:
    if not isinstance(sig, Signature):
        raise ConfigError(f"submit_batch takes task signatures (task.s(...)), got {sig!r}")
    app = sig.app
    task = app.tasks[sig.task]
    governor = registry.of(app)
    gate = governor.gate
    calls, decider = gate.calls, gate.decider
    queue = _queue_of(app, sig)
    args, kwargs = tuple(sig.args), dict(sig.kwargs)
    specs = calls.fixed_specs(task, {"queue": queue})
    key_config = calls.options(task).key_config
    if key_config is not None:
        specs.append(key_spec(task, key_config, args, kwargs))
    if not specs:
        return sig.apply_async(), None
    if any(s.config.fair_by is not None for s in specs):
        # a fair limit books nothing ahead (a booking would be a place taken from the other
        # tenants): the call waits in its fair queue, placed by its tenant (see .fairness)
        return sig.apply_async(queue=queue), None
    cost = calls.cost(task, args, kwargs)
    if cost == 0:  # it costs nothing: nothing to book (see admission.calls.units)
        return sig.apply_async(queue=queue), None
    limiters = decider.limiters(specs)
    if not all(lim.books for lim, _ in limiters):
        raise ConfigError(
            f"submit_batch books slots, which {', '.join(s.label for s in specs)} cannot do "
            "(use sliding_log or gcra for the limits that govern it)"
        )
    now = time.time()
    outcome = decider.reserve_all(limiters, cost, not_before=now + start_in)
    if outcome.allowed and outcome.now is not None:
        # admitted at once (this clock is behind Redis by more than start_in): that admission
        # would be spent twice (here and on arrival); book by the Redis clock instead
        decider.refund(outcome.held, cost)
        outcome = decider.reserve_all(limiters, cost, not_before=outcome.now + start_in)
    if outcome.allowed:  # start_in=0 and room now: the gate admits it on arrival
        decider.refund(outcome.held, cost)
        return sig.apply_async(queue=queue), None
    decision = outcome.decision
    if decision is not None and decision.retry_after == math.inf:
        raise ConfigError(
            f"{sig.task} costs {cost}, more than rule {decision.rule} of limit "
            f"{outcome.spec.label if outcome.spec else '?'} allows: it can never run"
        )
    if decision is not None and decision.blocked is not None and not outcome.slots:
        raise ConfigError(
            f"{outcome.spec.label if outcome.spec else '?'} is blocked "
            f"({decision.blocked or 'no reason given'}): lift it with governor unblock"
        )
    if not outcome.slots:  # contention kept moving the target: let the gate decide on arrival
        return sig.apply_async(queue=queue), None
    server_now = outcome.now or now
    due = server_now + outcome.delay
    state = WaitState(waits=0, since=None, slots=outcome.slots)
    options = dict(sig.options)
    options["headers"] = {**(options.get("headers") or {}), HEADER: state.header()}
    options["queue"] = queue
    settings = governor.settings
    label = outcome.spec.label if outcome.spec else "batch"
    if settings.park_after is not None and outcome.delay > settings.park_after:
        task_id = options.get("task_id") or sig.id or _new_id()
        options["task_id"] = task_id
        state.parked = parking.new_parking_id(
            f"{task_id}:0:{secrets.token_hex(4)}", settings.parking_shards
        )
        options["headers"][HEADER] = state.header()
        placed = sig.clone(**options)
        placed.options.pop("countdown", None)
        try:
            parking.park(
                gate.client,
                settings.prefix,
                state.parked,
                due,
                envelope(app, placed, due, label),
                settings.park_replicas,
                settings.park_replica_timeout,
            )
        except Exception:
            decider.refund(outcome.held, cost)
            raise
        signals.task_parked.send(sender=task, request=None, due=due, limit=label)
        result = AsyncResult(task_id, app=app)
    else:
        try:
            result = sig.apply_async(
                countdown=max(0.0, due - server_now - settings.lead),
                **{k: v for k, v in options.items() if k != "countdown"},
            )
        except Exception:
            decider.refund(outcome.held, cost)
            raise
    return result, due


def _new_id() -> str:
    from celery.utils import uuid

    return str(uuid())
