"""The HTTP server of a worker's metrics: prometheus_client's WSGI app, optionally behind TLS
(with client certificates) and HTTP basic authentication.

Prometheus exporters usually listen on every address without authentication, and so does this
one by default (``governor_metrics_addr = "0.0.0.0"``): bind it to an internal address, or put
it behind TLS and a password (``governor_metrics_certfile``/``_keyfile``/``_client_cafile``,
``governor_metrics_basic_auth``), as Prometheus' ``scrape_configs`` can present both
(``scheme: https``, ``tls_config``, ``basic_auth``). See docs/security.md.
"""

from __future__ import annotations

import base64
import hmac
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

__all__ = ["Protection", "serve"]

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True, slots=True)
class Protection:
    """How the metrics port is protected (every field optional)."""

    certfile: str | None = None
    keyfile: str | None = None
    client_cafile: str | None = None
    """Require a client certificate signed by this CA (mutual TLS)."""
    basic_auth: tuple[str, str] | None = None
    """(username, password) every scrape must present."""

    def __repr__(self) -> str:  # never show the password
        auth = "set" if self.basic_auth else None
        return (
            f"Protection(certfile={self.certfile!r}, keyfile={self.keyfile!r}, "
            f"client_cafile={self.client_cafile!r}, basic_auth={auth})"
        )

    @property
    def scheme(self) -> str:
        return "https" if self.certfile else "http"


class _Quiet(WSGIRequestHandler):
    """No line on stderr per scrape; a client that stalls is dropped after ``timeout``."""

    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _with_basic_auth(app: WSGIApp, username: str, password: str) -> WSGIApp:
    expected = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "basic" and hmac.compare_digest(token.strip(), expected):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("WWW-Authenticate", 'Basic realm="governor metrics"'), ("Content-Length", "0")],
        )
        return [b""]

    return guarded


def _family(addr: str, port: int) -> socket.AddressFamily:
    infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


def serve(
    registry: Any, port: int, addr: str, protection: Protection | None = None
) -> tuple[Any, threading.Thread]:
    """Serve ``registry`` on ``addr:port`` from a daemon thread: (server, thread)."""
    protection = protection or Protection()
    app: WSGIApp = make_wsgi_app(registry)
    if protection.basic_auth is not None:
        app = _with_basic_auth(app, *protection.basic_auth)

    class Server(ThreadingWSGIServer):
        address_family = _family(addr, port)

    httpd = make_server(addr, port, app, Server, handler_class=_Quiet)
    if protection.certfile:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(protection.certfile, protection.keyfile)
        if protection.client_cafile:
            context.load_verify_locations(cafile=protection.client_cafile)
            context.verify_mode = ssl.CERT_REQUIRED
        # the handshake happens in the request's own thread (first read), not in accept():
        # a client that connects and stalls holds one thread for ``timeout``, not the server
        httpd.socket = context.wrap_socket(
            httpd.socket, server_side=True, do_handshake_on_connect=False
        )
    thread = threading.Thread(target=httpd.serve_forever, name="governor-metrics", daemon=True)
    thread.start()
    return httpd, thread
