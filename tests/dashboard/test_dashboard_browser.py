"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium) against the suite's real Redis and a real Celery worker.

Skipped, with the reason, only when the browser is not installed (``.ci/run`` installs it).
The screenshots they take are for debugging, in the temporary directory
(``governor-test-dashboard*.png``); the docs' pictures are taken from the example apps under
load by ``python -m workers.showcase --screenshots docs/`` (docs/development.md).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from governor.celery import Governor
from governor.cli import cli
from governor.dashboard.server import Dashboard
from governor.embedded import EmbeddedRedis
from support.celery_helpers import new_app, wait_for, worker
from support.dashboard_helpers import limits_app, state_of
from support.servers import ServerHandle

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SHOTS = Path(tempfile.gettempdir())
"""Where the screenshots go (for debugging: the docs' are made by workers.showcase)."""
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="no chromium/chromedriver: apt-get install -y chromium chromium-driver",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """The browser with a blank page and no console messages left from an earlier test."""
    browser.get("about:blank")
    browser.get_log("browser")
    yield browser
    browser.get("about:blank")  # stop polling before the test's dashboard goes away


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def text(driver: Any, selector: str) -> str:
    """The visible text of every element ``selector`` matches, read in one step in the page
    (the page replaces its elements on each refresh: element handles would go stale)."""
    script = (
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".filter(e => !e.hidden).map(e => e.innerText.trim()).join(' ')"
    )
    return str(driver.execute_script(script, selector))


def until(driver: Any, selector: str, done: Any, timeout: float = 10) -> str:
    """The text of ``selector`` once ``done(text)`` holds (or the last one, to assert on)."""
    return str(wait_for(lambda: text(driver, selector), done, timeout=timeout))


def test_live_overview_while_a_backlog_runs(
    page: Any, redis_server: ServerHandle, prefix: str
) -> None:
    browser = page
    q = f"dash{uuid.uuid4().hex[:6]}"
    app = new_app(redis_server.url(), q, governor_queues={q: "5/s"})
    Governor(app)

    @app.task(shared=False)
    def job(i: int) -> None: ...

    label = f"queue:{q}"
    with Dashboard(state_of(app), port=0, interval=0.5) as board:
        browser.get(board.url)
        shown = until(browser, "section.limit .label", lambda t: label in t)
        assert label in shown
        assert "5/s" in text(browser, f'section.limit[data-label="{label}"] .rules-text')
        assert not browser.find_elements(By.ID, "block")  # no write buttons without the flag

        with worker(app, [q]):
            for i in range(40):
                job.delay(i)
            row = f'section.limit[data-label="{label}"] td.rate'
            busy = until(browser, row, lambda t: t not in ("", "-", "0.00/s"), timeout=15)
            assert busy.endswith("/s") and float(busy[:-2]) > 0
            used = text(browser, f'section.limit[data-label="{label}"] td.used')
            assert used.endswith("/5")
            # the sparkline has a line once two samples exist
            path = f'section.limit[data-label="{label}"] svg path.series'
            points = f"return document.querySelector('{path}')?.getAttribute('d').split('L').length"
            drawn = wait_for(lambda: browser.execute_script(points) or 0, lambda n: n >= 8, 10)
            assert drawn >= 8  # a line of 8 samples (4 s at 0.5 s)
            browser.save_screenshot(str(SHOTS / "governor-test-dashboard.png"))

            # a block made from the CLI shows within the refresh interval
            result = CliRunner().invoke(
                cli, ["block", "queue", q, "--for", "10m", "--reason", "runaway test"], obj=app
            )
            assert result.exit_code == 0, result.output
            made = time.monotonic()
            state = until(
                browser, f'section.limit[data-label="{label}"] td.state', lambda t: "BLOCKED" in t
            )
            assert "BLOCKED" in state and "runaway test" in state
            assert time.monotonic() - made < 0.5 + 1.0 + 1.0  # refresh + poll + slack

            browser.get(f"{board.url}/inspect?name=queue&subject={q}")
            block = until(browser, "#block-state", lambda t: "blocked" in t)
            assert "runaway test" in block
            wait_for(
                lambda: browser.find_elements(By.CSS_SELECTOR, "#chart svg path.series"),
                bool,
                timeout=5,
            )
            browser.save_screenshot(str(SHOTS / "governor-test-dashboard-inspect.png"))
            assert not browser.find_elements(By.ID, "write-controls")
            CliRunner().invoke(cli, ["unblock", "queue", q], obj=app)

        assert console_errors(browser) == []
        # an unknown limit in the URL: a 404 with the reason on the page (the browser logs the
        # 404 itself, nothing else)
        browser.get(f"{board.url}/inspect?name=queue&subject=nosuchqueue")
        message = text(browser, "#problem")
        assert f"queue 'nosuchqueue' has no limit in app {app.main!r}" in message
        assert "Traceback" not in browser.page_source
    errors = console_errors(browser)
    assert len(errors) == 1 and "404 (NOT FOUND)" in errors[0], errors


