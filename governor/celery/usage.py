"""What a task reports after its call: what it used (``settle``) and what the upstream says it
has left (``observe``).

>>> from governor.celery import GovernedTask, Backoff, learned, observe, settle
>>> @app.task(bind=True, base=GovernedTask,
...           governor_limit={"requests": "500/m", "tokens": "30000/m"},
...           governor_key=lambda org, **_: org,
...           governor_cost=lambda org, prompt, max_tokens, **_:
...               {"requests": 1, "tokens": len(prompt) // 4 + max_tokens})
... def complete(self, org, prompt, max_tokens):
...     try:
...         raw = client.chat.completions.with_raw_response.create(...)
...     except openai.RateLimitError as err:
...         raise Backoff.from_response(err.response) from None
...     resp = raw.parse()
...     settle(self, tokens=resp.usage.total_tokens)   # the unused reservation goes back
...     observe(self, raw)                             # the provider's remaining counters
...     return resp.choices[0].message.content

Both act on the limits with meters that admitted the running task (see
:mod:`governor.celery.metering`); in an eager or direct call, or for a task that reserved
nothing under meters, they do nothing. See docs/token-quotas.md, "In Celery".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..decision import Settled
from . import registry
from .metering.costs import learned
from .metering.sync import quotas_of, sync_quotas

__all__ = ["learned", "observe", "settle"]

logger = logging.getLogger("governor.celery")


def _task_id(task: Any) -> str | None:
    request = getattr(task, "request", None)
    if request is None or getattr(request, "called_directly", True):
        return None
    return getattr(request, "id", None)


def settle(
    task: Any, used: Mapping[str, int | None] | None = None, /, **meters: int | None
) -> dict[str, Settled]:
    """Settle the running task's reservation with what it really used, per meter:
    ``settle(self, tokens=1234)`` (or a mapping). A meter left out (or None) was used as
    estimated. The unused units go back to the windows they were counted in, use beyond the
    estimate is charged now; once per admission (a second call, a redelivered copy: nothing
    more), within ``governor_settle_within`` seconds of the admission (later, the estimate
    stands). Returns what settling did per limit label (empty when there was nothing to settle).
    Redis away: the estimate stands, with a warning. Units that are not counts raise
    :class:`~governor.errors.CostError`."""
    task_id = _task_id(task)
    if task_id is None:
        return {}
    installed = registry.find(task.app)
    if installed is None:  # governor is not installed on this app: nothing was reserved
        return {}
    both: dict[str, int | None] = {**(used or {}), **meters}
    return installed.gate.reservations.settle(task_id, both)


def observe(
    task: Any,
    response: Any,
    *,
    limit: str | None = None,
    meters: Mapping[str, str] | None = None,
) -> dict[str, dict[str, int]]:
    """Fold the upstream's own counters into governor's, after a successful call: ``response``
    is a response with ``.headers`` (httpx, requests, the OpenAI and Anthropic clients' raw
    responses) or a header mapping. Where the upstream reports less room for a meter than
    governor counts (another client spends the same key), the difference is charged for every
    worker. ``limit`` names the limit (``"key"``, ``"task"``, ``"queue"``, ``"all"``, a label;
    default: the most specific with such a meter), ``meters`` renames the upstream's counters
    (``{"tokens": "output_tokens"}``). Returns the units charged per limit and meter. Never
    raises: headers that say nothing usable, or Redis away, change nothing."""
    try:
        task_id = _task_id(task)
        if task_id is None:
            return {}
        installed = registry.find(task.app)
        reservation = None if installed is None else installed.gate.reservations.of(task_id)
        if reservation is None:
            return {}
        quotas = quotas_of(response)
        if not quotas:
            return {}
        return sync_quotas(task, reservation.held, quotas, limit=limit, meters=meters)
    except Exception as exc:  # never into the task: its call succeeded
        logger.warning("governor: observe(%s) ignored: %r", getattr(task, "name", task), exc)
        return {}
