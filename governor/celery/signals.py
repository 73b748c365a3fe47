"""Signals sent by governed tasks, for metrics and logging (Celery's own dispatcher).

>>> from governor.celery import signals
>>> @signals.task_deferred.connect
... def count(sender, delay, limit, **kw): ...

All are sent in the process that took the decision (a pool process for the gate, the worker's
main process for the releaser). Receivers must be quick; their exceptions are logged.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "limit_adapted",
    "limit_paused",
    "live_limits_changed",
    "message_dead_lettered",
    "quota_synced",
    "shadow_denied",
    "slot_acquired",
    "slot_lost",
    "slot_released",
    "storage_unavailable",
    "task_admitted",
    "task_deferred",
    "task_parked",
    "task_released",
    "task_settled",
    "units_reserved",
]

task_admitted = Signal(
    name="governor.task_admitted",
    providing_args={"request", "limits", "waits", "lateness", "fair", "counted_at"},
)
"""A governed task may run. ``limits``: the limit labels that admitted it; ``waits``: how many
times it waited before; ``lateness``: for a task that started on a booked slot, how long after
the slot opened it started (seconds), else None; ``fair``: under a fair limit, (its label, the
tenant, seconds since the call first waited), else None; ``counted_at``: when the rules
counted this admission (Unix seconds, Redis's clock): the start of the booked slot it started
on, else the time of the decision that admitted it (the earliest over its limits), None when no
rate limit counted it (only concurrency caps). These are the times the rules hold on; the body
starts a moment later, a moment that varies on a busy machine, so the bodies' own start times
may bunch up a little more than the rules allow."""

task_deferred = Signal(
    name="governor.task_deferred",
    providing_args={"request", "limit", "rule", "delay", "booked", "blocked", "capped"},
)
"""A governed task was re-published to run ``delay`` seconds later. ``limit``: the label of the
limit that made it wait (``queue:emails``, ``task:proj.sync``, ``proj.call_partner``); ``rule``:
the rule (or None for a booking queue or block); ``booked``: whether a slot was reserved.
``capped``: ``"full"`` when it waits in a concurrency cap's line (``delay`` is then None: it
runs when a slot is handed to it), ``"copy"`` when a running copy of it holds the slot, else
None."""

slot_acquired = Signal(
    name="governor.slot_acquired", providing_args={"request", "limits", "handover"}
)
"""A governed task took concurrency slots (``limits``: their labels) and starts its body.
``handover``: for a task that waited in line, seconds from the hand-over of its slot to its
start, else None."""

slot_released = Signal(name="governor.slot_released", providing_args={"request", "limits", "held"})
"""A governed task gave its concurrency slots back at the end of its body (``held``: seconds)."""

slot_lost = Signal(name="governor.slot_lost", providing_args={"limit", "holder"})
"""A running task's concurrency slot may have gone to another task: its lease ran out without
a renewal (Redis away longer than the lease) or Redis no longer holds it. Sent in the process
running the body; the body is not interrupted (see the README)."""

limit_paused = Signal(
    name="governor.limit_paused",
    providing_args={"request", "limit", "until", "seconds", "reason", "level"},
)
"""A task raised :class:`~governor.celery.Backoff`: ``limit`` (a label) is paused for every
worker until ``until`` (Unix seconds, Redis's clock), ``seconds`` from now. ``level``: how many
exponential pauses in a row (0 for a pause the upstream timed). ``until`` may be later than
asked: a longer pause or block was already in place."""

limit_adapted = Signal(name="governor.limit_adapted", providing_args={"request", "limit", "factor"})
"""An adaptive limit's rate was lowered after a Backoff: it now allows ``factor`` (0 to 1) of
its rules, climbing back with time (see :mod:`governor.celery.config.factors`)."""

live_limits_changed = Signal(
    name="governor.live_limits_changed", providing_args={"labels", "limits"}
)
"""This process picked up a change of the live limits (``governor limits set/reset``):
``labels`` changed; ``limits``: every live limit now, label -> rules text. Sent once per
process and change, on its next decision."""

units_reserved = Signal(name="governor.units_reserved", providing_args={"request", "reserved"})
"""An admitted task reserved units under limits with meters: ``reserved`` is, per limit label,
the units per meter its estimate counted."""

task_settled = Signal(
    name="governor.task_settled",
    providing_args={"request", "limit", "reserved", "settled", "refunded", "overrun"},
)
"""A task settled its reservation under ``limit`` (a label): per meter, the units it
``reserved``, the units it reported (``settled``), the units given back to their windows
(``refunded``) and the units charged beyond the estimate (``overrun``)."""

quota_synced = Signal(
    name="governor.quota_synced", providing_args={"limit", "meter", "remaining", "charged"}
)
"""The upstream reported ``remaining`` units of ``meter`` for ``limit``, less room than governor
counted: ``charged`` units were counted for every worker (``observe``, or a Backoff's headers)."""

shadow_denied = Signal(
    name="governor.shadow_denied", providing_args={"request", "limit", "rule", "delay"}
)
"""A shadow limit (``"shadow": True``) would have deferred this call by ``delay`` seconds
under ``rule``; the call runs anyway."""

task_parked = Signal(name="governor.task_parked", providing_args={"request", "due"})
"""A deferred task was parked in Redis instead of the broker, due at ``due`` (Unix seconds)."""

task_released = Signal(name="governor.task_released", providing_args={"count", "queue"})
"""The releaser re-published ``count`` parked tasks."""

message_dead_lettered = Signal(
    name="governor.message_dead_lettered",
    providing_args={"kind", "source", "reason", "count", "again"},
)
"""A waiting task's message could not be read or published and went to the dead-letter place
(see :mod:`governor.celery.waiting.dead_letters`): ``kind`` is ``parked``, ``fair`` or ``cap``;
``source`` names where it waited; ``count``: letters held now; ``again``: the same entry was
put there before (its mover died between the two steps, or a cap's line handed it over again).
Sent by the process that moved it (the releaser or fair dispatcher of a worker's main process,
or the process that handed it a slot)."""

storage_unavailable = Signal(
    name="governor.storage_unavailable", providing_args={"request", "error", "fail_mode"}
)
"""Redis could not be reached for a decision; ``fail_mode`` says what happened to the task."""
