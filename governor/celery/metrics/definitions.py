"""governor's Prometheus metrics: what each one is (installed by :mod:`governor.celery.metrics`;
which signal updates which: :mod:`governor.celery.metrics.updates`).

==========================================  =========  ======================  =================
metric                                      type       labels                  counts
==========================================  =========  ======================  =================
``governor_admitted_total``                 counter    ``limit``               calls a limit
                                                                               admitted
``governor_deferred_total``                 counter    ``limit``, ``rule``,    calls denied and
                                                       ``booked``              re-published
``governor_delay_seconds``                  histogram  ``limit``               the delays they
                                                                               were given
``governor_lateness_seconds``               histogram  (none)                  how late booked
                                                                               calls started
``governor_parked_total``                   counter    ``queue``               deferred calls
                                                                               parked in Redis
``governor_released_total``                 counter    ``queue``               parked calls
                                                                               re-published
``governor_storage_unavailable_total``      counter    ``fail_mode``           decisions Redis
                                                                               could not take
``governor_parked_tasks``                   gauge      (none)                  calls parked now
``governor_running``                        gauge      ``limit``               calls holding a
                                                                               concurrency slot
``governor_handover_seconds``               histogram  ``limit``               hand-over of a
                                                                               slot to start
``governor_slots_lost_total``               counter    ``limit``               slots whose
                                                                               lease ran out
``governor_pauses_total``                   counter    ``limit``, ``timed``    pauses after a
                                                                               ``Backoff``
``governor_shadow_denied_total``            counter    ``limit``, ``rule``     calls a shadow
                                                                               limit would defer
``governor_adaptive_decreases_total``       counter    ``limit``               adaptive rates
                                                                               lowered
``governor_adaptive_factor``                gauge      ``limit``               the last one
``governor_live_changes_total``             counter    ``limit``               live changes a
                                                                               process picked up
``governor_tenant_wait_seconds``            histogram  ``limit``, ``tenant``   waits under fair
                                                                               limits (opt in)
``governor_dead_lettered_total``            counter    ``kind``                waiting messages
                                                                               dead-lettered
``governor_dead_letters``                   gauge      (none)                  dead letters held
``governor_meter_units_total``              counter    ``limit``, ``meter``,   units under
                                                       ``kind``                meters (below)
``governor_upstream_synced_units_total``    counter    ``limit``, ``meter``    units the
                                                                               upstream's
                                                                               headers charged
``governor_spend_dollars_total``            counter    ``limit``, ``meter``    money settled
                                                                               (``*usd_micro``)
==========================================  =========  ======================  =================

- ``limit`` is the label the gate, its logs and the CLI use: ``queue:emails``,
  ``task:proj.sync``, or the limiter name of a per-key limit (``proj.call_partner``). A call
  governed by several limits counts once under each of them in ``governor_admitted_total``, so
  sum over one limit, not over all. A call denied while Redis was unreachable (fail mode
  "closed") is deferred under ``limit="redis"``.
- ``rule`` is the rule that made the call wait, in canonical text (``10/s``, ``5/30s``),
  ``blocked`` for a manual block, ``concurrency`` for a wait in a full cap's line (its delay is
  not known, so it is not observed in ``governor_delay_seconds``), ``none`` when there was no
  single rule (an outage retry, or a wait for a moment other calls kept booking).
- ``booked`` is ``"true"`` when the call holds a reserved slot for the moment it comes back.
- ``governor_delay_seconds`` buckets run from 1 ms to a day.
- ``governor_lateness_seconds``: for a call admitted on the slot it had booked, how long after
  the slot opened it started (compare with ``governor_late_tolerance``); 1 ms to 5 s.
- ``governor_parked_tasks`` is whatever :func:`set_parked` last set, or what the callable given
  to :func:`install` (``parked=``) or :func:`watch_parked` returns at each scrape.
- ``governor_dead_lettered_total`` counts waiting messages that could not be read or published
  and went to the dead-letter place (``kind``: ``parked``, ``fair`` or ``cap``; the same
  message put there again is not counted again); ``governor_dead_letters`` is how many the
  place holds (read from Redis at each scrape, and set whenever a worker puts one there):
  alert on it, then ``governor dead-letters list`` (see docs/dead-letters.md).
- ``governor_meter_units_total``: under limits with meters (docs/token-quotas.md), ``kind`` is
  ``reserved`` (the estimates admitted calls counted), ``settled`` (the use tasks reported),
  ``refunded`` (units settling gave back to their windows) or ``overrun`` (use beyond the
  estimate, charged when settled). ``governor_spend_dollars_total`` counts the settled units of
  a meter whose name ends in ``usd_micro`` as dollars (budgets in money).
- ``governor_running`` sums the live pool processes of a worker (a process that exits drops
  out); ``governor_handover_seconds`` runs from the moment a process freed a slot and published
  the waiting call to the moment that call started.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

logger = logging.getLogger("governor.celery.metrics")

__all__ = ["DELAY_BUCKETS", "HANDOVER_BUCKETS", "LATENESS_BUCKETS", "Metrics"]

DELAY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    21600.0,
    43200.0,
    86400.0,
)
"""``governor_delay_seconds`` buckets: 1 ms to a day (and +Inf)."""

LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""``governor_lateness_seconds`` buckets: 1 ms to 5 s (and +Inf)."""

