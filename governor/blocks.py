"""Manual blocks and upstream pauses: the arguments of ``block.lua`` and ``pause.lua``, checked,
and the pause's reply. (:class:`~governor.core.LimiterBase` builds its calls with these.)"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .decision import Pause
from .errors import ConfigError
from .text import as_text

__all__ = [
    "MAX_DURATION",
    "PAUSE_MARK",
    "block_call",
    "block_reason",
    "duration_us",
    "parse_pause",
    "pause_call",
    "us",
]

MAX_DURATION = 3_155_760_000.0
"""The longest block or pause (seconds): 100 years. Its end stays an exact integer of
microseconds (below 2**53) for any clock before the year 2150; ``block.lua`` and ``pause.lua``
cut longer ones to it too."""

PAUSE_MARK = "\x1e"
"""Stored before the reason of a block that an upstream pause made (``pause.lua``), so readers
tell a pause from a manual block; :func:`block_reason` takes it off."""

ScriptCall = tuple[list[str], list[bytes | str | int]]
"""One script call: its keys and its arguments (``EVALSHA sha len(keys) *keys *args``)."""


def us(value: float, what: str) -> int:
    """Seconds (a finite, non-negative number) to integer microseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ConfigError(f"{what} must not be negative, got {value!r}")
    return round(value * 1_000_000)


def duration_us(value: float, what: str) -> int:
    """A block's or pause's length in seconds (positive, at most :data:`MAX_DURATION`) to
    integer microseconds."""
    duration = us(value, what)
    if duration < 1:
        raise ConfigError(f"{what} must be positive, got {value!r}")
    if value > MAX_DURATION:
        raise ConfigError(
            f"{what} must be at most {MAX_DURATION:.0f}s (100 years), got {value!r}: "
            "for a block without end, block for 100 years and unblock by hand"
        )
    return duration


def block_call(key: str, seconds: float, reason: str, now: float | None) -> ScriptCall:
    """``block.lua`` on the block ``key``: deny for ``seconds``, replacing any block."""
    duration = duration_us(seconds, "block duration")
    if not isinstance(reason, str):
        raise ConfigError(f"block reason must be a string, got {reason!r}")
    return [key], ["" if now is None else us(now, "now"), duration, reason]


def pause_call(
    key: str,
    level_key: str,
    seconds: float | None,
    reason: str,
    base: float,
    max_pause: float,
    now: float | None,
) -> ScriptCall:
    """``pause.lua``: ``seconds`` None pauses for base x 2^(level - 1), at most ``max_pause``
    (one level more each time, forgotten after twice the pause). The reason is cut to 500
    characters (it may come from an upstream's answer)."""
    if not isinstance(reason, str):
        raise ConfigError(f"pause reason must be a string, got {reason!r}")
    base_us, max_us = duration_us(base, "backoff base"), duration_us(max_pause, "longest pause")
    if max_us < base_us:
        raise ConfigError(f"backoff needs 0 < base <= max_pause, got {base!r}, {max_pause!r}")
    duration: int | str = ""
    if seconds is not None:
        duration = duration_us(seconds, "a pause")
    at = "" if now is None else us(now, "now")
    return [key, level_key], [at, duration, PAUSE_MARK + reason[:500], base_us, max_us]


def block_reason(raw: bytes | str) -> tuple[str, bool]:
    """A stored block reason as (the reason, whether an upstream pause made the block)."""
    text = as_text(raw)
    if text.startswith(PAUSE_MARK):
        return text[len(PAUSE_MARK) :], True
    return text, False


def parse_pause(reply: Sequence[Any]) -> Pause:
    return Pause(int(reply[0]) / 1e6, int(reply[1]) / 1e6, int(reply[2]))
