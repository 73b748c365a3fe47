"""Which tenant a call of a fair limit is for: the producer's ``governor_tenant`` header, else
the limit's ``fair_by`` (a task argument's name, or a callable getting the arguments by name).

Tenants come from task arguments and headers, which are untrusted: a tenant is text of at most
:data:`MAX_TENANT` characters without line breaks; a longer or odd one is replaced by a digest of
it (so a 2 MB argument never becomes a 2 MB Redis member). A call whose tenant cannot be worked
out is the default tenant ``""`` (logged at DEBUG): it still runs, in the common share.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from ..config.task_limits import call_with_arguments
from ..types import LimitSpec

__all__ = ["MAX_TENANT", "TENANT_HEADER", "tenant_of", "tenant_text"]

logger = logging.getLogger("governor.celery")
TENANT_HEADER = "governor_tenant"
MAX_TENANT = 200


def tenant_text(value: Any) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    if len(text) > MAX_TENANT or "\n" in text or "\r" in text:
        return "sha1:" + hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()
    return text


def tenant_of(
    task: Any, request: Any, spec: LimitSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> str:
    headers = getattr(request, "headers", None) or {}
    given = headers.get(TENANT_HEADER) if isinstance(headers, Mapping) else None
    if given is not None:
        return tenant_text(given)
    fair_by = spec.config.fair_by
    try:
        if callable(fair_by):
            value = call_with_arguments(task, fair_by, args, kwargs)
        else:
            value = call_with_arguments(task, lambda **named: named[fair_by], args, kwargs)
    except Exception as exc:
        logger.debug("governor: no tenant for %s under %s: %r", task.name, spec.label, exc)
        return ""
    return tenant_text(value)
