"""A checked way to reach Redis (:class:`RedisTarget`) and the client it makes; made by
:func:`governor.connect.target`, which also documents the URL forms."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from .errors import ConfigError, StorageUnavailable

__all__ = ["ClientUnavailable", "RedisTarget", "close_client", "mask_url"]


class ClientUnavailable(StorageUnavailable, redis.ConnectionError):
    """No client could be made: a cluster none of whose startup nodes answered, a factory that
    raised. Both a Redis error and governor's "not now", so every path that copes with an
    unreachable Redis (``except RedisError`` or ``except StorageUnavailable``) copes with it."""


def _cluster_retry() -> Retry:
    """A cluster command that meets a connection error re-reads the slot map and tries once
    more, at once (enough to follow a failover that already happened). redis-py's default, 10
    retries with backoff, kept a transaction (claiming a released task) blocked for about 4 s
    per call on a killed master's slots, holding the pool process instead of following
    ``governor_fail_mode``. A new one per client: redis-py adjusts its copies. It goes with
    ``reinitialize_steps=1``: a transaction re-reads the slot map only every that many errors,
    counted per pipeline, so with fewer retries than 5 it would keep the dead master's address
    for good."""
    return Retry(NoBackoff(), 1)


_URL_LIST_START = re.compile(r"(?:^|(?<=[;,\s]))(?:rediss?|unix|sentinel)://", re.IGNORECASE)
"""Where each URL of a URL list starts (Sentinel URLs are joined by ``;``)."""
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://")
"""Where a URL starts inside a message (any scheme: a broker's ``amqp://`` too)."""
_URL_END_IN_TEXT = re.compile(r"[\s'\"<>`]")
_SECRET_OPTION = re.compile(
    r"([?&;][\w.-]*(?:pass|pwd|secret|token|auth|credential)[\w.-]*=)"
    r"(?:[^&]|&(?![A-Za-z_][\w.-]*=))*",
    re.IGNORECASE,
)
"""A query option holding a secret (``password=``, ``ssl_password=``, ``token=``...): its value
runs to the next ``&option=``, so a raw ``&`` inside it stays hidden too."""


def mask_url(text: str) -> str:
    """``text`` with every secret of every URL in it replaced by ``***``: safe to print.

    The one function governor shows URLs through (CLI, ``doctor``, errors, the dashboard). A
    text that starts with a URL is a URL, or a list of them (Sentinel's ``;``, a cluster's
    ``,``), masked whole, whatever its password holds; in any other text (a message quoting a
    URL) each URL ends at a space or a quote. In each URL:

    - the password of the user info, up to the **last** ``@`` (a raw ``@``, ``/``, ``?`` or
      ``#`` in it stays hidden); the user name is kept, a lone user info (no ``:``) is hidden;
    - the value of every query option whose name says secret: ``password=``,
      ``ssl_password=``, ``token=``, ``secret=``, ``auth=`` ... (``username=`` is kept).

    An ``@`` in a query value other than a secret's makes the text before it look like user
    info, and it is hidden too: masking errs on the side of hiding.

    >>> mask_url("sentinel://:pw@a:26379;sentinel://:pw@b:26379/1")
    'sentinel://:***@a:26379;sentinel://:***@b:26379/1'
    >>> mask_url("redis://:p@ss@h:6379/0?username=app&password=hunter2")
    'redis://:***@h:6379/0?username=app&password=***'
    >>> mask_url("cannot reach rediss://u:pw@h:6380 (timeout)")
    'cannot reach rediss://u:***@h:6380 (timeout)'
    """
    whole = _URL_LIST_START.match(text.lstrip()) is not None
    starts = [m.start() for m in (_URL_LIST_START if whole else _URL_IN_TEXT).finditer(text)]
    if not starts:
        return text
    out = [text[: starts[0]]]
    for start, end in zip(starts, [*starts[1:], len(text)]):
        chunk = text[start:end]
        cut = re.search(r"[;,\s]*$" if whole else _URL_END_IN_TEXT, chunk)
        at = cut.start() if cut is not None else len(chunk)
        out += [_mask_one(chunk[:at]), chunk[at:]]
    return "".join(out)


def _mask_one(url: str) -> str:
    after_scheme = url.index("://") + 3
    url = _SECRET_OPTION.sub(r"\1***", url)  # first: an @ in a secret's value is no user info
    at = url.rfind("@", after_scheme)
    if at < 0:
        return url
    user, colon, _ = url[after_scheme:at].partition(":")
    return f"{url[:after_scheme]}{user + ':***' if colon else '***'}{url[at:]}"


@dataclass(frozen=True)
class RedisTarget:
    """A checked way to reach Redis; :meth:`client` makes a client (each call a new one)."""

    kind: Literal["redis", "sentinel", "cluster", "factory"]
    url: str
    """The URL as given (the factory's dotted path for ``factory``): print it with mask_url."""
    nodes: tuple[tuple[str, int], ...] = ()
    """Sentinels (``sentinel``) or startup nodes (``cluster``)."""
    params: Mapping[str, Any] = field(default_factory=dict, compare=False)
    master_name: str | None = None
    sentinel_kwargs: Mapping[str, Any] | None = field(default=None, compare=False)
    min_other_sentinels: int = 0
    factory: Callable[[], Any] | None = field(default=None, compare=False)

    def describe(self) -> str:
        """Where it connects, without passwords: for messages and ``governor status``."""
        if self.kind == "factory":
            return f"client from {self.url}"
        if self.kind == "sentinel":
            return f"{mask_url(self.url)} (master {self.master_name!r})"
        if self.kind == "cluster":
            return f"{mask_url(self.url)} (cluster)"
        return mask_url(self.url)

    def client(
        self, *, socket_timeout: float | None = None, socket_connect_timeout: float | None = None
    ) -> redis.Redis:
        """A new client. Raises :class:`ClientUnavailable` for a factory that fails or a
        cluster none of whose startup nodes answers (other clients connect on first use)."""
        timeouts = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
        }
        if self.kind == "redis":
            return redis.Redis.from_url(self.url, **timeouts)
        if self.kind == "sentinel":
            sentinel = Sentinel(  # type: ignore[no-untyped-call]
                list(self.nodes),
                min_other_sentinels=self.min_other_sentinels,
                sentinel_kwargs={**timeouts, **(self.sentinel_kwargs or {})},
            )
            assert self.master_name is not None
            master = sentinel.master_for(  # type: ignore[no-untyped-call]
                self.master_name, **{**timeouts, **self.params}
            )
            return cast(redis.Redis, master)
        if self.kind == "cluster":
            try:
                cluster = RedisCluster(
                    startup_nodes=[
                        ClusterNode(host, port)  # type: ignore[no-untyped-call]
                        for host, port in self.nodes
                    ],
                    retry=_cluster_retry(),
                    reinitialize_steps=1,
                    **{**timeouts, **self.params},
                )
            except RedisClusterException as exc:  # no startup node answered (redis-py says so)
                raise ClientUnavailable(mask_url(str(exc))) from exc
            return cast(redis.Redis, cluster)
        assert self.factory is not None
        try:
            made = self.factory()
        except Exception as exc:
            raise ClientUnavailable(
                f"the Redis client factory {self.url} raised {type(exc).__name__}: "
                f"{mask_url(str(exc))}"
            ) from exc
        if not callable(getattr(made, "evalsha", None)):
            raise ConfigError(
                f"the Redis client factory {self.url} returned {type(made).__name__}, "
                "not a redis-py client (redis.Redis, a Sentinel master or RedisCluster)"
            )
        return cast(redis.Redis, made)


def close_client(client: Any) -> None:
    """Close a client and, for a Sentinel master, its connections to the sentinels."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    client.close()
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()
