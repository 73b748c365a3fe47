"""Which tenant a call of a fair limit is for: the limit's ``fair_by`` (a task argument's name,
or a callable getting the arguments by name), and the producer's ``governor_tenant`` header as
``governor_tenant_header`` says:

- ``"fallback"`` (the default): the header names the tenant only of a call whose arguments
  name none (``fair_by``'s argument missing, None or ``""``, or its callable failing). A
  producer can then neither move a call that names its customer to another tenant's share nor
  split one customer over many shares; it can still place calls that name nobody.
- ``"override"``: the header wins over ``fair_by`` (trust every producer: say, one gateway
  stamps the tenant on every message);
- ``"ignore"``: only ``fair_by`` counts.

A tenant is a name: :func:`tenant_text` turns a value into one, injectively (different values
are different tenants; the deliberate exceptions below), bounded and printable, since tenants
come from untrusted arguments and headers and become Redis members and metric labels:

=========================  ===========================================================
value                      tenant
=========================  ===========================================================
text                       itself, if at most :data:`MAX_TENANT` printable characters
                           not starting with ``~`` (so weights and ``governor status``
                           name tenants as they are written)
an int                     its decimal text: ``42`` and ``"42"`` are one customer (as
                           weights ``{42: 4}`` already assume)
UTF-8 bytes                their text
None, ``""``               no tenant: the default share ``""``
text starting with ``~``   ``~`` + itself (``"~x"`` is ``"~~x"``)
other bytes                ``~bytes:<hex>``
bool, float                ``~bool:True``, ``~float:1.5``
anything else              ``~obj:<module.type>:<str(value)>``
too long, or unprintable   ``~sha256:<digest of the above>``
=========================  ===========================================================

Every name made here that is not plain text starts with ``~``, and a plain name never does,
so no literal name equals a digest or a typed value (before, ``"sha1:<hex>"`` was the digest
of a long name, ``b"\\xff"`` and ``b"\\xfe"`` both became U+FFFD, and ``None`` was ``"None"``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from ..config.task_limits import call_with_arguments
from ..types import LimitSpec

__all__ = ["HEADER_MODES", "MAX_TENANT", "TENANT_HEADER", "tenant_of", "tenant_text"]

logger = logging.getLogger("governor.celery")
TENANT_HEADER = "governor_tenant"
MAX_TENANT = 200
"""The longest tenant name kept as it is; a longer one is replaced by its digest."""
HEADER_MODES = ("fallback", "override", "ignore")
"""What ``governor_tenant_header`` may say (see the module's docstring)."""
MARK = "~"


def tenant_text(value: Any) -> str:
    """The tenant a value names (see the module's docstring): at most :data:`MAX_TENANT`
    printable characters; ``""`` for none."""
    full = _full(value)
    if len(full) <= MAX_TENANT and full.isprintable():
        return full
    digest = hashlib.sha256(full.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{MARK}sha256:{digest}"


def _full(value: Any) -> str:
    """The injective, unbounded form of a value (before :func:`tenant_text` bounds it)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return f"{MARK}bytes:{value.hex()}"
    if isinstance(value, str):
        return MARK + value if value.startswith(MARK) else value
    if isinstance(value, bool):
        return f"{MARK}bool:{value}"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{MARK}float:{value!r}"
    kind = type(value)
    return f"{MARK}obj:{kind.__module__}.{kind.__qualname__}:{value}"


def tenant_of(
    task: Any,
    request: Any,
    spec: LimitSpec,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    header: str = "fallback",
) -> str:
    """The tenant of this call of a fair limit (``header``: ``governor_tenant_header``)."""
    headers = getattr(request, "headers", None) or {}
    given = headers.get(TENANT_HEADER) if isinstance(headers, Mapping) else None
    given_text = "" if given is None or header == "ignore" else tenant_text(given)
    if given_text and header == "override":
        return given_text
    fair_by = spec.config.fair_by
    try:
        if callable(fair_by):
            value = call_with_arguments(task, fair_by, args, kwargs)
        else:
            value = call_with_arguments(task, lambda **named: named[fair_by], args, kwargs)
    except Exception as exc:
        logger.debug("governor: no tenant for %s under %s: %r", task.name, spec.label, exc)
        value = None
    return tenant_text(value) or given_text
