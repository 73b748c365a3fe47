"""Shadow limits: tried on real traffic, never deferring anything.

A limit configured (or set live) with ``"shadow": True`` is asked after the call was admitted
by the enforced limits, and counts the call where its rules admit it, as an enforced limit
would. Where they would have deferred it, the call runs anyway: the denial is logged at INFO,
sent as :data:`~governor.celery.signals.shadow_denied` and counted in
``governor_shadow_denied_total``. So a new limit can be watched for a while before it is
enforced (as Envoy's rate limit service's shadow mode). It costs one Redis call per shadow
limit and call.
"""

from __future__ import annotations

import logging

from ...errors import GovernorError
from .. import signals
from ..config.store import Store
from ..metering.costs import share
from ..types import Call

__all__ = ["Shadow"]

logger = logging.getLogger("governor.celery")


class Shadow:
    """The gate's step for shadow limits (after an admission)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def observe(self, call: Call) -> None:
        """Ask every shadow limit of an admitted call; never raises."""
        for spec in call.shadows:
            try:
                lim = self.store.limiter(spec.name, spec.config)
                d = lim.acquire(spec.subject, share(lim, call.cost))
            except GovernorError as exc:
                logger.debug("governor: shadow limit %s not asked: %s", spec.label, exc)
                continue
            if d.allowed:
                continue
            logger.info(
                "governor: shadow limit %s would have deferred %s for %.3fs (%s)",
                spec.label,
                call.name,
                d.retry_after,
                d.rule.text if d.rule else ("blocked" if d.blocked is not None else "-"),
            )
            signals.shadow_denied.send(
                sender=call.task,
                request=call.request,
                limit=spec.label,
                rule=d.rule,
                delay=d.retry_after,
            )
