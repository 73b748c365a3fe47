"""Every ``governor_*`` setting, every task attribute and every key of a limit, declared once.

In the spirit of Celery's ``celery/app/defaults.py``: one table gives each setting its name,
default, check and one-line doc. :func:`~.settings.load_settings` reads ``app.conf`` through
it, the configuration page of the docs is generated from it (``python -m
governor.celery.config > docs/configuration.md``, checked by a test), and
:class:`~governor.celery.GovernedTask`'s docstring lists :data:`TASK_OPTIONS`.

A check takes the value as given (never ``None``: an unset setting takes its default) and the
setting's name for its error, and returns the value to use or raises
:class:`~governor.errors.ConfigError`. Settings whose value depends on others (the Redis
group, ``park_after``, the limit tables) have no check of their own: :func:`load_settings`
reads them together, and their doc says how.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...blocks import MAX_DURATION
from ...errors import ConfigError

__all__ = ["LIMIT_KEYS", "SETTINGS", "TASK_OPTIONS", "Setting", "markdown"]

Validator = Callable[[Any, str], Any]


@dataclass(frozen=True, slots=True)
class Setting:
    """One ``governor_*`` setting (or task attribute, or limit key)."""

    name: str
    default: Any
    doc: str
    check: Validator | None = None
    """None: read by :func:`~.settings.load_settings` together with others (see ``doc``)."""
    shown: str | None = None
    """How the docs show the default, where ``repr`` would not do."""

    @property
    def field(self) -> str:
        """The :class:`~.settings.Settings` field it fills (the name without ``governor_``)."""
        return self.name.removeprefix("governor_")

    @property
    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        return "None" if self.default is None else f"`{self.default!r}`"


# -- checks ---------------------------------------------------------------------------------


def seconds_at_least(minimum: float = 0.0, most: float = math.inf) -> Validator:
    """A number of seconds, at least ``minimum`` (and at most ``most``)."""

    def check(value: Any, name: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
        if value < minimum:
            raise ConfigError(f"{name} must be at least {minimum}, got {value!r}")
        if value > most:
            raise ConfigError(f"{name} must be at most {most:.0f}, got {value!r}")
        return float(value)

    return check


def integer(low: int, high: int) -> Validator:
    def check(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"{name} must be an integer from {low} to {high}, got {value!r}")
        return value

    return check


def fraction(value: Any, name: str) -> float:
    """A number in (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def choice(*options: str) -> Validator:
    def check(value: Any, name: str) -> str:
        if value not in options:
            shown = " or ".join(repr(o) for o in options)
            raise ConfigError(f"{name} must be {shown}, got {value!r}")
        return str(value)

    return check


def text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
    return value


def max_wait(value: Any, name: str) -> float:
    return float(seconds_at_least()(value, name))


def port(value: Any, name: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ConfigError(f"{name} must be a TCP port or None, got {value!r}")
    return value


def host(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a host address, got {value!r}")
    return value


def path(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a file path, got {value!r}")
    return value


def basic_auth(value: Any, name: str) -> tuple[str, str]:
    """``"user:password"`` or ``(user, password)``; errors never repeat the value (a secret)."""
    if isinstance(value, str) and ":" in value:
        user, _, password = value.partition(":")
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        user, password = value
    else:
        raise ConfigError(f'{name} must be "user:password" or a (user, password) pair')
    if not isinstance(user, str) or not isinstance(password, str) or not user or not password:
        raise ConfigError(f"{name}: the user and the password must be non-empty strings")
    return user, password


def tenant_series(value: Any, name: str) -> int:
    """How many tenants get series of their own: False 0, True 100, or 0 to 10,000."""
    if value is True:
        return 100
    if value is False:
        return 0
    return int(integer(0, 10_000)(value, name))


# -- the settings ---------------------------------------------------------------------------

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "governor_redis_url",
        None,
        "Redis for limiter state: `redis://`, `rediss://`, `unix://`, a Sentinel URL "
        "(`sentinel://h1:26379;sentinel://h2:26379/1`) or a Redis Cluster's nodes "
        "(`redis://h1:7000,h2:7000`); by default the broker's URL, if the broker is Redis or "
        "Sentinel",
        shown="the broker's URL",
    ),
    Setting(
        "governor_redis_transport_options",
        None,
        '`{"master_name": ...}` for a Sentinel URL, also `sentinel_kwargs` and '
        "`min_other_sentinels` (from `broker_transport_options` when governor uses the "
        "broker's URL)",
    ),
    Setting(
        "governor_redis_cluster",
        False,
        "`True`: `governor_redis_url` lists a Redis Cluster's nodes",
    ),
    Setting(
        "governor_redis_client",
        None,
        '`"myproj.redis:make_client"`: a factory called with no arguments makes the client '
        "(TLS certificates, IAM tokens...), instead of a URL",
    ),
    Setting("governor_prefix", "governor", "key prefix in Redis", text),
    Setting("governor_algorithm", "sliding_log", "default algorithm of every limit"),
    Setting(
        "governor_queues",
        {},
        "`{queue: rules}`: quotas for every task consumed from the queue; a value is rules "
        '(`"10/s, 800/d"`) or a mapping of the limit keys below (rules, a cap, or both)',
    ),
    Setting(
        "governor_tasks",
        {},
        "`{task name: rules}`: limits for every call of a task (wins over its "
        "`governor_limit` and `governor_concurrency`); values as in `governor_queues`",
    ),
    Setting(
        "governor_concurrency_lease",
        30.0,
        "seconds a concurrency slot outlives its holder's last renewal (renewed every third "
        "of it while the body runs)",
        seconds_at_least(0.05),
    ),
    Setting(
        "governor_fail_mode",
        "closed",
        'Redis unreachable or refusing writes: `"closed"` re-publishes the task after a '
        'backoff and never runs it ungoverned; `"open"` runs it with a warning',
        choice("closed", "open"),
    ),
    Setting(
        "governor_outage_retry",
        5.0,
        "first backoff in seconds when Redis is unreachable, doubling up to 5 minutes",
        seconds_at_least(0.01),
    ),
    Setting(
        "governor_max_wait",
        None,
        "give up with `GovernorTimeout` after a task waited this long in total (seconds)",
        max_wait,
    ),
    Setting(
        "governor_late_tolerance",
        0.025,
        "how late a booked task may start on its slot (seconds)",
        seconds_at_least(),
    ),
    Setting(
        "governor_early_sleep",
        0.5,
        "a task arriving up to this early for its slot sleeps instead of going back; booked "
        "tasks are sent to arrive 0.2 s early, at most this (seconds)",
        seconds_at_least(),
    ),
    Setting(
        "governor_socket_timeout",
        2.0,
        "Redis socket timeout for decisions (seconds)",
        seconds_at_least(0.01),
    ),
    Setting(
        "governor_lease_span",
        0.2,
        "under limits with plenty of room, a pool process takes a few admissions at once "
        "(an admission lease) and starts them within this long; `0`: one Redis call per task",
        seconds_at_least(),
    ),
    Setting(
        "governor_park_after",
        None,
        "waits longer than this (seconds) are parked in Redis rather than given to the broker "
        "as ETAs; `False`: never park; when set, longer than `governor_release_interval`",
        shown="half the broker's visibility timeout, at most 300",
    ),
    Setting(
        "governor_release_interval",
        1.0,
        "how often each worker's releaser looks for parked tasks that are nearly due (seconds)",
        seconds_at_least(0.01),
    ),
    Setting(
        "governor_release_lease",
        5.0,
        "seconds a releaser's pickup of due tasks lasts: a pickup whose reply was lost (Redis "
        "hanging) holds its tasks this long before another releaser takes them",
        seconds_at_least(0.1),
    ),
    Setting(
        "governor_parking_shards",
        1,
        "parked tasks spread over this many hash slots (more on a Redis Cluster; raise only)",
        integer(1, 1024),
    ),
    Setting(
        "governor_park_replicas",
        0,
        "a parked task's original message is acknowledged once this many replicas hold it (`WAIT`)",
        integer(0, 16),
    ),
    Setting(
        "governor_park_replica_timeout",
        1.0,
        "how long that `WAIT` may take, below `governor_socket_timeout` (seconds)",
        seconds_at_least(0.01),
    ),
    Setting(
        "governor_backoff_base",
        1.0,
        "a `Backoff` that names no time pauses its limit this long, doubling with each one in "
        "a row (seconds)",
        seconds_at_least(0.01, MAX_DURATION),
    ),
    Setting(
        "governor_backoff_max",
        300.0,
        "the longest such pause, at least `governor_backoff_base` (seconds)",
        seconds_at_least(0.01, MAX_DURATION),
    ),
    Setting(
        "governor_max_pause",
        3600.0,
        "the longest pause an upstream's headers may ask for; longer ones are cut to it with a "
        "warning (seconds)",
        seconds_at_least(1.0, MAX_DURATION),
    ),
    Setting(
        "governor_adaptive_decrease",
        0.7,
        "an adaptive limit's rate is multiplied by this at each `Backoff`",
        fraction,
    ),
    Setting(
        "governor_adaptive_rise",
        0.02,
        "and climbs back by this fraction of its rules each second",
        fraction,
    ),
    Setting(
        "governor_adaptive_floor",
        0.05,
        "and never goes below this fraction of its rules",
        fraction,
    ),
    Setting(
        "governor_tenant_header",
        "fallback",
        "what a producer's `governor_tenant` header may say under fair limits: "
        '`"fallback"` names the tenant of a call whose arguments name none (`fair_by` missing, '
        'None or empty); `"override"` wins over `fair_by` (trusted producers); `"ignore"`: '
        "never read (see [fairness and tenants](fairness-tenants.md))",
        choice("fallback", "override", "ignore"),
    ),
    Setting(
        "governor_adaptive_hold",
        60.0,
        "climbing back, it stays this long at 90% of the rate the upstream refused before it "
        "probes higher (seconds; 0: no hold)",
        seconds_at_least(0.0, 86_400.0),
    ),
    Setting(
        "governor_settle_within",
        600.0,
        "seconds after its admission during which a task may `settle` what it reserved under "
        "limits with meters; later, the estimate stands (see docs/token-quotas.md)",
        seconds_at_least(1.0),
    ),
    Setting(
        "governor_learned_percentile",
        0.95,
        "a `learned(...)` estimate reserves this percentile of the last 200 uses a task settled",
        fraction,
    ),
    Setting(
        "governor_metrics_port",
        None,
        "serve Prometheus metrics on this port from every worker (None: off)",
        port,
    ),
    Setting(
        "governor_metrics_addr",
        "0.0.0.0",
        "address the metrics server binds (every address, as Prometheus exporters do: bind an "
        "internal one, or protect the port with the settings below; see docs/security.md)",
        host,
    ),
    Setting(
        "governor_metrics_certfile",
        None,
        "serve the metrics over TLS with this certificate (PEM; with `governor_metrics_keyfile`)",
        path,
    ),
    Setting("governor_metrics_keyfile", None, "the certificate's private key (PEM)", path),
    Setting(
        "governor_metrics_client_cafile",
        None,
        "with TLS: require a client certificate signed by this CA (mutual TLS)",
        path,
    ),
    Setting(
        "governor_metrics_basic_auth",
        None,
        '`"user:password"` (or a pair) every scrape must present (HTTP basic auth; use it '
        "with TLS, or the password crosses the network in clear)",
        basic_auth,
        shown="None",
    ),
    Setting(
        "governor_metrics_tenants",
        0,
        "a wait histogram per tenant of fair limits, for at most this many tenants per process "
        '(`True`: 100); the others count as `tenant="other"`, so a flood of tenants cannot '
        "grow a worker's memory or Prometheus without bound",
        tenant_series,
    ),
)
"""Every ``governor_*`` setting of ``app.conf``, in the order the docs list them."""

BY_NAME = {s.name: s for s in SETTINGS}

TASK_OPTIONS: tuple[Setting, ...] = (
    Setting(
        "governor_limit",
        None,
        "rules; with `governor_key` they apply per key, without it per task; or rules per "
        'meter, decided together: `{"requests": "500/m", "tokens": "30000/m"}`',
    ),
    Setting(
        "governor_key",
        None,
        "callable -> subject (str or int) for per-key limits; it gets the task's arguments by "
        "name: `lambda customer_id, **_: customer_id`",
    ),
    Setting(
        "governor_name",
        None,
        "the per-key limit's name (default: the task name); tasks that share it share the limit",
    ),
    Setting("governor_algorithm", None, "algorithm of these rules (default: `governor_algorithm`)"),
    Setting(
        "governor_transit",
        None,
        "seconds from admission to the upstream's count, added to each window of "
        "`governor_limit` (the `transit` limit key)",
    ),
    Setting(
        "governor_concurrency",
        None,
        "at most this many calls run at once (per key with `governor_key`): a slot is held from "
        "the start of the body to its end",
    ),
    Setting(
        "governor_cost",
        1,
        "units a call costs: an int, or a callable like `governor_key` (a fraction rounds "
        "up; 0 runs at once, counted by no limit); under limits with meters, units per meter "
        '(`{"requests": 1, "tokens": 1800}`, a value may be `learned(default)`); caps count calls',
    ),
    Setting(
        "governor_max_wait",
        None,
        "give up with `GovernorTimeout` after waiting this long in total (seconds)",
    ),
    Setting(
        "governor_fair_by",
        None,
        "share the task's own limit fairly between tenants: an argument's name or a callable",
    ),
    Setting(
        "governor_weights",
        None,
        "tenants' weights under `governor_fair_by`: `{tenant: weight}` or a callable",
    ),
)
"""Every ``governor_*`` attribute of a task (``Governor.task()`` takes the same)."""

LIMIT_KEYS: tuple[Setting, ...] = (
    Setting(
        "rules",
        None,
        'the rules: `"10/s, 800/d"` or a list of them; or rules per meter, decided together: '
        '`{"requests": "500/m", "tokens": "30000/m"}`',
    ),
    Setting("algorithm", None, "the algorithm of these rules (default: `governor_algorithm`)"),
    Setting("concurrency", None, "at most this many calls at once (with or without rules)"),
    Setting("shadow", False, "count and log what the rules would deny, but deny nothing"),
    Setting(
        "transit",
        0,
        "seconds a call may take from its admission to the upstream's count (a cold client, the "
        "network): each rule's window is that much longer, so a call admitted as the oldest "
        "leave cannot reach the upstream before they do (a fill cost of transit / window; "
        "whole ms, at most 60 s)",
    ),
    Setting(
        "adaptive",
        False,
        "lower the rate at each `Backoff`, climb back while the upstream accepts (AIMD)",
    ),
    Setting("fair_by", None, "share the limit between tenants: an argument's name or a callable"),
    Setting("weights", None, "tenants' weights: `{tenant: weight}` (0.001 to 1000) or a callable"),
)
"""The keys of a limit given as a mapping (``{"rules": "10/s", "concurrency": 5}``)."""


def markdown() -> str:
    """The configuration page of the docs (``docs/configuration.md``)."""

    def table(rows: tuple[Setting, ...], head: str) -> list[str]:
        lines = [f"| {head} | default | meaning |", "|---|---|---|"]
        for s in rows:
            lines.append(f"| `{s.name}` | {s.default_text} | {s.doc} |")
        return lines

    out = [
        "# Configuration",
        "",
        "<!-- generated by `python -m governor.celery.config > docs/configuration.md`: edit",
        "     governor/celery/config/defaults.py, not this page -->",
        "",
        "## Settings",
        "",
        "Settings live in `app.conf` with a `governor_` prefix (in Django, `CELERY_GOVERNOR_...`",
        'through Celery\'s `namespace="CELERY"`) and are checked when the app finalizes: a bad',
        "value fails at start-up, naming the setting. An unset setting (or `None`) takes its",
        "default.",
        "",
        *table(SETTINGS, "setting"),
        "",
        "## Task options",
        "",
        "Attributes of a task, as Celery's own",
        "(`@app.task(base=GovernedTask, governor_limit=...)`);",
        "`Governor.task(rules, key=..., concurrency=...)` takes the same.",
        "",
        *table(TASK_OPTIONS, "attribute"),
        "",
        "## A limit's keys",
        "",
        'A limit in `governor_queues` or `governor_tasks` is rules (`"10/s, 800/d"`) or a mapping:',
        "",
        *table(LIMIT_KEYS, "key"),
        "",
    ]
    return "\n".join(out)
