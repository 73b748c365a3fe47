"""How long an upstream asked to wait, read from its response headers.

Works with ``requests``, ``httpx`` and ``urllib3`` responses and with plain header mappings,
without importing any of them::

    >>> wait_from_headers({"Retry-After": "30"})
    30.0
    >>> wait_from_headers({"RateLimit": '"default";r=0;t=12'})
    12.0

Read in this order, the first that answers wins:

1. ``Retry-After``: delta-seconds or an HTTP-date (RFC 9110 10.2.3);
2. the IETF ``RateLimit`` field (draft-ietf-httpapi-ratelimit-headers-08 and later:
   ``"policy";r=<remaining>;t=<seconds to reset>``, or the older
   ``limit=…, remaining=…, reset=…``) and the older separate ``RateLimit-Remaining`` /
   ``RateLimit-Reset``: the reset counts only when nothing remains;
3. ``X-RateLimit-Remaining`` / ``X-RateLimit-Reset`` (GitHub, Twitter, many others): the reset
   is delta-seconds, or Unix seconds or milliseconds when it is that large.

Header values come from outside: a value longer than :data:`MAX_VALUE` characters, negative,
not a number or a date is ignored with a warning; a wait longer than ``max_wait`` is cut to it
(with a warning), so a hostile or broken upstream can never pause a limit for years.
"""

from __future__ import annotations

import email.utils
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MAX_VALUE", "headers_of", "status_of", "wait_from_headers"]

logger = logging.getLogger("governor.upstream")
MAX_VALUE = 256
"""Longest header value read (characters); longer ones are ignored."""
_EPOCH_SECONDS = 1_000_000_000  # a reset at least this large is a Unix time, not a delta
_EPOCH_MS = 1_000_000_000_000
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*$")


def headers_of(response: Any) -> Mapping[str, Any]:
    """The headers of a response (``.headers``), or the mapping itself."""
    headers = getattr(response, "headers", response)
    if headers is None:
        return {}
    if not isinstance(headers, Mapping) and not hasattr(headers, "items"):
        raise TypeError(f"no headers in {type(response).__name__!r}")
    return headers  # type: ignore[no-any-return]


def status_of(response: Any) -> int | None:
    """The HTTP status of a response: ``status_code`` (requests, httpx) or ``status``
    (urllib3, aiohttp); None when there is none."""
    for attr in ("status_code", "status"):
        value = getattr(response, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def wait_from_headers(
    response: Any, *, now: float | None = None, max_wait: float = 3600.0
) -> float | None:
    """Seconds the upstream asked to wait (0 or more, at most ``max_wait``), or None when its
    headers do not say. ``response`` is a response object or a header mapping; ``now`` (Unix
    seconds) is the clock HTTP-dates and Unix-time resets are measured against."""
    headers = headers_of(response)
    now = time.time() if now is None else now
    for read in (_retry_after, _ratelimit, _x_ratelimit):
        wait = read(headers, now)
        if wait is not None:
            if wait > max_wait:
                logger.warning(
                    "governor: upstream asked to wait %.0fs; waiting %.0fs (max_wait)",
                    wait,
                    max_wait,
                )
                return float(max_wait)
            return max(0.0, wait)
    return None


# -- the fields -------------------------------------------------------------------------------


def _get(headers: Mapping[str, Any], name: str) -> str | None:
    """A header's value, whatever the case of its name (plain dicts keep the sender's)."""
    value = None
    try:
        value = headers.get(name)
    except Exception:  # pragma: no cover - an odd mapping
        value = None
    if value is None:
        lower = name.lower()
        for key, candidate in _items(headers):
            if isinstance(key, (str, bytes)) and _text(key).lower() == lower:
                value = candidate
                break
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = ", ".join(_text(v) for v in value)
    text = _text(value)
    if len(text) > MAX_VALUE:
        logger.warning("governor: ignored a %d-character %s header", len(text), name)
        return None
    return text.strip()


def _items(headers: Mapping[str, Any]) -> Iterable[tuple[Any, Any]]:
    try:
        return list(headers.items())
    except Exception:  # pragma: no cover
        return []


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


def _seconds(text: str, name: str) -> float | None:
    """A non-negative finite number of seconds, or None (with a warning)."""
    match = _NUMBER.match(text)
    value = float(match.group(1)) if match else math.nan
    if not math.isfinite(value) or value < 0:
        logger.warning("governor: ignored %s header %r (not a number of seconds)", name, text)
        return None
    return value


def _retry_after(headers: Mapping[str, Any], now: float) -> float | None:
    text = _get(headers, "Retry-After")
    if not text:
        return None
    if _NUMBER.match(text):
        return _seconds(text, "Retry-After")
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        when = None
    if when is None or when.tzinfo is None:
        logger.warning("governor: ignored Retry-After header %r (not a date)", text)
        return None
    return max(0.0, when.timestamp() - now)


def _ratelimit(headers: Mapping[str, Any], now: float) -> float | None:
    text = _get(headers, "RateLimit")
    remaining = reset = None
    if text:
        fields = _params(text)
        remaining, reset = fields.get("r", fields.get("remaining")), fields.get("t")
        reset = reset if reset is not None else fields.get("reset")
    if remaining is None:
        remaining = _get(headers, "RateLimit-Remaining")
    if reset is None:
        reset = _get(headers, "RateLimit-Reset")
    return _when_empty(remaining, reset, now, "RateLimit")


def _x_ratelimit(headers: Mapping[str, Any], now: float) -> float | None:
    remaining = _get(headers, "X-RateLimit-Remaining")
    reset = _get(headers, "X-RateLimit-Reset")
    return _when_empty(remaining, reset, now, "X-RateLimit")


def _params(text: str) -> dict[str, str]:
    """``key=value`` pairs of a structured field (``"p";r=0;t=5``, ``limit=1, reset=5``); of
    several policies, the first."""
    out: dict[str, str] = {}
    first = text.split(",") if ";" in text else [text.replace(",", ";")]
    for part in first[0].split(";"):
        key, eq, value = part.strip().partition("=")
        if eq:
            out.setdefault(key.strip().lower(), value.strip().strip('"'))
    return out


def _when_empty(remaining: str | None, reset: str | None, now: float, name: str) -> float | None:
    """The reset, in seconds from now, when nothing remains; else None."""
    if remaining is None or reset is None:
        return None
    left = _seconds(remaining, f"{name}-Remaining")
    if left is None or left > 0:
        return None
    value = _seconds(reset, f"{name}-Reset")
    if value is None:
        return None
    if value >= _EPOCH_MS:
        return max(0.0, value / 1000 - now)
    if value >= _EPOCH_SECONDS:
        return max(0.0, value - now)
    return value
