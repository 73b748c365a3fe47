"""governor's Celery settings: ``app.conf.governor_*``, validated in one place.

=============================  ==========================================================
setting                        meaning (default)
=============================  ==========================================================
``governor_redis_url``         Redis for limiter state (the broker URL if it is Redis or
                               Sentinel); Sentinel and Cluster forms: see .redis_settings
``governor_redis_...``         ``_transport_options`` (Sentinel ``master_name``), ``_cluster``,
                               ``_client`` (a client factory): see .redis_settings
``governor_prefix``            key prefix ("governor")
``governor_algorithm``         default algorithm ("sliding_log")
``governor_queues``            {queue: rules} quotas for every task consumed from the queue
``governor_tasks``             {task name: rules} limits for every call of a task
``governor_concurrency_lease`` seconds a concurrency slot outlives its holder's last renewal
                               (30.0; renewed every third of it while the body runs)
``governor_fail_mode``         "closed": no Redis, no run (re-published after a backoff);
                               "open": run ungoverned with a warning ("closed")
``governor_outage_retry``      first backoff in seconds when Redis is unreachable (5.0)
``governor_max_wait``          give up with GovernorTimeout after waiting this long (None)
``governor_late_tolerance``    how late a task may start on its booked slot, seconds (0.025)
``governor_early_sleep``       an early arrival sleeps up to this long instead of
                               being re-published, seconds (0.5)
``governor_socket_timeout``    Redis socket timeout for decisions, seconds (2.0)
``governor_lease_span``        under limits with plenty of room, a pool process takes a few
                               admissions at once and uses them within this many seconds
                               (0.2; 0: one Redis call per task); see governor.celery.leases
``governor_park_after``        waits longer than this (seconds) are parked in Redis rather than
                               given to the broker as ETAs (default: half the broker's
                               visibility timeout, at most 300; False: never park)
``governor_release_interval``  how often each worker's releaser looks for due tasks (1.0)
``governor_release_lease``     seconds a releaser may take to publish what it took (5.0; a take
                               whose reply was lost, Redis hanging, holds its tasks that long)
``governor_parking_shards``    parked tasks spread over this many hash slots (1; a Cluster: more)
``governor_park_replicas``     a parked task waits until this many replicas hold it (WAIT, within
                               ``governor_park_replica_timeout``, 1.0 s; else it stays, warned) (0)
``governor_backoff_base``      first pause of a ``Backoff`` that names no time, doubling with each
                               one in a row (1.0)
``governor_backoff_max``       longest such pause, seconds (300.0)
``governor_max_pause``         longest pause an upstream may ask for; longer ones are cut to it
                               with a warning (3600.0)
``governor_adaptive_decrease`` an adaptive limit's rate is multiplied by this at a Backoff (0.7)
``governor_adaptive_rise``     and climbs back by this fraction of its rules each second (0.02)
``governor_adaptive_floor``    never below this fraction of its rules (0.05)
``governor_metrics_port``      serve Prometheus metrics on this port (None: off)
``governor_metrics_addr``      address for the metrics server ("0.0.0.0")
``governor_metrics_tenants``   a wait histogram per tenant of fair limits (False: cardinality)
=============================  ==========================================================

Rules may be a string (``"10/s, 800/d"``), a list, or a mapping
``{"rules": "10/s", "algorithm": "gcra", "concurrency": 5}``: ``concurrency`` caps how many run
at once (with or without rules: ``{"concurrency": 1}``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..algorithms import get_algorithm
from ..connect import RedisTarget, target
from ..errors import ConfigError
from .limit_config import LimitConfig, limit_config
from .redis_settings import REDIS_SCHEMES, redis_target

__all__ = ["REDIS_SCHEMES", "LimitConfig", "Settings", "limit_config", "load_settings"]


LEAD = 0.2
"""A booked task is sent to arrive this long (seconds, at most ``early_sleep``) before its slot.

