"""No password is ever shown: :func:`governor.connect.mask_url` on every URL form governor
accepts, and every place that prints one (the CLI, ``doctor``, errors, the dashboard, the demo)
against a real password-protected redis-server, a real Sentinel and a real Cluster."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
import redis
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from governor import Limiter
from governor.cli import cli
from governor.cli.common import State
from governor.connect import mask_url, target
from governor.embedded import find_redis_server, free_port, server_command
from governor.errors import ConfigError
from support.celery_helpers import limits_app, wait_for

PASSWORD = "Qx@p4ss-W0rdZ"
"""The default user's password: a raw ``@`` in it, as the issue's ``redis://:p@ss@h``."""
ENCODED = quote(PASSWORD, safe="")
ALICE = "al1ce-S3CRETz"
"""The password of ACL user ``alice``."""
SECRETS = (PASSWORD, ENCODED, ALICE)


def leaks(text: str, secrets: tuple[str, ...] = SECRETS) -> list[str]:
    """Every 4-character piece of a secret found in ``text`` (none of them is a word)."""
    return sorted({p for s in secrets for p in pieces(s, 4) if p in text})


def pieces(text: str, size: int) -> set[str]:
    return {text[i : i + size] for i in range(len(text) - size + 1)}


# -- mask_url alone ---------------------------------------------------------------------------

MASKED = [
    ("redis://user:pw@h:1/0", "redis://user:***@h:1/0"),
    ("redis://:p@ss@h", "redis://:***@h"),  # the raw @: no tail left
    ("redis://:pw@h:6379/0?password=pw2", "redis://:***@h:6379/0?password=***"),
    ("redis://h:6379/0?password=hunter2", "redis://h:6379/0?password=***"),
    ("redis://h/0?username=app&password=hunter2&db=1", "redis://h/0?username=app&password=***&db=1"),
    ("redis://h/0?password=a&b", "redis://h/0?password=***"),  # a raw & that starts no option
    ("redis://h/0?password=p@ss", "redis://h/0?password=***"),
    ("redis://token@h:6379", "redis://***@h:6379"),  # a lone user info may be a password
    ("rediss://u:pw@h:6380/0?ssl_cert_reqs=none", "rediss://u:***@h:6380/0?ssl_cert_reqs=none"),
    ("rediss://h:6380?ssl_password=keypw&ssl_keyfile=/k.pem", "rediss://h:6380?ssl_password=***&ssl_keyfile=/k.pem"),
    ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
    ("unix:///run/redis.sock?db=1&password=pw", "unix:///run/redis.sock?db=1&password=***"),
    (
        "sentinel://:a@h1:26379;sentinel://:b@h2:26379/1",
        "sentinel://:***@h1:26379;sentinel://:***@h2:26379/1",
    ),
    ("sentinel://h1;sentinel://u:p@ss@h2/1", "sentinel://h1;sentinel://u:***@h2/1"),
    ("redis://u:pw@h1:7000,h2:7000", "redis://u:***@h1:7000,h2:7000"),
    ("rediss://:p@w@h1:7000,h2:7000?ssl_cert_reqs=none", "rediss://:***@h1:7000,h2:7000?ssl_cert_reqs=none"),
    ("redis://:pa/ss@h:1/0", "redis://:***@h:1/0"),  # raw / ? # : hidden, however parsed
    ("redis://:pa?ss@h:1/0", "redis://:***@h:1/0"),
    ("redis://:pa#ss@h:1/0", "redis://:***@h:1/0"),
    ("redis://:my pass@h:1/0", "redis://:***@h:1/0"),
    ("redis://localhost:6379/0", "redis://localhost:6379/0"),
    ("client from myproj.redis:make_client", "client from myproj.redis:make_client"),
    # a message quoting URLs: each ends at a space or quote
    (
        "cannot reach Redis at redis://:pw@h:1/0: Error 111 connecting to h:1.",
        "cannot reach Redis at redis://:***@h:1/0: Error 111 connecting to h:1.",
    ),
    ("bad URL 'rediss://u:pw@h' (see amqp://guest:guest@mq//)", "bad URL 'rediss://u:***@h' (see amqp://guest:***@mq//)"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "shown"), MASKED)
