"""Who may use a dashboard: the ``Host`` names it answers to, where writes may come from, and
the token it may ask for. :func:`protect` puts the checks in front of every route.

====================  ===================================================================
check                 refused with
====================  ===================================================================
``Host``              403 unless a loopback name (``localhost``, ``*.localhost``, 127.x,
                      ::1), the address listened on (any IP address when listening on
                      every interface: a DNS rebinding needs a name) or ``--allowed-host``
``Origin``, writes    403 for a POST from another origin (``Origin`` not the ``Host``
                      asked, nor an ``--allowed-host``; ``Sec-Fetch-Site`` cross-site)
token (if set)        401 (the API; ``WWW-Authenticate: Bearer``) or the login page
====================  ===================================================================

A token is given as ``Authorization: Bearer TOKEN`` (scripts), through the login page's form
(browsers: ``POST /login`` sets a session cookie), or once as ``?token=TOKEN`` (a link: the
answer sets the cookie and reloads the page without it). The cookie holds no token: an expiry
and its HMAC under the token (so a new token ends every session), ``HttpOnly``,
``SameSite=Strict``, ``Secure`` behind HTTPS. Every comparison is constant-time.

>>> access = Access("0.0.0.0", ("dash.example.com",), token=token)  # doctest: +SKIP
>>> protect(app, access)                                            # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from flask import Flask, Response, jsonify, redirect, render_template, request
from werkzeug.wrappers import Response as BaseResponse

__all__ = [
    "MIN_TOKEN",
    "SESSION_SECONDS",
    "TOKEN_ENV",
    "Access",
    "check_token",
    "host_name",
    "is_loopback",
    "protect",
]

log = logging.getLogger("governor.dashboard")

TOKEN_ENV = "GOVERNOR_DASHBOARD_TOKEN"
MIN_TOKEN = 16
"""Characters a token needs at least."""
SESSION_SECONDS = 12 * 3600
"""How long a browser stays logged in."""
HOURS = SESSION_SECONDS // 3600
WILDCARDS = ("", "0.0.0.0", "::")
_HOST = re.compile(r"(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\])(?::\d{1,5})?")
"""A ``Host`` header: a name or an address, a port (anything else is refused)."""
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
OPEN_ENDPOINTS = ("static", "login")
"""Served without a token (the login page and its stylesheet; a Host check still applies)."""


def check_token(token: str, where: str) -> str:
    """``token`` stripped, or ValueError saying what a usable token is."""
    token = token.strip()
    if len(token) < MIN_TOKEN or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError(
            f"the dashboard token ({where}) must be at least {MIN_TOKEN} printable ASCII "
            "characters without spaces; make one with: python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'"
        )
    return token


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def host_name(host: str) -> str:
    """The name in a ``Host`` header or an address, without port, brackets, final dot or case.

    >>> host_name("[::1]:8055"), host_name("Dash.Example.COM.:443"), host_name("10.0.0.5")
    ('::1', 'dash.example.com', '10.0.0.5')
    """
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine only."""
    name = host_name(host)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    if name in WILDCARDS:
        return False
    ip = _ip(name)
    if ip is not None:
        return ip.is_loopback
    try:
        found = [_ip(str(info[4][0])) for info in socket.getaddrinfo(name, None)]
    except OSError:
        return False
    return bool(found) and all(ip is not None and ip.is_loopback for ip in found)


