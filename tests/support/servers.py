"""Where the suite's Redis lives (the ``redis_server`` fixture of conftest.py gives one)."""

from __future__ import annotations

from governor.embedded import EmbeddedRedis


class ServerHandle:
    """Where the test Redis lives, and (for the private one) how to stop and restart it."""

    def __init__(self, url: str, embedded: EmbeddedRedis | None) -> None:
        self.base_url = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
        self.embedded = embedded

    def url(self, db: int = 0) -> str:
        return f"{self.base_url}/{db}"

    @property
    def private(self) -> bool:
        return self.embedded is not None
