"""Who may use the dashboard: the ``Host`` check (DNS rebinding), the ``Origin`` check on writes,
the token (login form, ``?token=`` link, ``Authorization: Bearer``), the longest block; with
Flask's test client, and against a real ``governor dashboard`` process on the suite's Redis."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from governor import Limiter
from governor.cli import cli
from governor.cli.common import State
from support.servers import ServerHandle

pytest.importorskip("flask")

from flask.testing import FlaskClient

from governor.dashboard.access import SESSION_SECONDS, Access, host_name, is_loopback
from governor.dashboard.app import create_app
from governor.dashboard.sampler import Sampler
from support.dashboard_helpers import limits_app, state_of

TOKEN = "t0ken-for-the-dashboard-Zq9"
BLOCK = {"name": "partner-api", "subject": "c1", "duration": "1d", "reason": "test"}
REBOUND = {"Host": "attacker.example:8055", "Origin": "http://attacker.example:8055"}


def client_for(
    state: State, *, access: Access | None = None, writes: bool = True, **kw: Any
) -> FlaskClient:
    sampler = Sampler(state)
    sampler.refresh()
    return create_app(sampler, allow_writes=writes, access=access, **kw).test_client()


@pytest.fixture
def app_state(redis_server: ServerHandle, prefix: str) -> Iterator[State]:
    state = state_of(limits_app(redis_server.url(0), prefix))
    yield state
    state.close()


@pytest.fixture
def partner(r: redis.Redis, prefix: str) -> Limiter:
    return Limiter(r, "5/s, 200/h", name="partner-api", prefix=prefix)


# -- Host: DNS rebinding ------------------------------------------------------------------------


def test_a_rebound_name_is_refused(app_state: State, partner: Limiter) -> None:
    """The issue's repro: a page at attacker.example that rebinds its name to 127.0.0.1 is
    same-origin to the browser; its requests carry ``Host: attacker.example``."""
    client = client_for(app_state)
    for path in ("/", "/api/limits", "/api/inspect?name=partner-api&subject=c1", "/nosuch"):
        response = client.get(path, headers=REBOUND)
        assert response.status_code == 403, path
        text = response.get_data(as_text=True)
        assert "attacker.example" in text and "--allowed-host" in text
        assert "partner-api" not in text and app_state.prefix not in text  # nothing shown
    response = client.post("/api/block", json=BLOCK, headers=REBOUND)
    assert response.status_code == 403
    assert partner.usage("c1").blocked is None
    assert client.get("/api/limits").status_code == 200  # Host: localhost


@pytest.mark.parametrize(
    ("bind", "allowed", "host", "ok"),
    [
        ("127.0.0.1", (), "localhost:8055", True),
        ("127.0.0.1", (), "127.0.0.1:8055", True),
        ("127.0.0.1", (), "[::1]:8055", True),
        ("127.0.0.1", (), "app.localhost", True),  # *.localhost never goes to DNS
        ("127.0.0.1", (), "LOCALHOST.", True),
        ("127.0.0.1", (), "attacker.example", False),
        ("127.0.0.1", (), "127.0.0.1.nip.io:8055", False),  # a name that resolves to loopback
        ("127.0.0.1", (), "10.0.0.5", False),  # not an address it listens on
        ("10.0.0.5", (), "10.0.0.5:8055", True),
        ("10.0.0.5", (), "10.0.0.6:8055", False),
        ("0.0.0.0", (), "10.0.0.5:8055", True),  # every interface: any address (not rebindable)
        ("0.0.0.0", (), "[fe80::1]:8055", True),
        ("0.0.0.0", (), "myhost.corp", False),  # a name: only if allowed
        ("0.0.0.0", ("dash.example.com",), "dash.example.com", True),
        ("0.0.0.0", ("dash.example.com",), "Dash.Example.com:443", True),
        ("0.0.0.0", ("dash.example.com",), "x.dash.example.com", False),
        ("0.0.0.0", (".example.com",), "x.dash.example.com", True),
        ("0.0.0.0", (".example.com",), "example.com", True),
        ("0.0.0.0", (".example.com",), "badexample.com", False),
        ("myhost.corp", (), "myhost.corp:8055", True),
        ("127.0.0.1", (), "127.0.0.1:8055, attacker.example", False),  # not a Host
        ("127.0.0.1", (), "evil@127.0.0.1", False),
        ("0.0.0.0", (), "10.0.0.5/x", False),
    ],
)
def test_the_host_names_answered(bind: str, allowed: tuple[str, ...], host: str, ok: bool) -> None:
    assert Access(bind, allowed).host_allowed(host) is ok


def test_loopback_and_host_names() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.0.0.2") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    assert not is_loopback("no-such-host.invalid")
    assert host_name("[::1]:8055") == "::1"
    assert host_name("Dash.Example.COM.:443") == "dash.example.com"


# -- Origin: cross-site writes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "http://localhost:3000"},  # another port is another origin
        {"Origin": "null"},  # a sandboxed frame, a data: page
        {"Origin": "http://localhost", "Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
)
def test_a_write_from_another_origin_is_refused(
    app_state: State, partner: Limiter, headers: dict[str, str]
) -> None:
    client = client_for(app_state)
    for action in ("block", "unblock", "reset"):
        response = client.post(f"/api/{action}", json=BLOCK, headers=headers)
        assert response.status_code == 403, (action, response.get_json())
        assert "another site" in response.get_json()["error"]
    assert partner.usage("c1").blocked is None
    # even a form post (text/plain, which skips the browser's preflight) stops at the Origin
    response = client.post("/api/block", data="x", content_type="text/plain", headers=headers)
    assert response.status_code == 403


@pytest.mark.parametrize(
    "headers",
    [
        {},  # curl, a script: no Origin
        {"Origin": "http://localhost"},
        {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},
        {"Host": "127.0.0.1:8055", "Origin": "http://127.0.0.1:8055"},
        {"Host": "[::1]:8055", "Origin": "http://[::1]:8055"},
    ],
)
def test_a_write_from_the_dashboards_own_page_goes_through(
    app_state: State, partner: Limiter, headers: dict[str, str]
) -> None:
    client = client_for(app_state)
    response = client.post("/api/block", json=BLOCK, headers=headers)
    assert response.status_code == 200 and response.get_json()["blocked"] is True
    assert partner.usage("c1").blocked == "test"
    assert client.post("/api/unblock", json=BLOCK, headers=headers).status_code == 200


def test_behind_a_proxy_the_allowed_name_is_the_origin(app_state: State, partner: Limiter) -> None:
    """TLS ends at the proxy: the page is https://dash.example.com, the request reaches the
    dashboard as http, with the Host passed on (or rewritten to the upstream's address)."""
    client = client_for(app_state, access=Access("127.0.0.1", ("dash.example.com",)))
    page = "https://dash.example.com"
    for host in ("dash.example.com", "127.0.0.1:8055"):
        response = client.post("/api/block", json=BLOCK, headers={"Host": host, "Origin": page})
        assert response.status_code == 200, (host, response.get_json())
    evil = {"Host": "dash.example.com", "Origin": "https://evil.example"}
    assert client.post("/api/block", json=BLOCK, headers=evil).status_code == 403


# -- the token ----------------------------------------------------------------------------------


def test_without_the_token_nothing_is_shown(app_state: State, partner: Limiter) -> None:
    client = client_for(app_state, access=Access(token=TOKEN))
    for path in ("/api/limits", "/api/limit?label=partner-api", "/api/inspect?name=a&subject=b"):
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert "partner-api" not in response.get_data(as_text=True)
    for path in ("/", "/limit?label=partner-api", "/inspect?name=partner-api&subject=c1"):
        response = client.get(path)
        assert response.status_code == 303, path
        assert response.headers["Location"].startswith("/login?next=%2F")
    assert client.post("/api/block", json=BLOCK).status_code == 401
    assert partner.usage("c1").blocked is None
    for bad in ("Bearer wrong-token-0123456789", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "):
        assert client.get("/api/limits", headers={"Authorization": bad}).status_code == 401
    assert client.get("/static/dashboard.css").status_code == 200  # the login page's style


def test_a_script_sends_the_token_as_a_bearer(app_state: State, partner: Limiter) -> None:
    client = client_for(app_state, access=Access(token=TOKEN))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/limits", headers=auth).status_code == 200
    response = client.post("/api/block", json=BLOCK, headers=auth)
    assert response.status_code == 200 and partner.usage("c1").blocked == "test"
    assert "Set-Cookie" not in response.headers  # a script's call makes no session
    # the token does not open the door to a rebound name
    assert client.get("/api/limits", headers={**auth, **REBOUND}).status_code == 403


def test_a_browser_logs_in_once(app_state: State, partner: Limiter) -> None:
    access = Access(token=TOKEN)
    client = client_for(app_state, access=access)
    page = client.get("/login?next=/inspect%3Fname%3Dpartner-api%26subject%3Dc1")
    assert page.status_code == 200 and 'type="password"' in page.get_data(as_text=True)
    assert TOKEN not in page.get_data(as_text=True)

    wrong = client.post("/login", data={"token": "not-the-token-123456", "next": "/"})
    assert wrong.status_code == 401 and "not this dashboard" in wrong.get_data(as_text=True)
    assert client.get("/api/limits").status_code == 401

    done = client.post(
        "/login", data={"token": TOKEN, "next": "/inspect?name=partner-api&subject=c1"}
    )
    assert done.status_code == 303
    assert done.headers["Location"] == "/inspect?name=partner-api&subject=c1"
    cookie = done.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert f"Max-Age={SESSION_SECONDS}" in cookie and TOKEN not in cookie
    assert client.get("/api/limits").status_code == 200
    assert "log out" in client.get("/").get_data(as_text=True)
    response = client.post("/api/block", json=BLOCK, headers={"Origin": "http://localhost"})
    assert response.status_code == 200 and partner.usage("c1").blocked == "test"
    # the session cookie does not carry a cross-site write
    evil = client.post("/api/unblock", json=BLOCK, headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and partner.usage("c1").blocked == "test"

    out = client.post("/logout", headers={"Origin": "http://localhost"})
    assert out.status_code == 303 and out.headers["Location"] == "/login"
    assert client.get("/api/limits").status_code == 401


def test_login_goes_back_only_to_this_site(app_state: State) -> None:
    client = client_for(app_state, access=Access(token=TOKEN))
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:x"):
        done = client.post("/login", data={"token": TOKEN, "next": target})
        assert done.status_code == 303 and done.headers["Location"] == "/", target


def test_a_link_with_the_token_logs_in_and_drops_it(app_state: State) -> None:
    client = client_for(app_state, access=Access(token=TOKEN))
    response = client.get(f"/limit?label=partner-api&token={TOKEN}")
    assert response.status_code == 200
    assert "HttpOnly" in response.headers["Set-Cookie"]
    page = response.get_data(as_text=True)
    assert TOKEN not in page
    assert 'http-equiv="refresh" content="0;url=/limit?label=partner-api"' in page
    assert client.get("/limit?label=partner-api").status_code == 200
    # a script may pass it the same way, answered without a session
    fresh = client_for(app_state, access=Access(token=TOKEN))
    response = fresh.get(f"/api/limits?token={TOKEN}")
    assert response.status_code == 200 and "Set-Cookie" not in response.headers
    wrong = fresh.get("/?token=wrong-token-0123456789")
    assert wrong.status_code == 401 and "wrong-token" not in wrong.get_data(as_text=True)


def test_a_forged_or_old_session_is_refused(app_state: State) -> None:
    access = Access(token=TOKEN)
    client = client_for(app_state, access=access)
    now = time.time()
    good = access.session(now)
    assert access.session_valid(good, now) and not access.session_valid(good, now + SESSION_SECONDS)
    until, _, mac = good.partition(".")
    for value in (
        f"{int(until) + 3600}.{mac}",  # a later end with the old signature
        f"{until}.{'0' * len(mac)}",
        access.session(now - SESSION_SECONDS - 1),  # ended
        Access(token="another-token-0123456789").session(now),  # another dashboard's
        "garbage",
        "",
        f"²{until}.{mac}",
        f"{until}.{mac}\u00e9",
    ):
        client.set_cookie(access.cookie_name, value)
        assert client.get("/api/limits").status_code == 401, value
    client.set_cookie(access.cookie_name, good)
    assert client.get("/api/limits").status_code == 200


@pytest.mark.parametrize("token", ["short", "has a space in it 0123", "ünïcode-token-0123456", ""])
def test_a_weak_token_is_refused(token: str) -> None:
    with pytest.raises(ValueError, match="at least 16 printable ASCII"):
        Access(token=token)


# -- bounds and headers -------------------------------------------------------------------------


def test_blocks_are_bounded(app_state: State, partner: Limiter) -> None:
    client = client_for(app_state)
    response = client.post("/api/block", json={**BLOCK, "duration": "8d"})
    assert response.status_code == 400 and "at most 7d" in response.get_json()["error"]
    assert partner.usage("c1").blocked is None
    assert client.post("/api/block", json={**BLOCK, "duration": "7d"}).status_code == 200
    short = client_for(app_state, max_block=3600.0)
    response = short.post("/api/block", json={**BLOCK, "duration": "2h"})
    assert response.status_code == 400 and "at most 1h" in response.get_json()["error"]
    long_name = {**BLOCK, "subject": "x" * 1001}
    assert client.post("/api/block", json=long_name).status_code == 400


def test_pages_cannot_be_framed(app_state: State) -> None:
    response = client_for(app_state).get("/")
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "same-origin"


# -- the real command ---------------------------------------------------------------------------


def request(url: str, data: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    body = None if data is None else json.dumps(data).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=body, headers=sent, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode()
    return status, json.loads(text) if text.startswith("{") else text


class Served:
    """A ``governor dashboard`` process: its URL, and what it printed when stopped."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "governor.cli", "dashboard", "--port", "0", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.line = self.process.stdout.readline()
        found = re.search(r" on (http://\S+) ", self.line)
        assert found, self.line + self.process.stderr.read()  # type: ignore[union-attr]
        self.url = found.group(1)
        self.port = self.url.rsplit(":", 1)[1]

    def stop(self) -> str:
        self.process.terminate()
        _, err = self.process.communicate(timeout=15)
        return err


@pytest.fixture
def env(redis_server: ServerHandle, prefix: str) -> dict[str, str]:
    return {
        **os.environ,
        "GOVERNOR_REDIS_URL": redis_server.url(0),
        "GOVERNOR_PREFIX": prefix,
        "GOVERNOR_DASHBOARD_TOKEN": "",
    }


def test_the_command_refuses_rebinding_and_cross_origin_writes(
    env: dict[str, str], partner: Limiter
) -> None:
    partner.acquire("c1")
    served = Served(env, "--allow-writes")
    try:
        name = f"attacker.example:{served.port}"
        rebound = {"Host": name, "Origin": f"http://{name}"}
        assert request(f"{served.url}/", headers=rebound)[0] == 403
        assert request(f"{served.url}/api/limits", headers=rebound)[0] == 403
        assert request(f"{served.url}/api/block", BLOCK, rebound)[0] == 403
        cross = {"Origin": "http://evil.example"}
        assert request(f"{served.url}/api/block", BLOCK, cross)[0] == 403
        assert partner.usage("c1").blocked is None
        own = {"Origin": served.url}
        status, data = request(f"{served.url}/api/block", BLOCK, own)
        assert status == 200 and data["blocked"] is True
        assert partner.usage("c1").blocked == "test"
    finally:
        err = served.stop()
    assert "refused Host 'attacker.example" in err


def test_the_command_with_a_token(env: dict[str, str], partner: Limiter, tmp_path: Path) -> None:
    partner.acquire("c1")
    served = Served({**env, "GOVERNOR_DASHBOARD_TOKEN": TOKEN}, "--allow-writes")
    try:
        assert "token required" in served.line and TOKEN not in served.line
        assert request(f"{served.url}/api/limits")[0] == 401
        assert request(f"{served.url}/api/block", BLOCK)[0] == 401
        status, page = request(f"{served.url}/login")
        assert status == 200 and "needs its token" in page
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert request(f"{served.url}/api/limits", headers=auth)[0] == 200
        assert request(f"{served.url}/api/block", BLOCK, auth)[0] == 200
        assert partner.usage("c1").blocked == "test"
        rebound = {**auth, "Host": "attacker.example", "Origin": "http://attacker.example"}
        assert request(f"{served.url}/api/unblock", BLOCK, rebound)[0] == 403
        cross = {**auth, "Origin": "http://evil.example"}
        assert request(f"{served.url}/api/unblock", BLOCK, cross)[0] == 403
        assert partner.usage("c1").blocked == "test"
        # a wrong token in a link is logged (a 401) without the token
        assert request(f"{served.url}/api/limit?label=x&token=wrong-{TOKEN}")[0] == 401
        assert request(f"{served.url}/api/limit?label=nosuch&token={TOKEN}")[0] == 404
    finally:
        err = served.stop()
    assert TOKEN not in err and "token=***" in err, err
    # the same from a file (which wins over the environment)
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    served = Served({**env, "GOVERNOR_DASHBOARD_TOKEN": "x" * 20}, "--token-file", str(path))
    try:
        assert request(f"{served.url}/api/limits", headers=auth)[0] == 200
    finally:
        served.stop()


def test_writes_on_another_address_need_a_token(env: dict[str, str], tmp_path: Path) -> None:
    command = [sys.executable, "-m", "governor.cli", "dashboard", "--port", "0"]
    done = subprocess.run(
        [*command, "--host", "0.0.0.0", "--allow-writes"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "give a token" in done.stderr and "Traceback" not in done.stderr
    short = tmp_path / "short"
    short.write_text("abc")
    for args in (["--token-file", str(short)], ["--token-file", str(tmp_path / "none")]):
        done = subprocess.run(
            [*command, *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    bad = subprocess.run(
        [*command, "--allowed-host", "http://dash.example.com/"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--allowed-host takes a host name" in bad.stderr
    # read-only on every interface: served, with a warning
    served = Served(env, "--host", "0.0.0.0")
    try:
        assert request(f"http://127.0.0.1:{served.port}/api/limits")[0] == 200
    finally:
        err = served.stop()
    assert "Warning: listening on 0.0.0.0 without a token" in err
    with_token = {**env, "GOVERNOR_DASHBOARD_TOKEN": TOKEN}
    served = Served(with_token, "--host", "0.0.0.0", "--allow-writes")
    try:
        assert request(f"http://127.0.0.1:{served.port}/api/limits")[0] == 401
    finally:
        err = served.stop()
    assert "Warning" not in err


def test_the_help_says_what_host_exposes() -> None:
    out = CliRunner().invoke(cli, ["dashboard", "--help"]).output
    assert "--allowed-host" in out and "--token-file" in out and "docs/security.md" in out
    assert "GOVERNOR_DASHBOARD_TOKEN" in out and "--max-block" in out