@dataclass(frozen=True)
class Access:
    """What :func:`protect` enforces: the address listened on (``bind``), the other ``Host``
    names allowed (``example.com``, or ``.example.com`` for it and its subdomains), and the
    token (None: none asked)."""

    bind: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = {host_name(h) for h in self.allowed_hosts}
        if host_name(self.bind) not in WILDCARDS:
            names.add(host_name(self.bind))
        object.__setattr__(self, "_names", frozenset(names))
        if self.token is not None:
            object.__setattr__(self, "token", check_token(self.token, "given"))

    def host_allowed(self, host: str) -> bool:
        """Whether a request's ``Host`` names this dashboard (not a name rebound to it)."""
        if not host:
            return True  # no Host (HTTP/1.0) is no browser's
        if not _HOST.fullmatch(host):
            return False
        name = host_name(host)
        if name == "localhost" or name.endswith(".localhost"):
            return True  # browsers never ask DNS for these
        ip = _ip(name)
        if ip is not None and (ip.is_loopback or host_name(self.bind) in WILDCARDS):
            return True
        return name in self._names or any(
            entry.startswith(".") and (name == entry[1:] or name.endswith(entry))
            for entry in self._names
        )

    def origin_allowed(self, origin: str, host: str) -> bool:
        """Whether a write from a page at ``origin`` (the ``Origin`` header) sent to ``host``
        (the ``Host`` header) comes from this dashboard's own pages."""
        try:
            parts = urlsplit(origin)
            default = {"http": 80, "https": 443}.get(parts.scheme)
            port = parts.port or default
        except ValueError:
            return False
        if default is None or not parts.hostname:
            return False  # "null": a sandboxed frame, a file, a redirect across sites
        asked = host.strip().lower()
        if ":" not in asked.rsplit("]", 1)[-1]:
            asked = f"{asked}:{default}"  # the port the page's scheme implies
        shown = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        if asked == f"{shown}:{port}":
            return True  # same origin (whatever the scheme: TLS may end at a proxy)
        return any(
            host_name(parts.hostname) == host_name(entry) for entry in self.allowed_hosts
        )  # a proxy that does not pass the Host on: the name browsers use

    # -- sessions --------------------------------------------------------------------------

    def _mac(self, text: str) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), text.encode(), hashlib.sha256).hexdigest()

    @property
    def cookie_name(self) -> str:
        """Named after the token: two dashboards on one host keep their own sessions."""
        return f"governor_dashboard_{self._mac('cookie name')[:8]}"

    def session(self, now: float) -> str:
        """A cookie value good until ``now + SESSION_SECONDS``."""
        until = str(int(now + SESSION_SECONDS))
        return f"{until}.{self._mac(f'session {until}')}"

    def session_valid(self, value: str, now: float) -> bool:
        until, _, mac = value.partition(".")
        if not hmac.compare_digest(_bytes(mac), _bytes(self._mac(f"session {until}"))):
            return False  # so ``until`` is one this dashboard wrote
        return now < int(until) <= now + SESSION_SECONDS

    def token_valid(self, given: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(_bytes(given), _bytes(self.token))


def _bytes(text: str) -> bytes:
    """For :func:`hmac.compare_digest`, which takes ASCII-only text (a request may hold any)."""
    return text.encode("utf-8", "replace")


def _refuse(message: str, status: int, **headers: str) -> Response:
    if request.path.startswith("/api/") or request.method not in SAFE_METHODS:
        response = jsonify(error=message)
    else:
        response = Response(message + "\n", mimetype="text/plain")
    response.status_code = status
    response.headers.update(headers)
    return response


def _local(target: str | None) -> str:
    """``target`` if it is a path of this site, else ``/`` (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def _set_session(response: BaseResponse, access: Access) -> BaseResponse:
    secure = request.is_secure or request.headers.get("X-Forwarded-Proto", "") == "https"
    response.set_cookie(
        access.cookie_name,
        access.session(time.time()),
        max_age=SESSION_SECONDS,
        httponly=True,
        samesite="Strict",
        secure=secure,
        path="/",
    )
    return response


def protect(app: Flask, access: Access) -> None:
    """Check every request to ``app`` as :class:`Access` says, and (with a token) add
    ``/login`` and ``/logout``."""

    @app.before_request
    def check() -> BaseResponse | None:
        if not access.host_allowed(request.host):
            log.warning("dashboard: refused Host %r from %s", request.host, request.remote_addr)
            return _refuse(
                f"Host {host_name(request.host)!r} is not a name this dashboard serves (a page "
                "rebinding its own name to this address?); to serve it under that name, start "
                "it with --allowed-host NAME",
                403,
            )
        if request.method not in SAFE_METHODS:
            origin = request.headers.get("Origin")
            fetched = request.headers.get("Sec-Fetch-Site", "same-origin")
            if fetched not in ("same-origin", "none") or (
                origin is not None and not access.origin_allowed(origin, request.host)
            ):
                log.warning("dashboard: refused a %s from origin %r", request.method, origin)
                return _refuse("a write from another site's page is refused", 403)
        if access.token is None or request.endpoint in OPEN_ENDPOINTS:
            return None
        return _authenticate(access)

    if access.token is None:
        return

    @app.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        target = _local(request.values.get("next"))
        if request.method == "GET":
            return render_template("login.html", next=target, wrong=False, hours=HOURS)
        if access.token_valid(str(request.form.get("token", ""))):
            return _set_session(redirect(target, 303), access)
        log.warning("dashboard: a wrong token from %s", request.remote_addr)
        return render_template("login.html", next=target, wrong=True, hours=HOURS), 401

    @app.post("/logout")
    def logout() -> BaseResponse:
        response = redirect("/login", 303)
        response.delete_cookie(access.cookie_name, path="/")
        return response


def _authenticate(access: Access) -> BaseResponse | None:
    """None when the request carries the token (or a session), else the refusal."""
    bearer = request.headers.get("Authorization", "")
    if bearer[:7].lower() == "bearer " and access.token_valid(bearer[7:].strip()):
        return None
    cookie = request.cookies.get(access.cookie_name)
    if cookie and access.session_valid(cookie, time.time()):
        return None
    given = request.args.get("token")
    if given is not None and access.token_valid(given):
        if request.method != "GET" or request.path.startswith("/api/"):
            return None  # a script's call: answered, no session
        # a link: a session, and the page again without the token; loaded by a page of this
        # site, so the SameSite=Strict cookie goes with it even when the link was followed
        # from another site (after a redirect it would not)
        page = render_template("login.html", next=_without_token(), wrong=False, going=True)
        return _set_session(Response(page, mimetype="text/html"), access)
    if given is not None:
        log.warning("dashboard: a wrong token from %s", request.remote_addr)
    if request.path.startswith("/api/") or request.method not in SAFE_METHODS:
        return _refuse(
            "this dashboard needs its token: Authorization: Bearer TOKEN, or log in at /login",
            401,
            **{"WWW-Authenticate": 'Bearer realm="governor dashboard"'},
        )
    if given is not None:
        page = render_template("login.html", next=_without_token(), wrong=True, hours=HOURS)
        return Response(page, 401, mimetype="text/html")
    return redirect(f"/login?{urlencode({'next': _without_token()})}", 303)


def _without_token() -> str:
    """This request's path and query, without ``token=``."""
    rest = [(k, v) for k, v in request.args.items(multi=True) if k != "token"]
    return request.path + (f"?{urlencode(rest)}" if rest else "")
