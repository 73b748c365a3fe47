"""How every part of governor connects to Redis: a URL and a few options make a redis-py client.

==============================================  ==============================================
what                                            client
==============================================  ==============================================
``redis://[user:password@]host[:port][/db]``,   ``redis.Redis.from_url`` (query options as
``rediss://...``, ``unix:///path.sock?db=1``    there)
``sentinel://[:password@]host[:port][/db]``,    ``Sentinel([...]).master_for(master_name)``
one per sentinel joined by ``;``, and the
option ``master_name``
``redis://host1:7000,host2:7000`` (or           ``RedisCluster(startup_nodes=[...])``
``rediss://``) with ``cluster=True``
a factory ``"myproj.redis:make_client"``        what it returns, called with no arguments
==============================================  ==============================================

Sentinel URLs are spelled as Celery and kombu spell them: each sentinel its own ``sentinel://``
URL, separated by ``;``, port 26379 by default. The master's database, user and password may be
written on any one of them (kombu and Celery read them from the first: write them there when the
broker or the result backend shares the URL); two different values are an error. The options
are those of kombu's ``SentinelChannel``: ``master_name`` (required), ``sentinel_kwargs`` (for
the sentinels' own connections, e.g. ``{"password": ...}``; the socket timeouts are added) and
``min_other_sentinels``.

A cluster URL lists startup nodes separated by commas (any reachable one is enough); user,
password, TLS (``rediss``) and query options apply to every node; a cluster has only database 0.
A cluster needs redis-py 6.1 or later (:data:`CLUSTER_REDIS_PY`).

A factory is for anything else (TLS client certificates, IAM tokens, a custom pool): it is called
with no arguments in each process that needs a client (again after a fork), and governor's socket
timeouts are not applied to what it returns: set them in the factory.

:func:`target` checks everything without connecting and raises :class:`ConfigError` naming the
setting or option (:class:`Names`); :meth:`RedisTarget.client` connects. Clients are typed as
``redis.Redis``: a ``RedisCluster`` has every command governor sends.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis
from redis.connection import SSLConnection, parse_url

from .errors import ConfigError
from .redis_target import ClientUnavailable, RedisTarget, close_client, mask_url

__all__ = [
    "CLUSTER_REDIS_PY",
    "SENTINEL_OPTIONS",
    "SETTINGS",
    "ClientUnavailable",
    "Names",
    "RedisTarget",
    "close_client",
    "cluster_supported",
    "is_sentinel_url",
    "load_factory",
    "mask_url",
    "target",
]

SENTINEL_PORT = 26379
REDIS_PORT = 6379
SENTINEL_OPTIONS = ("master_name", "sentinel_kwargs", "min_other_sentinels")
"""The transport options governor reads (kombu's names); others are an error."""
CLUSTER_REDIS_PY = (6, 1)
"""redis-py runs transactions (MULTI/EXEC on one slot) on a RedisCluster from 6.1 on (before, it
refuses them: "transaction is deprecated in cluster mode"); parked tasks and live limits use
them, so a cluster target asks for it."""
_CLUSTER_URL = re.compile(r"(rediss?)://(?:([^/?#]*)@)?([^/?#]*)(/[^?#]*)?(\?[^#]*)?")


@dataclass(frozen=True)
class Names:
    """How the caller spells each input, for error messages (Celery settings by default)."""

    url: str = "governor_redis_url"
    options: str = "governor_redis_transport_options"
    cluster: str = "governor_redis_cluster"
    client: str = "governor_redis_client"
    master: str = "governor_redis_transport_options = {'master_name': 'mymaster'}"
    """How to name a Sentinel master, for the error when it is missing."""


SETTINGS = Names()


def is_sentinel_url(url: object) -> bool:
    return isinstance(url, str) and url.strip().startswith("sentinel://")


def target(
    url: str | None,
    *,
    cluster: bool = False,
    options: Mapping[str, Any] | None = None,
    client: str | None = None,
    names: Names = SETTINGS,
) -> RedisTarget:
    """Check a URL and its options (or a factory's dotted path) without connecting."""
    if client is not None:
        if url is not None:
            raise ConfigError(
                f"{names.client} and {names.url} are both set: the client factory makes the "
                f"client, so leave {names.url} unset"
            )
        return RedisTarget("factory", client, factory=load_factory(client, names.client))
    if not isinstance(url, str) or not url.strip():
        shown = repr(url) if url is None or isinstance(url, str) else type(url).__name__
        raise ConfigError(f"{names.url}: a Redis URL is needed, got {shown}")
    url = url.strip()
    if not isinstance(cluster, bool):
        raise ConfigError(f"{names.cluster} must be True or False, got {cluster!r}")
    options = dict(options or {})
    unknown = sorted(set(options) - set(SENTINEL_OPTIONS), key=str)
    if unknown:
        raise ConfigError(
            f"{names.options}: unknown option(s) {', '.join(map(repr, unknown))}; governor "
            f"reads {', '.join(SENTINEL_OPTIONS)} (for sentinel:// URLs)"
        )
    if is_sentinel_url(url):
        if cluster:
            raise ConfigError(
                f"{names.cluster} is set but {names.url} is a Sentinel URL: a Redis Cluster is "
                "reached through its nodes (redis://host1:7000,host2:7000)"
            )
        return _sentinel(url, options, names)
    if options:
        raise ConfigError(
            f"{names.options} ({', '.join(map(str, options))}) only applies to sentinel:// "
            f"URLs, and {names.url} is {mask_url(url)!r}"
        )
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"{names.url}: bad Redis URL {mask_url(url)!r}: use redis://, rediss://, unix:// or "
            "sentinel:// (e.g. redis://localhost:6379/0)"
        )
    if cluster:
        return _cluster(url, names)
    netloc = urlsplit(url).netloc if scheme != "unix" else ""
    if "," in netloc:
        raise ConfigError(
            f"{names.url}: {mask_url(url)!r} lists several nodes: for a Redis Cluster set "
            f"{names.cluster}"
        )
    _check_db(url, scheme, names)
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise _error(f"{names.url}: bad Redis URL {mask_url(url)!r}: {_why(exc, url)}") from None
    return RedisTarget("redis", url)