def test_mask_url_hides_every_password(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert mask_url(shown) == shown  # masking twice changes nothing


SPECIAL = st.text(
    alphabet=st.sampled_from("abcXYZ019@:/?#;,&=% +!$'\"<>"), min_size=1, max_size=20
).filter(lambda s: "://" not in s)
FORMS: list[tuple[str, Callable[[str], str]]] = [
    ("raw user info", lambda pw: f"redis://:{pw}@h:6379/0"),
    ("user and raw password", lambda pw: f"redis://alice:{pw}@h:6379/0"),
    ("encoded user info", lambda pw: f"redis://:{quote(pw, safe='')}@h:6379/0"),
    ("query", lambda pw: f"redis://h:6379/0?username=alice&password={quote(pw, safe='')}&db=1"),
    ("rediss", lambda pw: f"rediss://:{pw}@h:6380/0?ssl_cert_reqs=none"),
    ("unix", lambda pw: f"unix://:{pw}@/run/redis.sock?db=1"),
    ("unix query", lambda pw: f"unix:///run/redis.sock?password={quote(pw, safe='')}"),
    ("sentinel", lambda pw: f"sentinel://:{pw}@h1:26379;sentinel://h2:26379/1"),
    ("cluster", lambda pw: f"redis://:{pw}@h1:7000,h2:7000"),
]


@pytest.mark.parametrize(("form", "make"), FORMS, ids=[f for f, _ in FORMS])
@given(secret=SPECIAL)
def test_no_piece_of_any_password_survives(
    form: str, make: Callable[[str], str], secret: str
) -> None:
    """Whatever a password holds (raw @ / ? # ; , & = % spaces quotes): no 3 characters of it
    that the URL around it does not hold are shown."""
    password = "PW" + secret + "ZZ"
    url = make(password)
    shown = mask_url(url)
    around = make("")
    hidden = pieces(password, 3) | pieces(quote(password, safe=""), 3)
    assert [p for p in hidden if p in shown and p not in around] == [], shown


@pytest.mark.parametrize(
    ("url", "kw"),
    [
        ("redis://:Zq/Xk-Qw0rd@127.0.0.1:1/0", {}),
        ("redis://:Zq?Xk-Qw0rd@127.0.0.1:1/0", {}),
        ("redis://:Zq/Xk-Qw0rd@h1:7000,h2:7000", {"cluster": True}),
        ("sentinel://:Zq;Xk-Qw0rd@h1:26379", {"options": {"master_name": "m"}}),
        ("sentinel://:Zq/Xk-Qw0rd@h1:26379", {"options": {"master_name": "m"}}),
        ("redis://:ZqXk-Qw0rd@h1:7000,h2:7000/3", {"cluster": True}),
        ("redis://:ZqXk-Qw0rd@h:1/0", {"options": {"master_name": "m"}}),
        ("ftp://:ZqXk-Qw0rd@h:1/0", {}),
    ],
)
def test_a_bad_url_is_told_without_its_password(url: str, kw: dict[str, Any]) -> None:
    """A password whose raw '/' moves the host into the path: the error names the part that
    is wrong without quoting it, and says how to write the password."""
    with pytest.raises(ConfigError) as caught:
        target(url, **kw)
    message = str(caught.value)
    hidden = ("Zq/Xk-Qw0rd", "Zq;Xk-Qw0rd", "Zq?Xk-Qw0rd", "ZqXk-Qw0rd")
    assert leaks(message, hidden) == [], message
    if "'***'" in message:
        assert "%2F" in message  # how to write it


def test_a_redis_url_of_another_type_is_not_printed() -> None:
    with pytest.raises(ConfigError) as caught:
        target(b"redis://:hunter2-Qw0rd@h/0")  # type: ignore[arg-type]
    assert "hunter2" not in str(caught.value) and "bytes" in str(caught.value)


# -- a real password-protected Redis ------------------------------------------------------------


class Secured:
    """A private redis-server: the default user's password :data:`PASSWORD`, ACL user
    ``alice`` with :data:`ALICE`, a TCP port and a unix socket."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="governor-secured-")
        self.port = free_port()
        self.socket = os.path.join(self.dir, "redis.sock")
        args = server_command(find_redis_server(), self.port, self.dir, "redis.log")
        args += ["--requirepass", PASSWORD, "--unixsocket", self.socket]
        args += ["--unixsocketperm", "700", "--user", "alice", "on", f">{ALICE}", "~*", "&*"]
        args += ["+@all"]
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis(port=self.port, password=PASSWORD, socket_timeout=2)
        wait_for(lambda: self._up(client), bool, timeout=10)
        client.close()

    def _up(self, client: redis.Redis) -> bool:
        assert self.process.poll() is None, f"redis-server exited: see {self.dir}/redis.log"
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    def forms(self) -> dict[str, str]:
        """Every way to write this server's URL with a password in it."""
        p, s = self.port, self.socket
        return {
            "raw @ in the password": f"redis://:{PASSWORD}@127.0.0.1:{p}/0",
            "user info": f"redis://:{ENCODED}@127.0.0.1:{p}/0",
            "default user": f"redis://default:{ENCODED}@127.0.0.1:{p}/0",
            "query password": f"redis://127.0.0.1:{p}/0?password={ENCODED}",
            "raw @ in the query": f"redis://127.0.0.1:{p}/0?password={PASSWORD}",
            "query username and password": f"redis://127.0.0.1:{p}/0?username=alice&password={ALICE}",
            "ACL user info": f"redis://alice:{ALICE}@127.0.0.1:{p}/0",
            "unix user info": f"unix://:{ENCODED}@{s}?db=0",
            "unix query": f"unix://{s}?db=0&password={ENCODED}",
        }  # fmt: skip

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        with contextlib.suppress(OSError):
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    server = Secured()
    yield server
    server.close()


FORM_NAMES = [
    "raw @ in the password",
    "user info",
    "default user",
    "query password",
    "raw @ in the query",
    "query username and password",
    "ACL user info",
    "unix user info",
    "unix query",
]


@pytest.fixture
def counted(secured: Secured, prefix: str) -> str:
    """A limit ``api`` with a blocked subject ``k1`` under ``prefix``."""
    client = redis.Redis(port=secured.port, password=PASSWORD)
    limiter = Limiter(client, "5/s", name="api", prefix=prefix)
    limiter.acquire("k1")
    limiter.block("k2", 600, "runaway")
    client.close()
    return prefix


def invoke(*args: str, obj: Any = None) -> Result:
    runner = CliRunner(env={"COLUMNS": "120", "GOVERNOR_REDIS_URL": ""})
    return runner.invoke(cli, list(args), obj=obj, catch_exceptions=False)


COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["doctor"],
    ["doctor", "--json"],
    ["inspect", "api", "k1", "--rules", "5/s"],
    ["inspect", "api", "k2", "--rules", "5/s", "--json"],
    ["top", "--once"],
    ["limits", "show"],
]


