"""governor's Celery settings: ``app.conf.governor_*``, read and checked through the table of
:mod:`.defaults` (each setting's default, check and doc are declared there, once).

Rules may be a string (``"10/s, 800/d"``), a list, or a mapping
``{"rules": "10/s", "algorithm": "gcra", "concurrency": 5}``: ``concurrency`` caps how many run
at once (with or without rules: ``{"concurrency": 1}``).
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...algorithms import get_algorithm
from ...connect import RedisTarget, target
from ...errors import ConfigError
from ..types import LimitConfig
from .defaults import BY_NAME, SETTINGS, seconds_at_least
from .limit_config import limit_config
from .redis_options import redis_target

__all__ = ["Settings", "load_settings", "mark_life", "visibility_timeout"]

logger = logging.getLogger("governor.celery")

MARK_LIFE = 86_400.0
"""The shortest life of a failed acknowledgement's mark (seconds)."""
REDIS_SCHEMES = ("redis", "rediss", "sentinel", "socket", "unix")
"""Broker URL schemes of kombu's Redis transport."""
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
    settle_within: float = 600.0
    learned_percentile: float = 0.95
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    metrics_certfile: str | None = None
    metrics_keyfile: str | None = None
    metrics_client_cafile: str | None = None
    metrics_basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    metrics_tenants: int = 0
    tenant_header: str = "fallback"
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    max_pause: float = 3600.0
    adaptive_decrease: float = 0.7
    adaptive_rise: float = 0.02
    adaptive_floor: float = 0.05
    adaptive_hold: float = 60.0

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


def load_settings(conf: Any, namespace: str | None = None) -> Settings:
    """Read and check ``governor_*`` from a Celery ``app.conf``.

    ``namespace``: the app's ``config_from_object(..., namespace="CELERY")`` (Django): errors
    and warnings then also name a setting as it is written there, ``CELERY_GOVERNOR_QUEUES``.
    """
    _warn_unknown(conf, namespace)
    try:
        return _load(conf)
    except ConfigError as exc:
        if not namespace:
            raise
        raise ConfigError(_as_written(str(exc), namespace)) from None


def _as_written(message: str, namespace: str) -> str:
    """``message`` with the first setting it names followed by its namespaced name."""
    found = re.search(r"\bgovernor_[a-z_]+", message)
    if found is None:
        return message
    return f"{message} (set as {namespace}_{found.group().upper()})"


def _load(conf: Any) -> Settings:
    get = conf.get

    def value(name: str) -> Any:
        """A setting with a check of its own: its value, checked (its default when unset)."""
        setting = BY_NAME[name]
        raw = get(name)
        if raw is None:
            return setting.default
        assert setting.check is not None
        return setting.check(raw, name)

    values = {s.field: value(s.name) for s in SETTINGS if s.check is not None}
    values["redis_url"], values["redis"] = redis_target(get)
    algorithm = get("governor_algorithm") or BY_NAME["governor_algorithm"].default
    try:
        values["algorithm"] = get_algorithm(algorithm).name
    except ConfigError as exc:
        raise ConfigError(f"governor_algorithm: {exc}") from None

    def table(name: str) -> dict[str, LimitConfig]:
        raw = get(name) or {}
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{name} must be a mapping of names to rules, got {raw!r}")
        return {
            str(key): limit_config(
                rules, values["algorithm"], f"{name}[{key!r}]", values["concurrency_lease"]
            )
            for key, rules in raw.items()
        }

    values["queues"] = table("governor_queues")
    values["tasks"] = table("governor_tasks")
    values["park_after"] = _park_after(get, values["release_interval"])
    _check_together(values, bool(get("governor_park_replicas")))
    return Settings(**values)