HANDOVER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0)
"""``governor_handover_seconds`` buckets: 1 ms to 30 s (and +Inf)."""


class Metrics:
    """The metric objects, made once the value class (in-memory or multiprocess) is chosen.

    ``registry``: where they register (prometheus_client's default registry; ``None``: nowhere,
    or a private :class:`~prometheus_client.CollectorRegistry` to list what governor exports)."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY, tenants: int = 0) -> None:
        self.tenant_cap = 100 if tenants is True else int(tenants)
        """At most this many tenants get series of their own (per process); the rest: other."""
        self._tenants: set[tuple[str, str]] = set()
        self._tenants_full = False
        self._tenant_lock = threading.Lock()
        self.admitted = Counter(
            "governor_admitted",
            "Governed calls admitted, once per limit that admitted them.",
            ["limit"],
            registry=registry,
        )
        self.deferred = Counter(
            "governor_deferred",
            "Governed calls denied and re-published to run later (not task failures).",
            ["limit", "rule", "booked"],
            registry=registry,
        )
        self.delay = Histogram(
            "governor_delay_seconds",
            "Delays given to deferred calls, in seconds.",
            ["limit"],
            buckets=DELAY_BUCKETS,
            registry=registry,
        )
        self.lateness = Histogram(
            "governor_lateness_seconds",
            "How long after its booked slot opened an admitted call started, in seconds.",
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self.parked = Counter(
            "governor_parked",
            "Deferred calls parked in Redis instead of the broker.",
            ["queue"],
            registry=registry,
        )
        self.released = Counter(
            "governor_released",
            "Parked calls re-published by the releaser.",
            ["queue"],
            registry=registry,
        )
        self.unavailable = Counter(
            "governor_storage_unavailable",
            "Decisions that could not be taken because Redis was unreachable.",
            ["fail_mode"],
            registry=registry,
        )
        self.parked_now = Gauge(
            "governor_parked_tasks",
            "Calls parked in Redis right now.",
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.running = Gauge(
            "governor_running",
            "Governed calls holding a concurrency slot of a limit right now (in this worker).",
            ["limit"],
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.handover = Histogram(
            "governor_handover_seconds",
            "From the hand-over of a freed concurrency slot to the start of the waiting call.",
            ["limit"],
            buckets=HANDOVER_BUCKETS,
            registry=registry,
        )
        self.slots_lost = Counter(
            "governor_slots_lost",
            "Concurrency slots whose lease ran out while their call still ran.",
            ["limit"],
            registry=registry,
        )
        self.pauses = Counter(
            "governor_pauses",
            "Limits paused because a task raised Backoff (timed: the upstream said how long).",
            ["limit", "timed"],
            registry=registry,
        )

        self.shadow_denied = Counter(
            "governor_shadow_denied",
            "Calls a shadow limit would have deferred (they ran).",
            ["limit", "rule"],
            registry=registry,
        )

        self.adaptive_decreases = Counter(
            "governor_adaptive_decreases",
            "Times an adaptive limit's rate was lowered after a Backoff.",
            ["limit"],
            registry=registry,
        )
        self.adaptive_factor = Gauge(
            "governor_adaptive_factor",
            "An adaptive limit's factor after its last decrease (it climbs back with time).",
            ["limit"],
            multiprocess_mode="mostrecent",
            registry=registry,
        )

        self.live_changes = Counter(
            "governor_live_changes",
            "Changes of a live limit picked up by a worker process.",
            ["limit"],
            registry=registry,
        )

        self.dead_lettered = Counter(
            "governor_dead_lettered",
            "Waiting messages that could not be read or published, moved to the dead letters.",
            ["kind"],
            registry=registry,
        )
        self.dead_letters = Gauge(
            "governor_dead_letters",
            "Messages held in the dead-letter place right now.",
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.meter_units = Counter(
            "governor_meter_units",
            "Units under limits with meters: reserved, settled, refunded, overrun.",
            ["limit", "meter", "kind"],
            registry=registry,
        )
        self.upstream_synced = Counter(
            "governor_upstream_synced_units",
            "Units charged because the upstream reported less room than governor counted.",
            ["limit", "meter"],
            registry=registry,
        )
        self.spend = Counter(
            "governor_spend_dollars",
            "Money tasks settled under a meter of micro-dollars (a name ending in usd_micro).",
            ["limit", "meter"],
            registry=registry,
        )

        self.tenant_wait: Histogram | None = None
        """Waits by tenant under fair limits: one series per tenant, so only on request
        (``governor_metrics_tenants``), and for at most ``tenant_cap`` tenants."""
        if self.tenant_cap:
            self.tenant_wait = Histogram(
                "governor_tenant_wait_seconds",
                "From a call's first wait to its start, under a fair limit, per tenant.",
                ["limit", "tenant"],
                buckets=DELAY_BUCKETS,
                registry=registry,
            )

    def tenant(self, limit: str, tenant: str) -> str:
        """The ``tenant`` label for a tenant of ``limit``: its name while fewer than
        ``tenant_cap`` tenants have series of their own in this process, else ``"other"`` (a
        flood of distinct tenants, which come from task arguments and headers, must not grow
        a worker's memory or Prometheus without bound)."""
        key = (limit, tenant)
        with self._tenant_lock:
            if key in self._tenants:
                return tenant
            if len(self._tenants) < self.tenant_cap:
                self._tenants.add(key)
                return tenant
            warn, self._tenants_full = not self._tenants_full, True
        if warn:
            logger.warning(
                "governor: more than %d tenants seen by this process: the others' waits count "
                'as tenant="other" (governor_metrics_tenants)',
                self.tenant_cap,
            )
        return "other"

    def all(self) -> list[Any]:
        return [
            self.admitted,
            self.deferred,
            self.delay,
            self.lateness,
            self.parked,
            self.released,
            self.unavailable,
            self.parked_now,
            self.running,
            self.handover,
            self.slots_lost,
            self.pauses,
            self.shadow_denied,
            self.adaptive_decreases,
            self.adaptive_factor,
            self.live_changes,
            self.dead_lettered,
            self.dead_letters,
            self.meter_units,
            self.upstream_synced,
            self.spend,
            *([self.tenant_wait] if self.tenant_wait is not None else []),
        ]