def test_writes_ask_first_and_redis_going_away(page: Any, prefix: str) -> None:
    browser = page
    server = EmbeddedRedis().start()
    try:
        app = limits_app(server.url(), prefix)
        with Dashboard(state_of(app), port=0, interval=0.3, allow_writes=True) as board:
            browser.get(f"{board.url}/inspect?name=partner-api&subject=c1")
            assert until(browser, "#block-state", lambda t: t == "none") == "none"
            button = browser.find_element(By.ID, "block")
            browser.find_element(By.ID, "reason").send_keys("from the page")

            button.click()  # cancelled: nothing happens
            alert = wait_for(lambda: _alert(browser), bool, timeout=5)
            assert "Block c1 of partner-api for 15m?" in alert.text
            alert.dismiss()
            assert until(browser, "#write-result", lambda t: t == "cancelled") == "cancelled"
            assert text(browser, "#block-state") == "none"

            button.click()
            wait_for(lambda: _alert(browser), bool, timeout=5).accept()
            state = until(browser, "#block-state", lambda t: "blocked" in t)
            assert "from the page" in state
            browser.save_screenshot(str(SHOTS / "governor-test-dashboard-writes.png"))

            browser.find_element(By.ID, "unblock").click()
            wait_for(lambda: _alert(browser), bool, timeout=5).accept()
            assert until(browser, "#block-state", lambda t: t == "none") == "none"

            browser.get(board.url)
            until(browser, "section.limit .label", lambda t: "partner-api" in t)
            server.stop()
            banner = until(browser, "#banner", lambda t: "unreachable" in t)
            assert "Redis is unreachable" in banner and "cannot reach Redis" in banner
            browser.save_screenshot(str(SHOTS / "governor-test-dashboard-redis-down.png"))
            server.start()
            assert until(browser, "#banner", lambda t: t == "") == ""
            assert browser.find_elements(By.CSS_SELECTOR, "section.limit")
            # while Redis was away the API answered (with the error): nothing failed to load
            errors = console_errors(browser)
            assert errors == [], errors
    finally:
        server.close()


def test_a_limit_page_with_a_pause_and_a_live_limit(
    page: Any, redis_server: ServerHandle, prefix: str
) -> None:
    """The overview links a limit to its page, which lists every subject (paged, searchable);
    a pause from upstream shows as PAUSED, a live limit with who set it and the configured one."""
    import redis

    from governor import Limiter
    from governor.celery.config.live import LiveLimits

    browser = page
    app = limits_app(redis_server.url(0), prefix)
    client = redis.Redis.from_url(redis_server.url(0))
    partner = Limiter(client, "5/s, 200/h", name="partner-api", prefix=prefix)
    for n in range(60):
        partner.acquire(f"cust-{n:02d}")
    partner.pause("cust-07", 600, "HTTP 429 (call_partner)")
    LiveLimits(client, prefix).set("partner-api", {"rules": "2/s, 100/h"}, by="ops-alice")
    with Dashboard(state_of(app), port=0, interval=0.5) as board:
        browser.get(board.url)
        card = 'section.limit[data-label="partner-api"]'
        marks = until(browser, f"{card} .tag.live", lambda t: "ops-alice" in t)
        assert "configured: 5/s, 200/h" in marks
        assert "PAUSED by upstream" in text(browser, f"{card} td.state")
        browser.find_element(By.CSS_SELECTOR, f"{card} a.label").click()

        summary = until(browser, "#summary", lambda t: "of 60 subjects" in t)
        assert summary.startswith("60 of 60 subjects") and "1 paused" in summary
        assert "ops-alice" in text(browser, "#live-state")
        assert "2/s, 100/h" in text(browser, "#rules-text")
        state = text(browser, '#subjects tr[data-subject="cust-07"] td.state')
        assert "PAUSED by upstream" in state and "HTTP 429" in state
        browser.save_screenshot(str(SHOTS / "governor-test-dashboard-limit.png"))
        browser.find_element(By.ID, "next").click()
        assert until(browser, "#page-info", lambda t: t == "page 2 of 2") == "page 2 of 2"
        browser.find_element(By.ID, "q").send_keys("cust-5")
        shown = until(browser, "#summary", lambda t: t.startswith("10 of 60"))
        assert shown.startswith("10 of 60")
        assert text(browser, "#page-info") == "page 1 of 1"
        assert console_errors(browser) == []
    client.close()


def _alert(driver: Any) -> Any:
    try:
        alert = driver.switch_to.alert
        alert.text  # noqa: B018 (raises when there is none)
        return alert
    except NoAlertPresentException:
        return None