@pytest.mark.parametrize("form", FORM_NAMES)
def test_every_command_on_every_form_shows_no_password(
    secured: Secured, counted: str, form: str
) -> None:
    url = secured.forms()[form]
    for command in COMMANDS:
        result = invoke("--redis-url", url, "--prefix", counted, *command)
        assert result.exit_code in (0, 1), (command, result.output)  # doctor: 1 (no disk)
        assert leaks(result.output) == [], (command, result.output)
        if command == ["status"]:
            assert "k2" in result.output and "runaway" in result.output  # it did connect
            assert "***" in result.output  # and says where, masked


@pytest.mark.parametrize("form", ["query password", "raw @ in the password", "unix query"])
def test_errors_on_every_form_show_no_password(secured: Secured, form: str) -> None:
    url = secured.forms()[form]
    closed = url.replace(f":{secured.port}/", f":{free_port()}/").replace(
        secured.socket, secured.socket + ".gone"
    )
    result = invoke("--redis-url", closed, "status")
    assert result.exit_code == 3 and "cannot reach Redis at" in result.stderr, result.output
    assert leaks(result.output) == [] and "***" in result.stderr, result.output
    wrong = url.replace(ENCODED, "Wr0ng-Secret99").replace(PASSWORD, "Wr0ng-Secret99")
    result = invoke("--redis-url", wrong, "status")
    assert result.exit_code == 3 and "refused the credentials" in result.stderr, result.output
    assert leaks(result.output, (*SECRETS, "Wr0ng-Secret99")) == [], result.output