Waking a process that slept for a while can take tens of milliseconds on a busy machine or VM
(measured here: 20-35 ms for a Redis round trip after a second idle, against ~1 ms in a busy
loop), more than ``late_tolerance``. Arriving early absorbs that; the claim then closes in on
the slot with short sleeps, whose wake-ups are quick, so it lands inside the tolerance."""


@dataclass(frozen=True, slots=True)
class Settings:
    redis_url: str | None
    redis: RedisTarget | None = None
    """How to reach Redis (from ``redis_url`` and its options, or a client factory)."""
    prefix: str = "governor"
    algorithm: str = "sliding_log"
    queues: Mapping[str, LimitConfig] = field(default_factory=dict)
    tasks: Mapping[str, LimitConfig] = field(default_factory=dict)
    fail_mode: str = "closed"
    outage_retry: float = 5.0
    max_wait: float | None = None
    late_tolerance: float = 0.025
    early_sleep: float = 0.5
    socket_timeout: float = 2.0
    lease_span: float = 0.2
    concurrency_lease: float = 30.0
    park_after: float | None = 300.0
    release_interval: float = 1.0
    release_lease: float = 5.0
    parking_shards: int = 1
    park_replicas: int = 0
    park_replica_timeout: float = 1.0
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    metrics_tenants: bool = False
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    max_pause: float = 3600.0
    adaptive_decrease: float = 0.7
    adaptive_rise: float = 0.02
    adaptive_floor: float = 0.05

    @property
    def lead(self) -> float:
        """How early a booked task is sent to arrive for its slot (``LEAD``, at most
        ``early_sleep``): every path that sends one (deferral, release, batch) uses it."""
        return min(LEAD, self.early_sleep)

    def require_redis(self) -> RedisTarget:
        if self.redis is not None:
            return self.redis
        if not self.redis_url:
            raise ConfigError(
                "governor needs Redis: set app.conf.governor_redis_url = 'redis://host:6379/1' "
                "(the broker is not Redis, so it cannot be the default)"
            )
        return target(self.redis_url)


def seconds(value: Any, where: str, *, allow_none: bool = False, minimum: float = 0.0) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where} must be a number of seconds, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where} must be at least {minimum}, got {value!r}")
    return float(value)


def _shards(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ConfigError(
            f"governor_parking_shards must be an integer from 1 to 1024, got {value!r}"
        )
    return value


def _replicas(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 16:
        raise ConfigError(f"governor_park_replicas must be an integer from 0 to 16, got {value!r}")
    return value


def fraction(value: Any, name: str) -> float:
    """A number in (0, 1): ``governor_adaptive_<name>``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(f"governor_adaptive_{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def load_settings(conf: Any) -> Settings:
    """Read and validate ``governor_*`` from a Celery ``app.conf``."""
    get = conf.get
    redis_url, redis = redis_target(get)
    algorithm = get("governor_algorithm") or "sliding_log"
    try:
        algorithm = get_algorithm(algorithm).name
    except ConfigError as exc:
        raise ConfigError(f"governor_algorithm: {exc}") from None

    concurrency_lease = seconds(
        get("governor_concurrency_lease", 30.0), "governor_concurrency_lease", minimum=0.05
    )

    def table(setting: str) -> dict[str, LimitConfig]:
        raw = get(setting) or {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{setting} must be a mapping of names to rules, got {raw!r}")
        return {
            str(name): limit_config(value, algorithm, f"{setting}[{name!r}]", concurrency_lease)
            for name, value in raw.items()
        }

    fail_mode = get("governor_fail_mode") or "closed"
    if fail_mode not in ("closed", "open"):
        raise ConfigError(f"governor_fail_mode must be 'closed' or 'open', got {fail_mode!r}")
    prefix = get("governor_prefix") or "governor"
    metrics_port = get("governor_metrics_port")
    if isinstance(metrics_port, str) and metrics_port.isdigit():
        metrics_port = int(metrics_port)
    if metrics_port is not None and (
        isinstance(metrics_port, bool)
        or not isinstance(metrics_port, int)
        or not 0 < metrics_port < 65536
    ):
        raise ConfigError(f"governor_metrics_port must be a TCP port or None, got {metrics_port!r}")
    metrics_addr = get("governor_metrics_addr") or "0.0.0.0"
    park_after = get("governor_park_after")
    park_after_set = park_after is not None and park_after is not False
    if park_after is None:
        options = get("broker_transport_options") or {}
        visibility = (
            options.get("visibility_timeout", 3600) if isinstance(options, Mapping) else 3600
        )
        park_after = min(300.0, float(visibility) / 2)
    elif park_after is False:
        park_after = None
    else:
        park_after = seconds(park_after, "governor_park_after", minimum=0.001)
    if not isinstance(metrics_addr, str):
        raise ConfigError(f"governor_metrics_addr must be a host address, got {metrics_addr!r}")
    release_interval = seconds(
        get("governor_release_interval", 1.0), "governor_release_interval", minimum=0.01
    )
    if park_after_set and park_after is not None and park_after <= release_interval:
        raise ConfigError(
            f"governor_park_after ({park_after:g}s) must be longer than "
            f"governor_release_interval ({release_interval:g}s): a parked task is released "
            "when it is due within park_after, and releasers look only every release_interval"
        )
    backoff_base = seconds(get("governor_backoff_base", 1.0), "governor_backoff_base", minimum=0.01)
    backoff_max = seconds(get("governor_backoff_max", 300.0), "governor_backoff_max", minimum=0.01)
    if backoff_max < backoff_base:
        raise ConfigError(
            f"governor_backoff_max ({backoff_max:g}s) must not be below governor_backoff_base "
            f"({backoff_base:g}s)"
        )
    replica_timeout = seconds(
        get("governor_park_replica_timeout", 1.0), "governor_park_replica_timeout", minimum=0.01
    )
    socket_timeout = seconds(
        get("governor_socket_timeout", 2.0), "governor_socket_timeout", minimum=0.01
    )
    if get("governor_park_replicas", 0) and replica_timeout >= socket_timeout:
        raise ConfigError(
            f"governor_park_replica_timeout ({replica_timeout:g}s) must be below "
            f"governor_socket_timeout ({socket_timeout:g}s): WAIT blocks the connection"
        )
    return Settings(
        redis_url=redis_url,
        redis=redis,
        prefix=prefix,
        algorithm=algorithm,
        queues=table("governor_queues"),
        tasks=table("governor_tasks"),
        fail_mode=fail_mode,
        outage_retry=seconds(
            get("governor_outage_retry", 5.0), "governor_outage_retry", minimum=0.01
        ),
        max_wait=seconds(get("governor_max_wait"), "governor_max_wait", allow_none=True),
        late_tolerance=seconds(get("governor_late_tolerance", 0.025), "governor_late_tolerance"),
        early_sleep=seconds(get("governor_early_sleep", 0.5), "governor_early_sleep"),
        metrics_port=metrics_port,
        metrics_addr=metrics_addr,
        metrics_tenants=bool(get("governor_metrics_tenants", False)),
        park_after=park_after,
        release_interval=release_interval,
        parking_shards=_shards(get("governor_parking_shards", 1)),
        park_replicas=_replicas(get("governor_park_replicas", 0)),
        park_replica_timeout=replica_timeout,
        release_lease=seconds(
            get("governor_release_lease", 5.0), "governor_release_lease", minimum=0.1
        ),
        socket_timeout=seconds(
            get("governor_socket_timeout", 2.0), "governor_socket_timeout", minimum=0.01
        ),
        lease_span=seconds(get("governor_lease_span", 0.2), "governor_lease_span"),
        concurrency_lease=concurrency_lease,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        max_pause=seconds(get("governor_max_pause", 3600.0), "governor_max_pause", minimum=1.0),
        adaptive_decrease=fraction(get("governor_adaptive_decrease", 0.7), "decrease"),
        adaptive_rise=fraction(get("governor_adaptive_rise", 0.02), "rise"),
        adaptive_floor=fraction(get("governor_adaptive_floor", 0.05), "floor"),
    )
