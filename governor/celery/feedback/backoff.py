"""``Backoff``: a task tells governor that its upstream pushed back.

>>> @app.task(base=GovernedTask, governor_limit="10/s",
...           governor_key=lambda customer, **_: customer)
... def call_partner(customer, payload):
...     resp = http.post(URL, json=payload)
...     if resp.status_code in (429, 503):
...         raise Backoff.from_response(resp)   # Retry-After, RateLimit, X-RateLimit-*
...     ...

The limit the task ran under is paused for every worker until the moment the upstream named
(on Redis's clock), and the task runs again after the pause, booked first in line where the
algorithm books, without counting against ``max_retries``. See :mod:`.pausing`.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import ConfigError
from ...upstream import Quota, quotas_from_headers, status_of, wait_from_headers

__all__ = ["Backoff"]

LIMIT_KINDS = ("key", "task", "queue", "all")


class Backoff(Exception):
    """Raise it from a governed task's body when the upstream answered "too many requests".

    ``retry_after``: seconds to pause (None: a capped exponential pause per limit and subject,
    ``governor_backoff_base`` doubling up to ``governor_backoff_max``; so does 0, which an
    upstream sends as ``Retry-After: 0`` or as a reset already past on this host's clock).
    ``limit``: which limit of the call to pause: ``"key"``, ``"task"``, ``"queue"``, ``"all"``,
    or a label as logs show it (``"queue:emails"``); default, the most specific one (key, else
    task, else queue).
    """

    def __init__(
        self, retry_after: float | None = None, *, limit: str | None = None, reason: str = ""
    ) -> None:
        if retry_after is not None and (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, (int, float))
            or not math.isfinite(retry_after)
            or retry_after < 0
        ):
            raise ConfigError(f"Backoff retry_after must be seconds >= 0, got {retry_after!r}")
        if limit is not None and not isinstance(limit, str):
            raise ConfigError(f"Backoff limit must be a string, got {limit!r}")
        self.retry_after = None if retry_after is None else float(retry_after)
        self.limit = limit
        self.reason = str(reason)[:200] if reason else "upstream backoff"
        self.quotas: dict[str, Quota] = {}
        """The upstream's counters its headers reported (from_response), folded into the
        limits with meters of the call (see governor.celery.metering.sync)."""
        super().__init__(self.retry_after, limit, self.reason)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # pickled between processes
        return _backoff, (self.retry_after, self.limit, self.reason, self.quotas)

    def __str__(self) -> str:
        wait = "exponential" if self.retry_after is None else f"{self.retry_after:g}s"
        return f"{self.reason} ({wait}{'' if self.limit is None else ', ' + self.limit})"

    @classmethod
    def from_response(
        cls,
        response: Any,
        *,
        limit: str | None = None,
        reason: str | None = None,
        max_wait: float = 3600.0,
    ) -> Backoff:
        """A Backoff for an HTTP response (``requests``, ``httpx``, ``urllib3``) or a header
        mapping: its ``Retry-After`` / ``RateLimit`` / ``X-RateLimit-*`` headers say how long
        (see :mod:`governor.upstream`), else an exponential pause."""
        wait = wait_from_headers(response, max_wait=max_wait)
        if reason is None:
            status = status_of(response)
            reason = f"HTTP {status}" if status is not None else "upstream backoff"
        backoff = cls(wait, limit=limit, reason=reason)
        try:  # x-ratelimit-remaining-* and the like (bounded; nothing usable: none)
            backoff.quotas = quotas_from_headers(response)
        except Exception:
            backoff.quotas = {}
        return backoff


def _backoff(
    retry_after: float | None, limit: str | None, reason: str, quotas: Any = None
) -> Backoff:
    backoff = Backoff(retry_after, limit=limit, reason=reason)
    backoff.quotas = dict(quotas or {})
    return backoff