def test_tls_and_bad_urls_show_no_password(secured: Secured) -> None:
    for url in (
        # TLS to a plain port (a short timeout: the handshake waits for an answer that never comes)
        f"rediss://:{ENCODED}@127.0.0.1:{secured.port}/0?socket_timeout=0.5",
        f"rediss://127.0.0.1:{secured.port}/0?password={ENCODED}&ssl_cert_reqs=none"
        "&socket_timeout=0.5",
        f"redis://:{PASSWORD}/x@127.0.0.1:{secured.port}/0",  # a raw '/': a bad URL
        f"redis://127.0.0.1:{secured.port}/0?password={ENCODED}&socket_timeout=soon",
    ):
        result = invoke("--redis-url", url, "status")
        assert result.exit_code in (2, 3), result.output
        assert leaks(result.output) == [], result.output


def test_an_apps_redis_url_is_masked(secured: Secured, counted: str) -> None:
    app = limits_app(secured.forms()["query password"], counted, "sec", __name__)
    for command in (["status"], ["doctor", "--json"], ["limits", "show"]):
        result = invoke(*command, obj=app)
        assert result.exit_code in (0, 1), result.output
        assert leaks(result.output) == [], result.output
    assert "password=***" in invoke("status", obj=app).output


def test_the_real_command_shows_no_password(secured: Secured, counted: str) -> None:
    """The issue's case: ``governor status`` printed ``Found in redis://...?password=...``."""
    for form in ("query password", "raw @ in the password"):
        url = secured.forms()[form]
        env = {**os.environ, "GOVERNOR_REDIS_URL": url, "GOVERNOR_PREFIX": counted}
        for command in (["status"], ["doctor"]):
            done = subprocess.run(
                [sys.executable, "-m", "governor.cli", *command],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode in (0, 1), done.stderr
            assert leaks(done.stdout + done.stderr) == [], done.stdout + done.stderr
        gone = secured.forms()[form].replace(str(secured.port), str(free_port()))
        done = subprocess.run(
            [sys.executable, "-m", "governor.cli", "status"],
            env={**env, "GOVERNOR_REDIS_URL": gone}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 3 and "cannot reach Redis at redis://" in done.stderr
        assert leaks(done.stdout + done.stderr) == [], done.stderr


def test_the_demo_shows_no_password(secured: Secured) -> None:
    """``governor demo --redis-url``: a bad URL and an unreachable one fail before any worker
    starts, and say so without the password."""
    for url in (
        f"redis://:{PASSWORD}/x@127.0.0.1:{secured.port}/0",
        f"redis://127.0.0.1:{free_port()}/0?password={ENCODED}",
    ):
        result = invoke("demo", "--redis-url", url, "--tasks", "5")
        assert result.exit_code in (2, 3), result.output
        assert leaks(result.output) == [] and "***" in result.output, result.output


# -- the dashboard ------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORM_NAMES)
def test_the_dashboard_shows_no_password(secured: Secured, counted: str, form: str) -> None:
    pytest.importorskip("flask")
    from governor.dashboard.app import create_app
    from governor.dashboard.sampler import Sampler

    sampler = Sampler(State(redis_url=secured.forms()[form], prefix=counted))
    assert sampler.refresh().error is None
    client = create_app(sampler, allow_writes=True).test_client()
    for path in (
        "/",
        "/api/limits",
        "/limit?label=api",
        "/api/limit?label=api",
        "/inspect?name=api&subject=k1",
        "/api/inspect?name=api&subject=k1",
        "/inspect?name=nosuch&subject=k1",
    ):
        response = client.get(path)
        assert response.status_code in (200, 404), path
        assert leaks(response.get_data(as_text=True)) == [], path
    assert "***" in client.get("/").get_data(as_text=True)  # the header says where, masked
    sampler.state.close()


def test_the_dashboard_on_a_lost_redis_shows_no_password(secured: Secured, prefix: str) -> None:
    pytest.importorskip("flask")
    from governor.dashboard.app import create_app
    from governor.dashboard.sampler import Sampler

    gone = f"redis://:{ENCODED}@127.0.0.1:{free_port()}/0?password={ENCODED}"
    sampler = Sampler(State(redis_url=gone, prefix=prefix))
    frame = sampler.refresh()
    assert frame.error is not None and "cannot reach Redis" in frame.error
    client = create_app(sampler).test_client()
    for path in ("/", "/api/limits", "/api/inspect?name=api&subject=k1", "/api/limit?label=x"):
        assert leaks(client.get(path).get_data(as_text=True)) == [], path


def test_the_real_dashboard_shows_no_password(secured: Secured, counted: str) -> None:
    pytest.importorskip("flask")
    from support.dashboard_helpers import get

    env = {
        **os.environ,
        "GOVERNOR_REDIS_URL": secured.forms()["query password"],
        "GOVERNOR_PREFIX": counted,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "governor.cli", "dashboard", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        bodies = [line]
        for path in ("/", "/api/limits", "/api/inspect?name=api&subject=k2", "/limit?label=api"):
            status, body = get(url + path)
            assert status == 200, (path, body)
            bodies.append(body if isinstance(body, str) else json.dumps(body))
        assert "runaway" in bodies[3]  # it did read Redis
        assert "password=***" in bodies[1]
        assert leaks("\n".join(bodies)) == []
    finally:
        process.terminate()
        _, err = process.communicate(timeout=15)
    assert leaks(err) == [], err


# -- Sentinel and Cluster -----------------------------------------------------------------------


def test_sentinel_urls_show_no_password(prefix: str) -> None:
    """A real Sentinel whose master asks for a password (the sentinel knows it)."""
    from support.sentinels import LocalSentinel

    with LocalSentinel(sentinels=1, master_name="gov") as setup:
        sentinel = redis.Redis(port=setup.sentinel_ports[0])
        sentinel.execute_command("SENTINEL", "SET", "gov", "auth-pass", PASSWORD)
        master = redis.Redis(port=setup.master_port)
        master.config_set("requirepass", PASSWORD)
        good = setup.url(0, password=PASSWORD)
        second = f"sentinel://127.0.0.1:{free_port()}"
        for url in (good, f"{good.rsplit('/', 1)[0]};{second}/0"):
            for command in (["status"], ["doctor"], ["status", "--json"]):
                result = invoke("--redis-url", url, "--sentinel-master", "gov", *command)
                assert result.exit_code in (0, 1), result.output
                assert leaks(result.output) == [], result.output
        wrong = setup.url(0, password="Wr0ng-Secret99")
        result = invoke("--redis-url", wrong, "--sentinel-master", "gov", "status")
        assert result.exit_code == 3, result.output
        assert leaks(result.output, (*SECRETS, "Wr0ng-Secret99")) == [], result.output
        result = invoke("--redis-url", good, "--sentinel-master", "nosuch", "status")
        assert result.exit_code == 3 and leaks(result.output) == [], result.output
        sentinel.close()
        master.close()


def test_cluster_urls_show_no_password() -> None:
    """A real Redis Cluster whose nodes ask for a password."""
    from support.local_cluster import LocalCluster

    cluster = LocalCluster(find_redis_server())
    try:
        try:
            cluster.start()
        except (OSError, RuntimeError, redis.RedisError) as exc:
            pytest.skip(f"cannot start a Redis Cluster: {exc}")
        for node in cluster.nodes.values():
            node.config_set("requirepass", PASSWORD)
        nodes = ",".join(f"127.0.0.1:{port}" for port in cluster.ports)
        for url in (f"redis://:{PASSWORD}@{nodes}", f"redis://{nodes}?password={ENCODED}"):
            for command in (["status"], ["doctor"], ["doctor", "--json"]):
                result = invoke("--redis-url", url, "--cluster", *command)
                assert result.exit_code in (0, 1), result.output
                assert leaks(result.output) == [], result.output
        gone = f"redis://:{PASSWORD}@127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
        result = invoke("--redis-url", gone, "--cluster", "status")
        assert result.exit_code == 3 and leaks(result.output) == [], result.output
    finally:
        cluster.close()


def test_a_client_factory_error_is_masked() -> None:
    from governor.redis_target import ClientUnavailable, RedisTarget

    def broken() -> Any:
        raise RuntimeError(f"cannot use redis://:{PASSWORD}@10.0.0.1:6379/0 today")

    with pytest.raises(ClientUnavailable) as caught:
        RedisTarget("factory", "myproj:make", factory=broken).client()
    assert leaks(str(caught.value)) == [] and "redis://:***@10.0.0.1" in str(caught.value)
