"""The Redis a process talks to, and its limiters: one client per process (a forked pool
process makes its own), one :class:`~governor.Limiter` per limit name and configuration.

The client is made by :mod:`governor.connect` from the settings (a URL, Sentinel, a Cluster or
a client factory): every part of the Celery integration (the gate, early deferral, leases,
parking and the releaser, sweepers, ``submit_batch``, live limits) uses this one."""

from __future__ import annotations

import redis

from ...limiter import Limiter
from ...pids import pid
from ..types import LimitConfig
from .factors import limiter_rules
from .settings import Settings

__all__ = ["Store"]


class Store:
    """One process's Redis client and limiters."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._pid: int | None = None
        self._client: redis.Redis | None = None
        self._limiters: dict[tuple[str, LimitConfig], Limiter] = {}

    @property
    def client(self) -> redis.Redis:
        if self._client is None or self._pid != pid():
            self._client = self.settings.require_redis().client(
                socket_timeout=self.settings.socket_timeout,
                socket_connect_timeout=self.settings.socket_timeout,
            )
            self._pid = pid()
        return self._client

    def limiter(self, name: str, config: LimitConfig) -> Limiter:
        lim = self._limiters.get((name, config))
        if lim is None or lim.client is not self.client:
            # an adaptive limit's share runs on the state of its configured rules
            rules, ceiling = limiter_rules(
                config.rules, config.ceiling, config.algorithm, config.adaptive
            )
            lim = Limiter(
                self.client,
                config.rule_spec if config.meters else (rules or None),
                algorithm=config.algorithm,
                name=name,
                prefix=self.settings.prefix,
                concurrency=config.concurrency,
                lease=config.lease,
                ceiling=ceiling,
                settle_within=self.settings.settle_within,
            )
            self._limiters[(name, config)] = lim
        return lim
