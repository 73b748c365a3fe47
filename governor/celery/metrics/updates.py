"""Which signal updates which metric (:data:`UPDATES`; receivers: :mod:`.metrics`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import signals
from ..config.task_limits import consumed_queue
from .definitions import Metrics

__all__ = ["UPDATES"]


def _rule_label(rule: Any, blocked: Any) -> str:
    if blocked is not None:
        return "blocked"
    if rule is None:
        return "none"
    return str(getattr(rule, "text", rule))


def _queue_label(sender: Any, kwargs: dict[str, Any]) -> str:
    queue = kwargs.get("queue")
    if queue is None:
        info = getattr(kwargs.get("request"), "delivery_info", None) or {}
        app = getattr(sender, "app", None)
        queue = consumed_queue(app, info) if app is not None else info.get("routing_key")
    return str(queue) if queue else "unknown"


def _admitted(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    for label in kw.get("limits") or ():
        m.admitted.labels(str(label)).inc()
    lateness = kw.get("lateness")
    if lateness is not None:
        m.lateness.observe(max(0.0, float(lateness)))
    fair = kw.get("fair")
    if m.tenant_wait is not None and fair:
        limit, tenant, waited = fair
        label = m.tenant(str(limit), str(tenant))
        m.tenant_wait.labels(str(limit), label).observe(max(0.0, float(waited)))


def _deferred(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    limit = str(kw.get("limit") or "unknown")
    rule = _rule_label(kw.get("rule"), kw.get("blocked"))
    if kw.get("capped"):
        rule = "concurrency"
    m.deferred.labels(limit, rule, "true" if kw.get("booked") else "false").inc()
    delay = kw.get("delay")
    if delay is not None:
        m.delay.labels(limit).observe(max(0.0, float(delay)))


def _parked(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    m.parked.labels(_queue_label(sender, kw)).inc()


def _released(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    count = int(kw.get("count") or 0)
    if count > 0:
        m.released.labels(_queue_label(sender, kw)).inc(count)


def _unavailable(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    m.unavailable.labels(str(kw.get("fail_mode") or "unknown")).inc()


def _slot_acquired(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    handover = kw.get("handover")
    for label in kw.get("limits") or ():
        m.running.labels(str(label)).inc()
        if handover is not None:
            m.handover.labels(str(label)).observe(max(0.0, float(handover)))


def _slot_released(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    for label in kw.get("limits") or ():
        m.running.labels(str(label)).dec()


def _slot_lost(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    m.slots_lost.labels(str(kw.get("limit") or "unknown")).inc()


def _paused(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    timed = "false" if kw.get("level") else "true"
    m.pauses.labels(str(kw.get("limit") or "unknown"), timed).inc()


def _shadow_denied(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    m.shadow_denied.labels(
        str(kw.get("limit") or "unknown"), _rule_label(kw.get("rule"), None)
    ).inc()


def _adapted(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    label = str(kw.get("limit") or "unknown")
    m.adaptive_decreases.labels(label).inc()
    m.adaptive_factor.labels(label).set(float(kw.get("factor") or 0.0))


def _live_changed(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    for label in kw.get("labels") or ():
        m.live_changes.labels(str(label)).inc()


def _dead_lettered(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    if not kw.get("again"):
        m.dead_lettered.labels(str(kw.get("kind") or "unknown")).inc()
    count = kw.get("count")
    if count is not None:
        m.dead_letters.set(float(count))


def _reserved(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    for label, units in (kw.get("reserved") or {}).items():
        for meter, n in units.items():
            if n:
                m.meter_units.labels(str(label), str(meter), "reserved").inc(n)


def _settled(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    label = str(kw.get("limit") or "unknown")
    for kind in ("settled", "refunded", "overrun"):
        for meter, n in (kw.get(kind) or {}).items():
            if n:
                m.meter_units.labels(label, str(meter), kind).inc(n)
    for meter, n in (kw.get("settled") or {}).items():
        if n and str(meter).endswith("usd_micro"):
            m.spend.labels(label, str(meter)).inc(n / 1e6)


def _synced(m: Metrics, sender: Any, kw: dict[str, Any]) -> None:
    charged = int(kw.get("charged") or 0)
    if charged > 0:
        m.upstream_synced.labels(str(kw.get("limit")), str(kw.get("meter"))).inc(charged)


UPDATES: list[tuple[Any, Callable[[Metrics, Any, dict[str, Any]], None]]] = [
    (signals.task_admitted, _admitted),
    (signals.task_deferred, _deferred),
    (signals.task_parked, _parked),
    (signals.task_released, _released),
    (signals.storage_unavailable, _unavailable),
    (signals.slot_acquired, _slot_acquired),
    (signals.slot_released, _slot_released),
    (signals.slot_lost, _slot_lost),
    (signals.limit_paused, _paused),
    (signals.shadow_denied, _shadow_denied),
    (signals.limit_adapted, _adapted),
    (signals.live_limits_changed, _live_changed),
    (signals.message_dead_lettered, _dead_lettered),
    (signals.units_reserved, _reserved),
    (signals.task_settled, _settled),
    (signals.quota_synced, _synced),
]
"""Which signal updates which metrics (receivers: :mod:`.metrics`)."""
