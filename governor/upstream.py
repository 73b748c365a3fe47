"""How long an upstream asked to wait, read from its response headers.

Works with ``requests``, ``httpx`` and ``urllib3`` responses and with plain header mappings,
without importing any of them::

    >>> wait_from_headers({"Retry-After": "30"})
    30.0
    >>> wait_from_headers({"RateLimit": '"default";r=0;t=12'})
    12.0

Read in this order, the first that answers wins:

1. ``Retry-After-Ms`` (OpenAI: milliseconds), then ``Retry-After``: delta-seconds or an
   HTTP-date (RFC 9110 10.2.3);
2. the IETF ``RateLimit`` field (draft-ietf-httpapi-ratelimit-headers-08 and later:
   ``"policy";r=<remaining>;t=<seconds to reset>``, or the older
   ``limit=…, remaining=…, reset=…``) and the older separate ``RateLimit-Remaining`` /
   ``RateLimit-Reset``: the reset counts only when nothing remains;
3. ``X-RateLimit-Remaining`` / ``X-RateLimit-Reset`` (GitHub, Twitter, many others): the reset
   is delta-seconds, or Unix seconds or milliseconds when it is that large.

Header values come from outside: a value longer than :data:`MAX_VALUE` characters, negative,
not a number or a date is ignored with a warning; a wait longer than ``max_wait`` is cut to it
(with a warning), so a hostile or broken upstream can never pause a limit for years.

The upstream's own counters (how much of each quota is left, and when it is full again) are
read by :func:`quotas_from_headers`:

    >>> quotas_from_headers({"x-ratelimit-remaining-tokens": "29000",
    ...                      "x-ratelimit-reset-tokens": "6m0s"})["tokens"]
    Quota(name='tokens', limit=None, remaining=29000, reset_in=360.0)

OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets as Go durations:
``12ms``, ``6m0s``, ``1h2m3.5s``) and Anthropic's
``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}``
(resets as RFC 3339 times). Counts above :data:`MAX_COUNT`, negative or malformed values are
ignored (Azure OpenAI sends ``-1`` and ``0`` for counts it does not know), resets are cut to
``max_reset``; what remains is never above the limit.
"""

from __future__ import annotations

import calendar
import email.utils
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_COUNT",
    "MAX_VALUE",
    "Quota",
    "go_duration",
    "headers_of",
    "quotas_from_headers",
    "rfc3339",
    "status_of",
    "wait_from_headers",
]

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
    ms = _get(headers, "Retry-After-Ms")
    if ms and _NUMBER.match(ms):
        value = _seconds(ms, "Retry-After-Ms")
        if value is not None:
            return value / 1000
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


# -- the upstream's counters --------------------------------------------------------------------

MAX_COUNT = 10**15
"""The largest limit or remaining count read; larger ones are ignored."""
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)
_INTEGER = re.compile(r"^\s*(-?\d{1,20})\s*$")
_OPENAI = ("requests", "tokens")
_ANTHROPIC = ("requests", "tokens", "input-tokens", "output-tokens")


@dataclass(frozen=True, slots=True)
class Quota:
    """One counter an upstream reports: its limit, what is left of it, and in how many seconds
    it is full again (each None when the headers do not say, or say something unusable)."""

    name: str
    """``requests``, ``tokens``, ``input_tokens`` or ``output_tokens``."""
    limit: int | None
    remaining: int | None
    reset_in: float | None


def go_duration(text: str) -> float | None:
    """Seconds in a Go duration (``6m0s``, ``12ms``, ``1h2m3.5s``, ``0``), or None when it is
    not one (or is negative). A plain number is taken as seconds."""
    text = text.strip()
    if text in ("0", "0s"):
        return 0.0
    if _NUMBER.match(text):
        value = float(text)
        return value if value >= 0 and math.isfinite(value) else None
    if not text or len(text) > 64:
        return None
    total, at = 0.0, 0
    for match in _GO_PART.finditer(text):
        if match.start() != at:
            return None
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        at = match.end()
    if at != len(text) or not math.isfinite(total):
        return None
    return total


def rfc3339(text: str) -> float | None:
    """Unix seconds of an RFC 3339 time (``2026-11-02T10:00:05Z``, ``...+01:00``), or None
    when it is not one (a time without its offset is not)."""
    m = _RFC3339.match(text.strip())
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    try:
        at = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):  # pragma: no cover - timegm takes any fields
        return None
    if m.group(9):
        offset = (int(m.group(10)) * 60 + int(m.group(11))) * 60
        at -= offset if m.group(9) == "+" else -offset
    return at + (float(m.group(7)) if m.group(7) else 0.0)


def _count(headers: Mapping[str, Any], name: str) -> int | None:
    """A count header: a non-negative integer up to MAX_COUNT, else None. ``-1`` (a count the
    upstream does not know, as Azure sends) is dropped quietly, anything else with a warning."""
    text = _get(headers, name)
    if text is None:
        return None
    m = _INTEGER.match(text)
    value = int(m.group(1)) if m else None
    if value is None or value > MAX_COUNT or value < -1:
        logger.warning("governor: ignored %s header %r (not a count)", name, text)
        return None
    return value if value >= 0 else None


def _reset(
    headers: Mapping[str, Any], name: str, now: float, max_reset: float, absolute: bool
) -> float | None:
    text = _get(headers, name)
    if not text:
        return None
    if absolute:
        at = rfc3339(text)
        value = None if at is None else max(0.0, at - now)
    else:
        value = go_duration(text)
    if value is None:
        logger.warning(
            "governor: ignored %s header %r (not a %s)",
            name,
            text,
            "time" if absolute else "duration",
        )
        return None
    if value > max_reset:
        logger.warning("governor: %s header %r cut to %.0fs", name, text, max_reset)
        return float(max_reset)
    return value


def _quota(
    name: str, limit: int | None, remaining: int | None, reset: float | None
) -> Quota | None:
    if limit == 0:  # a quota of nothing: the upstream does not know it (Azure), nor what is left
        limit = remaining = None
    if limit is not None and remaining is not None and remaining > limit:
        remaining = limit
    if (limit, remaining, reset) == (None, None, None):
        return None
    return Quota(name.replace("-", "_"), limit, remaining, reset)


def quotas_from_headers(
    response: Any, *, now: float | None = None, max_reset: float = 86_400.0
) -> dict[str, Quota]:
    """The upstream's counters, by name (``requests``, ``tokens``, ``input_tokens``,
    ``output_tokens``), from OpenAI's ``x-ratelimit-*`` and Anthropic's
    ``anthropic-ratelimit-*`` headers; a counter with nothing usable is left out. ``now``
    (Unix seconds) is the clock RFC 3339 resets are measured against."""
    headers = headers_of(response)
    now = time.time() if now is None else now
    out: dict[str, Quota] = {}
    for kind in _OPENAI:
        limit = _count(headers, f"x-ratelimit-limit-{kind}")
        remaining = _count(headers, f"x-ratelimit-remaining-{kind}")
        reset = _reset(headers, f"x-ratelimit-reset-{kind}", now, max_reset, False)
        quota = _quota(kind, limit, remaining, reset)
        if quota is not None:
            out[quota.name] = quota
    for kind in _ANTHROPIC:
        head = f"anthropic-ratelimit-{kind}"
        limit = _count(headers, f"{head}-limit")
        remaining = _count(headers, f"{head}-remaining")
        reset = _reset(headers, f"{head}-reset", now, max_reset, True)
        quota = _quota(kind, limit, remaining, reset)
        if quota is not None:
            out[quota.name] = quota
    return out
