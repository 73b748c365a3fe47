"""A token-protected dashboard in a real headless Chromium (as test_dashboard_browser.py):
logging in with the form, a link carrying the token followed from another site, logging out; and,
with the browser resolving ``attacker.example`` and ``links.example`` to 127.0.0.1, a rebound name
and another site's page trying to write (refused, session cookie or not).
"""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from test_dashboard_browser import CHROMEDRIVER, CHROMIUM, _alert, console_errors, text, until

from governor import Limiter
from governor.dashboard.server import Dashboard
from support.celery_helpers import wait_for
from support.dashboard_helpers import limits_app, state_of
from support.servers import ServerHandle

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="no chromium/chromedriver: apt-get install -y chromium chromium-driver",
)

TOKEN = "browser-t0ken-Zq9-0123456789"
SITES = "MAP attacker.example 127.0.0.1, MAP links.example 127.0.0.1"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,900")
    options.add_argument(f"--host-resolver-rules={SITES}")  # what a DNS rebinding achieves
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    browser.get("about:blank")
    browser.delete_all_cookies()
    browser.get_log("browser")
    yield browser
    browser.get("about:blank")


@pytest.fixture
def partner(redis_server: ServerHandle, prefix: str) -> Iterator[Limiter]:
    client = redis.Redis.from_url(redis_server.url(0))
    yield Limiter(client, "5/s, 200/h", name="partner-api", prefix=prefix)
    client.close()


class Site:
    """Another web site on 127.0.0.1 (reached by any name): serves ``pages`` by path."""

    def __init__(self, pages: dict[str, str]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path.split("?")[0], "").encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None: ...

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def log_in(browser: Any, token: str) -> None:
    field = browser.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    browser.find_element(By.ID, "login").click()


def test_log_in_block_and_log_out(
    page: Any, partner: Limiter, redis_server: ServerHandle, prefix: str
) -> None:
    browser = page
    app = limits_app(redis_server.url(0), prefix)
    with Dashboard(state_of(app), port=0, interval=0.5, allow_writes=True, token=TOKEN) as board:
        browser.get(f"{board.url}/inspect?name=partner-api&subject=c1")
        wait_for(lambda: browser.current_url, lambda u: "/login?next=" in u, timeout=10)
        log_in(browser, "not-the-token-0123456789")
        assert "not this dashboard" in until(browser, "#wrong", bool)
        assert [e for e in console_errors(browser) if "401" not in e] == []  # the refusal

        log_in(browser, TOKEN)
        assert until(browser, "#block-state", lambda t: t == "none") == "none"
        assert browser.current_url == f"{board.url}/inspect?name=partner-api&subject=c1"
        cookie = next(c for c in browser.get_cookies() if c["name"].startswith("governor_"))
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert TOKEN not in cookie["value"]
        assert browser.execute_script("return document.cookie") == ""  # not for scripts

        browser.find_element(By.ID, "reason").send_keys("from a logged-in page")
        browser.find_element(By.ID, "block").click()
        wait_for(lambda: _alert(browser), bool, timeout=5).accept()
        assert "from a logged-in page" in until(browser, "#block-state", lambda t: "blocked" in t)
        assert partner.usage("c1").blocked == "from a logged-in page"

        browser.get(board.url)
        assert "partner-api" in until(browser, "section.limit .label", lambda t: "partner" in t)
        assert console_errors(browser) == []

        browser.find_element(By.ID, "logout").click()
        wait_for(lambda: browser.current_url, lambda u: u.endswith("/login"), timeout=10)
        browser.get(board.url)
        wait_for(lambda: browser.current_url, lambda u: "/login?next=" in u, timeout=10)
        assert not browser.find_elements(By.CSS_SELECTOR, "section.limit")


def test_a_link_with_the_token_from_another_site(
    page: Any, redis_server: ServerHandle, prefix: str
) -> None:
    """A link in a chat or a wiki (another site): the token opens a session and leaves the
    address bar; the SameSite=Strict cookie is sent on the page that follows."""
    browser = page
    app = limits_app(redis_server.url(0), prefix)
    with Dashboard(state_of(app), port=0, interval=0.5, token=TOKEN) as board:
        target = f"{board.url}/limit?label=partner-api"
        wiki = Site({"/": f'<a id="go" href="{target}&amp;token={TOKEN}">the dashboard</a>'})
        try:
            browser.get(f"http://links.example:{wiki.port}/")
            browser.find_element(By.ID, "go").click()
            wait_for(lambda: browser.current_url, lambda u: u == target, timeout=10)
            assert "subjects" in until(browser, "#summary", lambda t: "subjects" in t)
            assert TOKEN not in browser.current_url
            browser.get(board.url)  # the session holds
            assert "partner-api" in until(browser, "section.limit .label", bool)
        finally:
            wiki.close()


EVIL = """<!doctype html><title>evil</title>
<iframe name="sink" id="sink"></iframe>
<form id="f" method="post" target="sink" enctype="text/plain" action="{api}/api/block">
<input name='{{"name": "partner-api", "subject": "c1", "duration": "1d", "x": "' value='"}}'>
</form>
<script>
let left = 2;
const done = () => {{ if (--left === 0) document.title = "done"; }};
fetch("{api}/api/block", {{ method: "POST", mode: "no-cors", credentials: "include",
  headers: {{ "Content-Type": "text/plain" }},
  body: JSON.stringify({{ name: "partner-api", subject: "c1", duration: "1d" }}) }})
  .then(done, done);
document.getElementById("sink").addEventListener("load", done);
document.getElementById("f").submit();
</script>"""


@pytest.mark.parametrize("token", [None, TOKEN])
def test_rebinding_and_other_sites_cannot_write(
    page: Any,
    partner: Limiter,
    redis_server: ServerHandle,
    prefix: str,
    token: str | None,
    caplog: Any,
) -> None:
    browser = page
    app = limits_app(redis_server.url(0), prefix)
    with Dashboard(state_of(app), port=0, interval=0.5, allow_writes=True, token=token) as board:
        port = board.url.rsplit(":", 1)[1]
        # the name a rebinding page has: refused, whatever the page would do next
        browser.get(f"http://attacker.example:{port}/")
        assert "not a name this dashboard serves" in text(browser, "body")
        browser.get(f"http://attacker.example:{port}/api/limits")
        assert "partner-api" not in text(browser, "body")

        if token is not None:  # a session cookie in this browser, for the same site
            browser.get(f"{board.url}/?token={token}")
            until(browser, "section.limit .label", bool)
        for host in ("links.example", "127.0.0.1"):  # another site; the same site, other port
            evil = Site({"/": EVIL.format(api=board.url)})
            try:
                with caplog.at_level(logging.WARNING, logger="governor.dashboard"):
                    browser.get(f"http://{host}:{evil.port}/")
                    wait_for(lambda: browser.title, lambda t: t == "done", timeout=10)
            finally:
                evil.close()
            assert partner.usage("c1").blocked is None, host
        refused = [r.getMessage() for r in caplog.records if "refused a POST" in r.getMessage()]
        assert any("127.0.0.1" in m for m in refused), refused  # the Origin check stopped it
