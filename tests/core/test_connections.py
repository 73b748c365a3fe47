"""One way to Redis for every part of governor (governor.connect): the URL forms, the Celery
settings and their errors, and the real thing: decisions, a worker and the CLI through a
Sentinel setup on loopback (a master, a replica, three sentinels), and a client factory."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result

from governor import ConfigError, Limiter, StorageUnavailable
from governor.celery import Governor
from governor.celery.config.limit_config import limit_config
from governor.celery.config.settings import load_settings
from governor.celery.config.store import Store
from governor.cli import cli
from governor.connect import ClientUnavailable, close_client, cluster_supported, mask_url, target
from governor.direct import lane_for
from support.celery_helpers import Recorder, config_error, most_in_window, new_app, worker
from support.sentinels import LocalSentinel
from support.servers import ServerHandle

# the versions matrix (noxfile.py) runs this file: Sentinel (limiter, worker, CLI), URL forms
pytestmark = pytest.mark.compat

MASTER = "governor"
FACTORY_URL: list[str] = []
"""Where :func:`make_client` connects (set by the test that uses it)."""


def make_client() -> redis.Redis:
    """A client factory for ``governor_redis_client = "test_connections:make_client"``."""
    return redis.Redis.from_url(FACTORY_URL[0], socket_timeout=2)


def failing_factory() -> redis.Redis:
    raise OSError("no token for you")


def not_a_client() -> object:
    return object()


@pytest.fixture(scope="module")
def sentinel() -> Iterator[LocalSentinel]:
    setup = LocalSentinel(sentinels=3, replicas=1, master_name=MASTER)
    try:
        setup.start()
        yield setup
    finally:
        setup.close()


@pytest.fixture
def master(sentinel: LocalSentinel) -> Iterator[redis.Redis]:
    """A plain client of the master itself (db 0), to see what went where."""
    client = redis.Redis(port=sentinel.master_port)
    yield client
    client.close()


def invoke(*args: str, obj: Any = None, **env: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "120", "GOVERNOR_REDIS_URL": "", **env})
    return runner.invoke(cli, list(args), obj=obj, catch_exceptions=False)


# -- the URL forms (no server) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options", "kind", "nodes", "params"),
    [
        ("redis://localhost:6379/1", {}, "redis", (), {}),
        ("unix:///tmp/redis.sock?db=2", {}, "redis", (), {}),
        (
            "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26380/1",
            {"options": {"master_name": "m"}},
            "sentinel",
            (("10.0.0.1", 26379), ("10.0.0.2", 26380)),
            {"db": 1},
        ),
        (  # kombu's spelling: the password and db on the first; the default port
            "sentinel://:s3cret@h1/2;sentinel://h2",
            {"options": {"master_name": "m", "sentinel_kwargs": {"password": "x"}}},
            "sentinel",
            (("h1", 26379), ("h2", 26379)),
            {"db": 2, "password": "s3cret"},
        ),
        (
            "redis://:pw@10.0.0.1:7000,10.0.0.2:7001",
            {"cluster": True},
            "cluster",
            (("10.0.0.1", 7000), ("10.0.0.2", 7001)),
            {"password": "pw"},
        ),
        (
            "rediss://u:p@h1,h2/0?ssl_cert_reqs=none",
            {"cluster": True},
            "cluster",
            (("h1", 6379), ("h2", 6379)),
            {"username": "u", "password": "p", "ssl": True, "ssl_cert_reqs": "none"},
        ),
    ],
)
def test_url_forms(
    url: str,
    options: dict[str, Any],
    kind: str,
    nodes: tuple[tuple[str, int], ...],
    params: dict[str, Any],
) -> None:
    if kind == "cluster" and not cluster_supported():  # the versions matrix's older redis-py
        with pytest.raises(ConfigError, match=r"a Redis Cluster needs redis-py 6\.1"):
            target(url, **options)
        return
    found = target(url, **options)
    assert (found.kind, found.nodes, dict(found.params)) == (kind, nodes, params)
    assert "s3cret" not in found.describe() and ":pw@" not in found.describe()


@pytest.mark.parametrize(
    ("url", "options", "mentions"),
    [
        ("http://x", {}, "governor_redis_url: bad Redis URL 'http://x'"),
        ("redis://h/abc", {}, "the database must be a number, got 'abc'"),
        ("redis://h1:7000,h2:7000", {}, "for a Redis Cluster set governor_redis_cluster"),
        ("redis://h1:7000/3", {"cluster": True}, "a Redis Cluster has only database 0"),
        ("sentinel://h1;sentinel://h2", {}, "governor_redis_transport_options = {'master_name'"),
        (
            "sentinel://h1/1;sentinel://h2/2",
            {"options": {"master_name": "m"}},
            "the sentinel URLs give different dbs",
        ),
        ("sentinel://h1;redis://h2", {"options": {"master_name": "m"}}, "every sentinel is"),
        ("sentinel://h1:x", {"options": {"master_name": "m"}}, "bad address 'h1:x'"),
        ("sentinel://h1", {"options": {"master_name": "m"}, "cluster": True}, "governor_redis_c"),
        ("redis://h1", {"options": {"master_name": "m"}}, "only applies to sentinel:// URLs"),
        ("sentinel://h1", {"options": {"master": "m"}}, "unknown option(s) 'master'"),
        ("sentinel://h1", {"options": {"master_name": "m", "min_other_sentinels": -1}}, ">= 0"),
        ("redis://h1", {"cluster": "yes"}, "governor_redis_cluster must be True or False"),
        (None, {"client": "nowhere.at_all:make"}, "governor_redis_client: cannot import"),
        (None, {"client": "test_connections:nothing"}, "has no attribute 'nothing'"),
        (None, {"client": "test_connections:MASTER"}, "not a callable"),
        ("redis://h", {"client": "test_connections:make_client"}, "are both set"),
    ],
)
def test_bad_forms_name_the_setting(
    url: str | None, options: dict[str, Any], mentions: str
) -> None:
    with pytest.raises(ConfigError) as info:
        target(url, **options)
    assert mentions in str(info.value)


def test_passwords_are_masked() -> None:
    assert mask_url("sentinel://:a@h1;sentinel://:b@h2/1") == (
        "sentinel://:***@h1;sentinel://:***@h2/1"
    )
    assert mask_url("redis://u:pw@h1:7000,h2:7000") == "redis://u:***@h1:7000,h2:7000"


# -- Celery settings --------------------------------------------------------------------------


def test_settings_forms() -> None:
    sentinel_url = "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379/1"
    s = load_settings(
        {
            "governor_redis_url": sentinel_url,
            "governor_redis_transport_options": {"master_name": "gov"},
        }
    )
    assert s.redis is not None and s.redis.kind == "sentinel" and s.redis.master_name == "gov"
    assert s.redis_url == sentinel_url

    # the broker's Sentinel, with the master from broker_transport_options, as Celery reads it
    s = load_settings(
        {
            "broker_url": sentinel_url,
            "broker_transport_options": {"master_name": "broker-master", "visibility_timeout": 60},
        }
    )
    assert s.redis is not None and s.redis.master_name == "broker-master"
    assert s.park_after == 30.0  # half the visibility timeout, as before

    cluster = {"governor_redis_url": "redis://h1:7000,h2:7000", "governor_redis_cluster": True}
    if cluster_supported():
        s = load_settings(cluster)
        assert s.redis is not None and s.redis.kind == "cluster" and len(s.redis.nodes) == 2
    else:  # the versions matrix's older redis-py
        with pytest.raises(ConfigError, match="governor_redis_cluster: a Redis Cluster needs"):
            load_settings(cluster)

    s = load_settings({"governor_redis_client": "test_connections:make_client"})
    assert s.redis is not None and s.redis.kind == "factory" and s.redis_url is None

    s = load_settings({"broker_url": "redis://h:6379/3;redis://h2:6379/3"})  # failover list
    assert s.redis_url == "redis://h:6379/3"
    assert load_settings({"broker_url": "amqp://guest@localhost//"}).redis is None


@pytest.mark.parametrize(
    ("conf", "mentions"),
    [
        (
            {"broker_url": "sentinel://h1;sentinel://h2", "governor_redis_url": None},
            "broker_url (governor's Redis, as governor_redis_url is not set) is a Sentinel URL: "
            "name its master with broker_transport_options",
        ),
        ({"governor_redis_url": "sentinel://h1"}, "governor_redis_transport_options"),
        ({"governor_redis_transport_options": "governor"}, "must be a mapping"),
        ({"governor_redis_url": "redis://h1,h2"}, "governor_redis_cluster"),
        ({"governor_redis_url": None, "governor_redis_cluster": True}, "list the cluster's nodes"),
        ({"governor_redis_url": None, "governor_redis_client": "x.y:z"}, "governor_redis_client"),
    ],
)
def test_bad_settings_fail_at_start_up(
    redis_server: ServerHandle, conf: dict[str, Any], mentions: str
) -> None:
    assert mentions in config_error(redis_server.url(), **conf)


# -- through Sentinel -------------------------------------------------------------------------


def test_a_limiter_decides_through_sentinel(
    sentinel: LocalSentinel, master: redis.Redis, prefix: str
) -> None:
    client = target(sentinel.url(0), options={"master_name": MASTER}).client(socket_timeout=2)
    try:
        assert client.connection_pool.get_master_address() == (  # type: ignore[attr-defined]
            "127.0.0.1",
            sentinel.master_port,
        )
        assert lane_for(client) is None  # a Sentinel master takes the client's path
        lim = Limiter(client, "2/s, 3/m", name="api", prefix=prefix)
        now = 1_700_000_000.0
        got = [lim.acquire("c1", now=now + i * 0.1).allowed for i in range(3)]
        assert got == [True, True, False]
        later = [lim.acquire("c1", now=now + 1.5).allowed for _ in range(2)]
        assert later == [True, False]  # the second's window has room again; 3/m has one
        assert master.exists(*lim.keys("c1")[:1]) == 1  # the state is on the master
    finally:
        close_client(client)


def test_store_and_worker_through_sentinel(
    sentinel: LocalSentinel, redis_server: ServerHandle
) -> None:
    q = f"q-{uuid.uuid4().hex[:8]}"
    app = new_app(
        redis_server.url(),  # the broker stays on the suite's Redis
        q,
        governor_redis_url=sentinel.url(2),
        governor_redis_transport_options={"master_name": MASTER},
        governor_queues={q: "4/s"},
    )
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(i: int) -> None:
        rec.add(i=i)

    app.finalize()
    store = Store(load_settings(app.conf))
    assert type(store.client.connection_pool).__name__ == "SentinelConnectionPool"
    with worker(app, [q]):
        for i in range(8):
            job.delay(i)
        seen = rec.wait(8, timeout=20)
    assert sorted(r["i"] for r in seen) == list(range(8))
    assert most_in_window([r["t"] for r in seen], 1.0) <= 4 + 1
    on_master = redis.Redis(port=sentinel.master_port, db=2)
    try:
        assert any(on_master.scan_iter(match=f"{app.conf.governor_prefix}:*", count=1000))
    finally:
        on_master.close()


def test_cli_with_sentinel_master(sentinel: LocalSentinel, prefix: str) -> None:
    client = target(sentinel.url(0), options={"master_name": MASTER}).client()
    try:  # a minute's rule: c1's state outlives the test (a 5/s log is gone after a second)
        Limiter(client, "5/m", name="partner-api", prefix=prefix).acquire("c1")
    finally:
        close_client(client)
    url = sentinel.url(0)
    flags = ("--redis-url", url, "--sentinel-master", MASTER, "--prefix", prefix)
    status = invoke(*flags, "status", "--json")
    assert status.exit_code == 0, status.output
    assert [lim["name"] for lim in json.loads(status.stdout)["limits"]] == ["partner-api"]
    inspect = invoke(*flags, "inspect", "partner-api", "c1", "--rules", "5/m", "--json")
    assert inspect.exit_code == 0 and json.loads(inspect.stdout)["rules"][0]["used"] == 1

    pytest.importorskip("flask", reason="the dashboard extra is not installed")
    from governor.cli.common import State
    from governor.dashboard.server import Dashboard
    from support.dashboard_helpers import get

    state = State(redis_url=url, prefix=prefix, sentinel_master=MASTER)
    with Dashboard(state, port=0, interval=0.3) as board:  # the dashboard takes the same options
        data = get(f"{board.url}/api/limits")[1]
        assert data["error"] is None and [x["name"] for x in data["limits"]] == ["partner-api"]
        assert "sentinel://" in get(board.url)[1]
        listed = get(f"{board.url}/api/limit?label=partner-api")[1]
        assert [s["subject"] for s in listed["subjects"]] == ["c1"]

    from_env = invoke(
        "status", "--json", GOVERNOR_REDIS_URL=url, GOVERNOR_SENTINEL_MASTER=MASTER,
        GOVERNOR_PREFIX=prefix,
    )  # fmt: skip
    assert from_env.exit_code == 0 and json.loads(from_env.stdout)["limits"]

    missing = invoke("--redis-url", url, "status")
    assert missing.exit_code == 2 and "--sentinel-master NAME" in missing.stderr
    unknown = invoke("--redis-url", url, "--sentinel-master", "nobody", "status")
    assert unknown.exit_code == 3 and "nobody" in unknown.stderr
    assert "Traceback" not in unknown.output

    # with an app, its settings choose the Redis (and the flags are refused)
    app = Celery(f"sentinel-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.governor_redis_url = url
    app.conf.governor_redis_transport_options = {"master_name": MASTER}
    app.conf.governor_prefix = prefix
    assert json.loads(invoke("status", "--json", obj=app).stdout)["limits"]
    refused = invoke("--cluster", "status", obj=app)
    assert refused.exit_code == 2 and "--cluster applies to --redis-url" in refused.stderr


def test_doctor_through_sentinel(sentinel: LocalSentinel) -> None:
    result = invoke("--redis-url", sentinel.url(0), "--sentinel-master", MASTER, "doctor", "--json")
    report = json.loads(result.stdout)
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    # nothing on disk, but a replica: a warning, not a failure
    assert statuses == {"redis": "ok", "persistence": "warn", "eviction": "ok", "clock": "ok"}
    assert result.exit_code == 0 and report["ok"]
    assert "through Sentinel" in report["checks"][0]["detail"]


# -- a client factory -------------------------------------------------------------------------


def test_a_client_factory_makes_the_store_client(redis_server: ServerHandle, prefix: str) -> None:
    FACTORY_URL[:] = [redis_server.url(2)]
    settings = load_settings(
        {"governor_redis_client": "test_connections:make_client", "governor_prefix": prefix}
    )
    store = Store(settings)
    assert store.client.connection_pool.connection_kwargs["db"] == 2
    assert lane_for(store.client) is not None  # a plain Redis: decisions take the lean lane
    lim = store.limiter("queue", limit_config("2/s", "sliding_log", "test", 30.0))
    assert [lim.acquire("emails").allowed for _ in range(3)] == [True, True, False]

    failing = load_settings({"governor_redis_client": "test_connections.failing_factory"})
    with pytest.raises(ClientUnavailable) as info:
        Store(failing).client  # noqa: B018
    assert isinstance(info.value, StorageUnavailable) and isinstance(info.value, redis.RedisError)
    assert "no token for you" in str(info.value)
    wrong = load_settings({"governor_redis_client": "test_connections:not_a_client"})
    with pytest.raises(ConfigError, match="not a redis-py client"):
        Store(wrong).client  # noqa: B018


# -- the worker's start-up warning ------------------------------------------------------------


def test_the_worker_warns_when_redis_keeps_nothing(
    redis_server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    app = new_app(redis_server.url(), "q")
    governor = Governor(app)
    with caplog.at_level(logging.WARNING, logger="governor.celery"):
        governor._warn_if_volatile()
    if redis_server.private:  # the suite's own server keeps nothing on disk
        assert "keeps nothing on disk" in caplog.text and "governor doctor" in caplog.text

    caplog.clear()
    away = Governor(
        new_app("redis://127.0.0.1:1/0", "q", governor_redis_url="redis://127.0.0.1:1/0")
    )
    started = time.monotonic()
    away._warn_if_volatile()  # Redis away: no warning, no error
    assert "keeps nothing" not in caplog.text and time.monotonic() - started < 5
