"""Learned estimates: reserve what a task really uses, not its worst case.

A meter of ``governor_cost`` given as ``learned(default, most=...)`` reserves::

    min(most, ceil(default * r))

where ``r`` is the ``governor_learned_percentile`` (0.95) of use/default over the last
:data:`KEEP` calls of the task that settled that meter. The ratio, not the units, is learned:
calls with long prompts or a large ``max_tokens`` keep reserving more than short ones, in
proportion. With fewer than :data:`MIN_USES` settled calls, a call reserves ``default``: a
first call, or a task with little history, reserves what the caller said.

- Bounded: :data:`KEEP` numbers per task and meter, in one Redis list each, gone after
  :data:`TTL` seconds without a settle.
- Robust: a percentile of the last 200 ignores the rarest ten, whatever their size; a call that
  used far more than its estimate is still charged its overrun when it settles, so an estimate
  that is too low costs a wait, never a breach.
- Adapts: the window moves with every settle; a process re-reads the percentile after each of
  its own settles (the same script call) and at most :data:`FRESH` seconds after it last read
  it, so a decision costs no Redis call of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from redis.exceptions import RedisError

from ...errors import GovernorError
from ...scripts import LuaScript, package_script, run_script
from ..config.settings import Settings
from .costs import Learned

__all__ = ["FRESH", "KEEP", "MIN_USES", "TTL", "Learning", "learned_key", "totals_key"]

logger = logging.getLogger("governor.celery")

KEEP = 200
"""Uses a task keeps per meter."""
MIN_USES = 10
"""Below this many, a call reserves the default."""
TTL = 30 * 86_400
"""Seconds a task's uses live after its last settle."""
FRESH = 30.0
"""Seconds a process trusts a percentile it read (its own settles refresh it at once)."""
MAX_RATIO_PPM = 100_000_000
"""A use counts as at most 100 times its default."""
MEMORY = 10_000
"""(task, meter) pairs a process remembers; past that it starts afresh."""

Key = tuple[str, str]


def totals_key(prefix: str) -> str:
    return f"{prefix}:{{metering}}:totals"


def learned_key(prefix: str, task: str, meter: str) -> str:
    return f"{prefix}:{{metering}}:learn:{task}|{meter}"


def _script() -> LuaScript:
    return package_script("governor.celery.metering", "record")


class Learning:
    """One process's learned estimates and its writes of the totals (threads share it)."""

    def __init__(self, settings: Settings, client: Callable[[], Any]) -> None:
        self.settings = settings
        self.client = client
        self._lock = threading.Lock()
        self._ratios: dict[Key, tuple[float, int | None]] = {}
        """(task, meter) -> (monotonic expiry, ratio in ppm or None: too little history)."""

    def estimate(self, task: str, meter: str, marker: Learned) -> int:
        """The units a call reserves for ``marker`` (may read Redis once per :data:`FRESH`)."""
        ppm = self.ratio(task, meter)
        units = marker.default if ppm is None else -(-marker.default * ppm // 1_000_000)
        return units if marker.most is None else min(units, marker.most)

    def ratio(self, task: str, meter: str) -> int | None:
        with self._lock:
            known = self._ratios.get((task, meter))
        if known is not None and known[0] > time.monotonic():
            return known[1]
        try:
            return self.record({}, {(task, meter): None})[(task, meter)]
        except (GovernorError, RedisError) as exc:  # Redis away: the default, for a while
            logger.debug("governor: learned estimate of %s/%s not read: %r", task, meter, exc)
            self._keep({(task, meter): None}, FRESH / 10)
            return None

    def record(
        self, totals: Mapping[str, int], uses: Mapping[Key, int | None]
    ) -> dict[Key, int | None]:
        """Add to the totals, add uses (ppm of the default; None: read only), and return each
        key's learned ratio (ppm; None: fewer than :data:`MIN_USES`). One script call."""
        prefix = self.settings.prefix
        pairs = [x for field, units in totals.items() if units for x in (field, units)]
        keys = [totals_key(prefix)] + [learned_key(prefix, t, m) for t, m in uses]
        ppm = max(1, min(999_999, round(self.settings.learned_percentile * 1_000_000)))
        args: list[Any] = [ppm, KEEP, TTL, len(pairs) // 2, *pairs]
        args += ["" if use is None else min(max(0, use), MAX_RATIO_PPM) for use in uses.values()]
        reply = run_script(self.client(), _script(), keys, args)
        out = {
            key: (int(at) if int(count) >= MIN_USES else None)
            for key, (count, at) in zip(uses, reply)
        }
        self._keep(out, FRESH)
        return out

    def _keep(self, ratios: Mapping[Key, int | None], fresh: float) -> None:
        until = time.monotonic() + fresh
        with self._lock:
            if len(self._ratios) > MEMORY:
                self._ratios.clear()
            for key, ppm in ratios.items():
                self._ratios[key] = (until, ppm)


def use_ppm(used: int, default: int) -> int | None:
    """A use as parts per million of its default (None: a default of 0 teaches nothing)."""
    if default <= 0:
        return None
    return min(MAX_RATIO_PPM, used * 1_000_000 // default)
