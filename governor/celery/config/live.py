"""Live limits: a queue's, task's or key's limit changed for every worker at once, without a
deploy, and changed back.

::

    $ governor -A proj limits set queue:emails "20/s, 800/d"
    $ governor -A proj limits show
    $ governor -A proj limits reset queue:emails          # back to the configuration

A live limit is stored in Redis under its label (``queue:emails``, ``task:proj.sync``, or a
per-key limit's name) with who set it and when, in one hash, with a version counter that every
change increments (both in the ``{live}`` hash slot). Each process of a worker looks at the
version at most once every :data:`REFRESH` seconds, on its next decision, and reads the hash
only when it changed: a change reaches every worker within about a second, at the cost of one
``GET`` per second per busy process. The configuration stays the default: a label without a
live limit uses it, and a live limit replaces it whole (rules, algorithm, cap, shadow). A live
limit only applies to a limit the configuration has (it changes a limit; it adds none).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from ...errors import ConfigError
from ...text import as_text
from .. import signals
from ..types import LimitConfig, LimitSpec
from .factors import Factor, read_factors, scaled
from .limit_config import limit_config
from .settings import Settings

__all__ = ["REFRESH", "LiveEntry", "LiveLimits", "LiveView"]

logger = logging.getLogger("governor.celery")
REFRESH = 1.0
"""Seconds between a process's looks at the live limits' version."""
MAX_LABEL = 300


@dataclass(frozen=True, slots=True)
class LiveEntry:
    """One live limit as stored: the value (as ``governor_queues`` takes it), who and when."""

    label: str
    value: Mapping[str, Any]
    by: str
    at: float


class LiveLimits:
    """The live limits in Redis (the CLI writes them; workers read them through LiveView)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.key = f"{prefix}:{{live}}:limits"
        self.version_key = f"{prefix}:{{live}}:version"

    def set(
        self, label: str, value: Mapping[str, Any], by: str, settings: Settings | None = None
    ) -> LiveEntry:
        """Store a live limit for ``label`` (checked first: nothing is written if it is bad)."""
        check_label(label)
        algorithm = settings.algorithm if settings else "sliding_log"
        limit_config(dict(value), algorithm, f"live limit {label!r}")
        entry = LiveEntry(label, dict(value), str(by)[:200], time.time())
        record = {"value": entry.value, "by": entry.by, "at": entry.at}
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self.key, label, json.dumps(record))
        pipe.incr(self.version_key)
        pipe.execute()
        return entry

    def reset(self, label: str) -> bool:
        """Remove the live limit of ``label`` (back to the configuration); True if there was one."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(self.key, label)
        pipe.incr(self.version_key)
        removed, _ = pipe.execute()
        return bool(removed)

    def version(self) -> int:
        return int(self.client.get(self.version_key) or 0)

    def entries(self) -> dict[str, LiveEntry]:
        """Every live limit by label (an entry that does not parse is left out, logged)."""
        out: dict[str, LiveEntry] = {}
        for raw_label, raw in self.client.hgetall(self.key).items():
            label = as_text(raw_label)
            try:
                record = json.loads(raw)
                out[label] = LiveEntry(
                    label, dict(record["value"]), str(record["by"]), float(record["at"])
                )
            except (ValueError, KeyError, TypeError):
                logger.error("governor: live limit %r in Redis does not parse: %r", label, raw)
        return out


def check_label(label: str) -> None:
    if not isinstance(label, str) or not label.strip() or len(label) > MAX_LABEL:
        raise ConfigError(f"a live limit needs a label of 1 to {MAX_LABEL} characters: {label!r}")


class LiveView:
    """A process's view of the live limits: :meth:`apply` gives a call's limits their live
    configuration, refreshed at most every :data:`REFRESH` seconds."""

    def __init__(
        self, client: Callable[[], Any], settings: Settings, refresh: float = REFRESH
    ) -> None:
        self.client = client
        """The process's Redis client (called each time: a forked pool process makes its own)."""
        self.settings = settings
        self.refresh = refresh
        self.configs: dict[str, LimitConfig] = {}
        self.factors: dict[str, Factor] = {}
        """Adaptive limits' factors by label (see :mod:`.factors`)."""
        self._version: bytes | None = None
        self._checked = -float("inf")
        self._lock = threading.Lock()

    def current(self) -> tuple[dict[str, LimitConfig], dict[str, Factor]]:
        """The live configurations and the adaptive factors by label, looked at again when
        :attr:`refresh` seconds have passed. A change replaces both dicts (never updated in
        place): their identity says whether anything changed since a caller last looked."""
        if time.monotonic() - self._checked >= self.refresh:
            self._look()
        return self.configs, self.factors

    def apply(self, specs: list[LimitSpec]) -> list[LimitSpec]:
        configs, factors = self.current()
        if not configs and not factors:
            return specs
        out = []
        for spec in specs:
            config = configs.get(spec.label, spec.config)
            factor = factors.get(spec.label) if config.adaptive else None
            if factor is not None:
                settings = self.settings
                now = factor.at(time.time(), settings.adaptive_rise, settings.adaptive_hold)
                config = scaled(config, now)
            out.append(spec if config is spec.config else replace(spec, config=config))
        return out

    def changed(self) -> None:
        """Look again at the next call (this process just changed something)."""
        self._checked = -float("inf")

    def _look(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # another thread is looking
        try:
            self._checked = time.monotonic()
            live = LiveLimits(self.client(), self.settings.prefix)
            version = live.client.get(live.version_key)
            if version == self._version:
                return
            configs = {}
            for label, entry in live.entries().items():
                try:
                    configs[label] = limit_config(
                        entry.value,
                        self.settings.algorithm,
                        f"live limit {label!r}",
                        self.settings.concurrency_lease,
                    )
                except ConfigError as exc:
                    logger.error("governor: ignoring a bad live limit: %s", exc)
            if configs != self.configs:
                logger.info(
                    "governor: live limits: %s",
                    ", ".join(f"{k} = {v.text}" for k, v in sorted(configs.items())) or "none",
                )
                changed = {k for k in configs.keys() | self.configs.keys()}
                changed -= {k for k in changed if configs.get(k) == self.configs.get(k)}
                signals.live_limits_changed.send(
                    sender=None,
                    labels=sorted(changed),
                    limits={k: v.text for k, v in configs.items()},
                )
            self.factors = read_factors(live.client, self.settings.prefix)
            self.configs, self._version = configs, version
        except (RedisError, RedisClusterException) as exc:
            # keep what was known; the decision itself will tell if Redis is away
            logger.debug("governor: could not read live limits: %s", exc)
        finally:
            self._lock.release()
