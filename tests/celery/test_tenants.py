"""Which tenant a call is for (issue 18, finding 16): different values never share a tenant,
and the ``governor_tenant`` header speaks for a call only as ``governor_tenant_header`` says."""

from __future__ import annotations

import hashlib
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from governor.celery import Governor
from governor.celery.fair.tenants import MAX_TENANT, TENANT_HEADER, tenant_text
from support.celery_helpers import config_error, new_app
from support.servers import ServerHandle

LONG = "x" * 300


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("sha1:" + hashlib.sha1(LONG.encode()).hexdigest(), LONG),  # a name equal to a digest
        (b"\xff", b"\xfe"),  # different bytes that are not UTF-8
        (None, "None"),
        (True, "True"),
        (1.5, "1.5"),
        ("~x", "x"),
        ("a\nb", "a\rb"),
        ("y" * 250, "y" * 251),
    ],
)
def test_different_values_are_different_tenants(one: Any, other: Any) -> None:
    assert tenant_text(one) != tenant_text(other)


def test_tenant_ids_are_bounded_and_keep_plain_names() -> None:
    for name in ("acme", "enterprise-co", "ünïcødé", "", "a b", "sha1:x"):
        assert tenant_text(name) == name  # what weights and `governor status` show
    assert tenant_text(42) == "42" == tenant_text("42")  # a number is its decimal name
    assert tenant_text(b"acme") == "acme"  # UTF-8 bytes: their text
    assert tenant_text(None) == ""  # no tenant: the default share
    for odd in ("x" * 2_000_000, "line\nbreak", "\x00", "\ud800", b"\xff" * 500, object()):
        shown = tenant_text(odd)
        assert len(shown) <= MAX_TENANT and "\n" not in shown and shown.startswith("~")
        shown.encode("utf-8")  # always valid text


def reports(redis_server: ServerHandle, **conf: Any) -> Any:
    """The tenant of a call of ``report(customer, n)`` (fair by ``customer``), given its
    headers and arguments, as the gate works it out."""
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(), q, governor_queues={q: {"rules": "5/s", "fair_by": "customer"}}, **conf
    )
    governor = Governor(app)

    @app.task(shared=False)
    def report(customer: Any = None, n: int = 0) -> None: ...

    app.finalize()

    def tenant(headers: dict[str, Any], *args: Any) -> str | None:
        request = SimpleNamespace(headers=headers, delivery_info={"routing_key": q, "exchange": ""})
        return governor.gate.calls.call(report, request, args, {}).specs[0].tenant

    return tenant


def test_the_header_names_the_tenant_only_where_the_arguments_do_not(
    redis_server: ServerHandle,
) -> None:
    """By default (``"fallback"``) a producer's header cannot move a call to another tenant's
    share: before, it overrode ``fair_by`` whatever the call's arguments said."""
    tenant = reports(redis_server)
    header = {TENANT_HEADER: "b"}
    assert tenant(header, "a") == "a"
    assert tenant(header) == "b"  # no customer argument: the header
    assert tenant(header, None) == "b"
    assert tenant({}) == ""
    assert tenant({TENANT_HEADER: None}, None) == ""


@pytest.mark.parametrize(("mode", "expected"), [("override", "b"), ("ignore", "")])
def test_the_header_setting(redis_server: ServerHandle, mode: str, expected: str) -> None:
    tenant = reports(redis_server, governor_tenant_header=mode)
    header = {TENANT_HEADER: "b"}
    assert tenant(header, "a") == ("b" if mode == "override" else "a")
    assert tenant(header) == expected


def test_a_bad_header_setting_fails_at_start(redis_server: ServerHandle) -> None:
    assert "governor_tenant_header" in config_error(
        redis_server.url(), governor_tenant_header="sometimes"
    )