def _shown(piece: str, url: str) -> str:
    """``piece`` of ``url`` quoted for a message, or ``'***'`` when it holds what
    :func:`mask_url` hides (a raw ``/`` in a password moves the host into the path:
    ``redis://:pa/ss@host``); :func:`_error` then says how to write the password."""
    masked = mask_url(piece)
    return repr(masked) if masked in mask_url(url) else "'***'"


def _error(message: str) -> ConfigError:
    if "'***'" in message:
        message += (
            " ('***' is part of a password: write '/', '?', '#' and ';' in it as %2F, %3F, "
            "%23, %3B)"
        )
    return ConfigError(message)


def _why(exc: Exception, url: str) -> str:
    """A parser's reason, each quoted part of it checked as :func:`_shown` does (Python's
    ``Port could not be cast to integer value as 'pa'`` may quote a password's head)."""
    return re.sub(r"'([^']*)'", lambda m: _shown(m.group(1), url), str(exc))


def _check_db(url: str, scheme: str, names: Names) -> None:
    path = urlsplit(url).path.strip("/")
    if scheme in ("redis", "rediss") and path and not path.isdigit():
        raise _error(
            f"{names.url}: bad Redis URL {mask_url(url)!r}: the database must be a number, got "
            f"{_shown(path, url)} (e.g. redis://localhost:6379/0)"
        )


def _host_port(text: str, default: int, url: str, names: Names) -> tuple[str, int]:
    try:
        parts = urlsplit(f"//{text}")
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise _error(
            f"{names.url}: bad address {_shown(text, url)} in {mask_url(url)!r}: {_why(exc, url)}"
        ) from None
    if not host:
        raise ConfigError(f"{names.url}: a host is missing in {mask_url(url)!r}")
    return host, port or default


