"""Which Redis a Celery app's governor uses: ``governor_redis_*``, else the broker's.

====================================  ========================================================
setting                               meaning (default)
====================================  ========================================================
``governor_redis_url``                ``redis://``, ``rediss://``, ``unix://``, a Sentinel URL
                                      (``sentinel://h1:26379;sentinel://h2:26379/1``) or a
                                      cluster's nodes (``redis://h1:7000,h2:7000``) (the
                                      broker's URL if it is Redis or Sentinel)
``governor_redis_transport_options``  ``{"master_name": ...}`` for a Sentinel URL, also
                                      ``sentinel_kwargs`` and ``min_other_sentinels`` (from
                                      ``broker_transport_options`` with the broker's URL)
``governor_redis_cluster``            True: the URL lists a Redis Cluster's nodes (False)
``governor_redis_client``             ``"myproj.redis:make_client"``: a factory called with
                                      no arguments makes the client (instead of a URL)
====================================  ========================================================

See :mod:`governor.connect` for the URL forms and the factory's contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...connect import SENTINEL_OPTIONS, Names, RedisTarget, is_sentinel_url, target
from ...errors import ConfigError

__all__ = ["REDIS_SCHEMES", "redis_target"]

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
BROKER = Names(
    url="broker_url (governor's Redis, as governor_redis_url is not set)",
    options="broker_transport_options",
    master="broker_transport_options = {'master_name': 'mymaster'}, as Celery needs",
)


def redis_target(get: Callable[..., Any]) -> tuple[str | None, RedisTarget | None]:
    """The Redis URL (None for a factory, or with no Redis at all) and how to reach it."""
    url = get("governor_redis_url")
    factory = get("governor_redis_client")
    cluster = get("governor_redis_cluster")
    options = get("governor_redis_transport_options")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(
            f"governor_redis_transport_options must be a mapping such as "
            f"{{'master_name': 'mymaster'}}, got {options!r}"
        )
    names = Names()
    if url is None and factory is None:
        if cluster:
            raise ConfigError(
                "governor_redis_cluster is set: list the cluster's nodes in governor_redis_url "
                "(redis://host1:7000,host2:7000); the broker's URL cannot be a cluster"
            )
        broker = get("broker_url")
        if is_sentinel_url(broker):
            url = broker
            if options is None:
                raw = get("broker_transport_options") or {}
                raw = raw if isinstance(raw, Mapping) else {}
                options = {k: raw[k] for k in SENTINEL_OPTIONS if k in raw}
                names = BROKER
            else:
                names = Names(url=BROKER.url)
        elif isinstance(broker, str) and broker.startswith(REDIS_SCHEMES):
            url = broker.split(";")[0]  # failover alternates: the first, as kombu starts there
            names = Names(url=BROKER.url)
        else:
            if options:
                raise ConfigError(
                    "governor_redis_transport_options is set but governor has no Redis URL: "
                    "set governor_redis_url"
                )
            return None, None
    found = target(
        url,
        cluster=False if cluster is None else cluster,
        options=options,
        client=factory,
        names=names,
    )
    return (None if found.kind == "factory" else found.url), found
