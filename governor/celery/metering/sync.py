"""The upstream's own counters, folded into governor's: ``observe`` after a success, and the
headers of a 429 that a :class:`~governor.celery.Backoff` carries.

OpenAI's ``x-ratelimit-remaining-{requests,tokens}`` and Anthropic's
``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining`` say what the
upstream has left (:func:`governor.upstream.quotas_from_headers` parses them, bounded; malformed
values are ignored). When governor counted more room than that for the meter of the same name
(another client spends the same key), :meth:`~governor.Limiter.sync_remaining` charges the
difference, so every worker sees it at its next decision. The room compared is governor's as
of the call's admission (``as_of``): the upstream read its counter when the call arrived, and
calls admitted since would otherwise hide that much of the other client's spending. From what
the readings find, the sliding log keeps headroom for what the other client spends after the
latest reading (docs/token-quotas.md).

Which limit: the one named (``"key"``, ``"task"``, ``"queue"``, ``"all"`` or a label, as for
Backoff), else the most specific limit of the call with a meter the upstream reports (its key's,
else its task's, else its queue's): the upstream's counters are per API key, which is what a
per-key limit usually stands for. ``meters`` renames the upstream's counters
(``{"tokens": "output_tokens"}``); by default a counter syncs the meter of its own name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from redis.exceptions import RedisError

from ...decision import Decision
from ...errors import GovernorError
from ...limiter import Limiter
from ...upstream import Quota, quotas_from_headers
from .. import signals
from ..types import LimitSpec

__all__ = ["quotas_of", "sync_quotas"]

logger = logging.getLogger("governor.celery")

Metered = list[tuple[Limiter, LimitSpec, Decision]]


def quotas_of(response: Any) -> dict[str, Quota]:
    """The upstream's counters in a response or header mapping; never raises (nothing usable:
    an empty mapping)."""
    try:
        return quotas_from_headers(response)
    except Exception as exc:
        logger.debug("governor: no upstream counters read: %r", exc)
        return {}


def _targets(held: Metered, names: set[str], limit: str | None) -> Metered:
    if limit == "all":
        return list(held)
    if limit is not None:
        return [h for h in held if h[1].kind == limit or h[1].label == limit]
    for kind in ("key", "task", "queue"):
        for h in held:
            if h[1].kind == kind and names & set(h[0].meters):
                return [h]
    return []


def sync_quotas(
    task: Any,
    held: Metered,
    quotas: Mapping[str, Quota],
    *,
    limit: str | None = None,
    meters: Mapping[str, str] | None = None,
) -> dict[str, dict[str, int]]:
    """Charge what governor counted too little, per limit label and meter (units charged).
    Never raises: a limit Redis could not be asked about is left as it is (a debug log)."""
    rename = dict(meters or {})
    wanted = {rename.get(name, name): q for name, q in quotas.items() if q.remaining is not None}
    out: dict[str, dict[str, int]] = {}
    for lim, spec, decision in _targets(held, set(wanted), limit):
        # the upstream read its counter when this call arrived: compare as of its admission
        # (the sliding log leaves out what it admitted since, which the upstream had not seen)
        as_of = decision.slot.end if decision.slot is not None else decision.now
        for meter, quota in wanted.items():
            if meter not in lim.meters:
                continue
            assert quota.remaining is not None
            try:
                charged = lim.sync_remaining(
                    spec.subject,
                    quota.remaining,
                    meter=meter,
                    reset_in=quota.reset_in,
                    as_of=as_of,
                    transit=spec.config.transit,
                )
            except (GovernorError, RedisError) as exc:
                logger.debug("governor: %s not synced with the upstream: %r", spec.label, exc)
                continue
            out.setdefault(spec.label, {})[meter] = charged
            if charged:
                signals.quota_synced.send(
                    sender=task,
                    limit=spec.label,
                    meter=meter,
                    remaining=quota.remaining,
                    charged=charged,
                )
    return out