def visibility_timeout(broker_url: Any, transport_options: Any) -> float | None:
    """Seconds after which the broker delivers an unacknowledged message again: the transport
    option ``visibility_timeout`` (Redis, SQS), else the Redis transport's default of an hour;
    None for brokers that redeliver when the connection closes (AMQP)."""
    options = transport_options if isinstance(transport_options, Mapping) else {}
    raw = options.get("visibility_timeout")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw > 0:
        return float(raw)
    url = broker_url if isinstance(broker_url, str) else ""
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    return 3600.0 if scheme in REDIS_SCHEMES else None


def mark_life(broker_url: Any, transport_options: Any) -> float:
    """How long a failed acknowledgement's mark lives (:mod:`..waiting.redelivery`): a day, or
    longer than two visibility timeouts (the redelivery comes one timeout after the delivery,
    plus the transport's restore sweep; a dropped redelivery whose acknowledgement fails too
    comes back once more) with an hour to spare."""
    timeout = visibility_timeout(broker_url, transport_options)
    return max(MARK_LIFE, 2 * timeout + 3600.0) if timeout is not None else MARK_LIFE


def _park_after(get: Callable[..., Any], release_interval: float) -> float | None:
    """``governor_park_after``: False never parks; unset, half the broker's visibility timeout
    (at most 300 s); set, longer than ``governor_release_interval``."""
    raw = get("governor_park_after")
    if raw is False:
        return None
    if raw is None:
        options = get("broker_transport_options") or {}
        visibility = (
            options.get("visibility_timeout", 3600) if isinstance(options, Mapping) else 3600
        )
        return min(300.0, float(visibility) / 2)
    park_after: float = seconds_at_least(0.001)(raw, "governor_park_after")
    if park_after <= release_interval:
        raise ConfigError(
            f"governor_park_after ({park_after:g}s) must be longer than "
            f"governor_release_interval ({release_interval:g}s): a parked task is released "
            "when it is due within park_after, and releasers look only every release_interval"
        )
    return park_after


def _check_together(values: dict[str, Any], replicas: bool) -> None:
    """What one setting cannot be checked for alone."""
    if values["backoff_max"] < values["backoff_base"]:
        raise ConfigError(
            f"governor_backoff_max ({values['backoff_max']:g}s) must not be below "
            f"governor_backoff_base ({values['backoff_base']:g}s)"
        )
    if bool(values["metrics_certfile"]) != bool(values["metrics_keyfile"]):
        raise ConfigError(
            "governor_metrics_certfile and governor_metrics_keyfile go together (TLS needs both)"
        )
    if values["metrics_client_cafile"] and not values["metrics_certfile"]:
        raise ConfigError("governor_metrics_client_cafile needs TLS: set governor_metrics_certfile")
    if replicas and values["park_replica_timeout"] >= values["socket_timeout"]:
        raise ConfigError(
            f"governor_park_replica_timeout ({values['park_replica_timeout']:g}s) must be below "
            f"governor_socket_timeout ({values['socket_timeout']:g}s): WAIT blocks the connection"
        )


def _warn_unknown(conf: Any, namespace: str | None = None) -> None:
    """A ``governor_*`` setting nobody reads is a typo: say so (once per load), with a guess.
    With a ``namespace``, ``CELERY_GOVERNOR_*`` keys are checked too (written so, shown so)."""
    marked = f"{namespace}_GOVERNOR_" if namespace else None
    try:
        names = {
            (k if k.startswith("governor_") else k[len(namespace or "") + 1 :].lower()): k
            for k in conf
            if isinstance(k, str)
            and (k.startswith("governor_") or (marked is not None and k.startswith(marked)))
        }
    except Exception:  # a conf without keys(): nothing to compare
        return
    for name in sorted(set(names) - set(BY_NAME)):
        guess = difflib.get_close_matches(name, BY_NAME, n=1)
        if guess and names[name] != name:  # shown as written
            guess = [f"{namespace}_{guess[0].upper()}"]
        hint = f"; did you mean {guess[0]}?" if guess else ""
        logger.warning("governor: unknown setting %s is ignored%s", names[name], hint)
