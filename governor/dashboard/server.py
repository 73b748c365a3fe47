"""Run the dashboard: a threaded WSGI server (werkzeug's) and the sampler behind it.

>>> with Dashboard(state, port=0) as d:          # doctest: +SKIP
...     print(d.url)                             # http://127.0.0.1:40123
"""

from __future__ import annotations

import re
import threading
from types import TracebackType
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from ..cli.common import State
from .access import Access
from .app import MAX_BLOCK, create_app
from .sampler import Sampler

__all__ = ["Dashboard"]

_TOKEN = re.compile(r"([?&]token=)[^&\s]*")


class _Handler(WSGIRequestHandler):
    """Logs failed requests only (the pages poll every second), a ``token=`` in them hidden."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if str(code).isdigit() and int(code) >= 400:
            super().log_request(code, size)

    def log(self, type: str, message: str, *args: Any) -> None:
        hidden = [_TOKEN.sub(r"\1***", a) if isinstance(a, str) else a for a in args]
        super().log(type, message, *hidden)


class Dashboard:
    """The sampler and the web server of one dashboard; ``port=0`` picks a free port.

    It answers to loopback names, ``host`` and ``allowed_hosts`` (see
    :class:`~governor.dashboard.access.Access`), and with a ``token`` only to who gives it."""

    def __init__(
        self,
        state: State,
        *,
        host: str = "127.0.0.1",
        port: int = 8055,
        interval: float = 1.0,
        allow_writes: bool = False,
        examine: int = 100,
        history: float = 300.0,
        allowed_hosts: tuple[str, ...] = (),
        token: str | None = None,
        max_block: float = MAX_BLOCK,
    ) -> None:
        self.access = Access(host, tuple(allowed_hosts), token)
        self.sampler = Sampler(state, interval=interval, examine=examine, history=history)
        self.app = create_app(
            self.sampler, allow_writes=allow_writes, access=self.access, max_block=max_block
        )
        self.server: BaseWSGIServer = make_server(
            host, port, self.app, threaded=True, request_handler=_Handler
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = str(self.server.host), int(self.server.port)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    def serve_forever(self) -> None:
        """Sample and serve until interrupted (Ctrl-C), then stop both."""
        self.sampler.start()
        try:
            self.server.serve_forever()
        finally:
            self.close()

    def start(self) -> Dashboard:
        """Sample and serve in background threads."""
        self.sampler.start()
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="governor-dashboard-http", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(timeout=15)
            self._thread = None
        self.server.server_close()
        self.sampler.stop()

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