def _sentinel(url: str, options: Mapping[str, Any], names: Names) -> RedisTarget:
    nodes: list[tuple[str, int]] = []
    found: dict[str, set[Any]] = {"db": set(), "username": set(), "password": set()}
    for chunk in filter(None, (part.strip() for part in url.split(";"))):
        if not chunk.startswith("sentinel://"):
            raise _error(
                f"{names.url}: {_shown(chunk, url)} in a Sentinel URL: every sentinel is written "
                "sentinel://host:port, separated by ';'"
            )
        parts = urlsplit(chunk)
        if parts.query or parts.fragment:
            raise _error(
                f"{names.url}: {_shown(chunk, url)}: sentinel URLs take no query options (use "
                f"{names.options}, or {names.client} for TLS and the like)"
            )
        userinfo, _, address = parts.netloc.rpartition("@")
        nodes.append(_host_port(address, SENTINEL_PORT, url, names))
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise _error(
                f"{names.url}: bad Sentinel URL {mask_url(url)!r}: the database must be a "
                f"number, got {_shown(path, url)} (e.g. sentinel://10.0.0.1:26379/1)"
            )
        if path:
            found["db"].add(int(path))
        if userinfo:
            user, colon, password = userinfo.partition(":")
            if user:
                found["username"].add(unquote(user))
            if colon:
                found["password"].add(unquote(password))
    if not nodes:
        raise ConfigError(f"{names.url}: no sentinel in {mask_url(url)!r}")
    params: dict[str, Any] = {}
    for key, values in found.items():
        if len(values) > 1:
            raise ConfigError(
                f"{names.url}: the sentinel URLs give different {key}s ({mask_url(url)!r}): "
                "write it once, on the first"
            )
        if values:
            params[key] = values.pop()
    master = options.get("master_name")
    if not isinstance(master, str) or not master:
        raise ConfigError(
            f"{names.url} is a Sentinel URL: name its master with {names.master} "
            f"(master_name is {master!r})"
        )
    sentinel_kwargs = options.get("sentinel_kwargs")
    if sentinel_kwargs is not None and not isinstance(sentinel_kwargs, Mapping):
        raise ConfigError(
            f"{names.options}['sentinel_kwargs'] must be a mapping of connection options for "
            f"the sentinels (e.g. {{'password': ...}}), got {type(sentinel_kwargs).__name__}"
        )
    others = options.get("min_other_sentinels", 0)
    if isinstance(others, bool) or not isinstance(others, int) or others < 0:
        raise ConfigError(
            f"{names.options}['min_other_sentinels'] must be a whole number >= 0, got {others!r}"
        )
    return RedisTarget(
        "sentinel",
        url,
        nodes=tuple(nodes),
        params=params,
        master_name=master,
        sentinel_kwargs=dict(sentinel_kwargs) if sentinel_kwargs is not None else None,
        min_other_sentinels=others,
    )


def _cluster(url: str, names: Names) -> RedisTarget:
    match = _CLUSTER_URL.fullmatch(url)
    if match is None:
        raise ConfigError(
            f"{names.cluster} is set: {names.url} must list the cluster's nodes as "
            f"redis://host1:7000,host2:7000 (or rediss://), got {mask_url(url)!r}"
        )
    scheme, userinfo, netloc, path, query = match.groups()
    nodes = [_host_port(part.strip(), REDIS_PORT, url, names) for part in netloc.split(",")]
    db = (path or "").strip("/")
    if db not in ("", "0"):
        raise _error(
            f"{names.url}: a Redis Cluster has only database 0, got {_shown(db, url)} in "
            f"{mask_url(url)!r}"
        )
    first = f"{scheme}://{userinfo + '@' if userinfo else ''}{netloc.split(',')[0]}{query or ''}"
    try:
        params = parse_url(first)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise _error(f"{names.url}: bad Redis URL {mask_url(url)!r}: {_why(exc, url)}") from None
    for key in ("host", "port", "db", "path"):
        params.pop(key, None)
    if params.pop("connection_class", None) is SSLConnection:
        params["ssl"] = True
    if not cluster_supported():
        raise ConfigError(
            f"{names.cluster}: a Redis Cluster needs redis-py 6.1 or later (governor runs "
            "transactions on a cluster's slots for parked tasks and live limits); this is "
            f"redis-py {redis.__version__}"
        )
    return RedisTarget("cluster", url, nodes=tuple(nodes), params=params)


def cluster_supported() -> bool:
    """Whether the installed redis-py runs transactions on a cluster (:data:`CLUSTER_REDIS_PY`)."""
    found = tuple(int(part) for part in re.findall(r"\d+", redis.__version__)[:2])
    return found >= CLUSTER_REDIS_PY


def load_factory(path: str, setting: str) -> Callable[[], Any]:
    """The callable at ``"package.module:attribute"`` (or ``"package.module.attribute"``)."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{setting} must be a dotted path like 'myproj.redis:make_client'")
    module, colon, attr = path.strip().partition(":")
    if not colon:
        module, _, attr = module.rpartition(".")
    if not module or not attr:
        raise ConfigError(
            f"{setting}: {path!r} is not a dotted path like 'myproj.redis:make_client'"
        )
    try:
        found: Any = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
    except ImportError as exc:
        raise ConfigError(f"{setting}: cannot import {module!r} for {path!r}: {exc}") from None
    except AttributeError:
        raise ConfigError(f"{setting}: module {module!r} has no attribute {attr!r}") from None
    if not callable(found):
        raise ConfigError(f"{setting}: {path!r} is {type(found).__name__}, not a callable")
    return cast(Callable[[], Any], found)
