"""Pictures of pages in headless Chromium (Debian's ``chromium`` and ``chromedriver``, driven by
Selenium with the options of tests/dashboard/test_dashboard_browser.py).

:class:`Camera` waits for a page to show what its picture is for (:meth:`Camera.wait_text`),
then saves the whole page, as tall as it is (:meth:`Camera.shoot`).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

from .scene import ShowcaseError, wait_for

__all__ = ["Camera", "browser_missing"]

WIDTH = 1280
MAX_HEIGHT = 2400
INSTALL = "apt-get install -y chromium chromium-driver (Debian), and pip install selenium"


def browser_missing() -> str | None:
    """Why pictures cannot be taken here (None: they can)."""
    missing = [n for n in ("chromium", "chromedriver") if not _which(n)]
    try:
        import selenium.webdriver  # noqa: F401
    except ImportError:
        missing.append("selenium")
    return f"no {', '.join(missing)}: {INSTALL}" if missing else None


def _which(name: str) -> str | None:
    return shutil.which(name) or (shutil.which("chromium-browser") if name == "chromium" else None)


class Camera:
    """A headless Chromium saving pictures into ``folder``."""

    def __init__(self, folder: Path) -> None:
        from selenium import webdriver

        self.folder = folder
        self.taken: list[Path] = []
        options = webdriver.ChromeOptions()
        options.binary_location = str(_which("chromium"))
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
            options.add_argument(arg)
        options.add_argument(f"--window-size={WIDTH},900")
        options.add_argument("--force-device-scale-factor=1")
        service = webdriver.ChromeService(str(_which("chromedriver")))
        try:
            self.driver: Any = webdriver.Chrome(options=options, service=service)
        except Exception as exc:  # selenium's errors name the binary and what went wrong
            raise ShowcaseError(f"could not start chromium: {exc}") from None
        self.driver.implicitly_wait(0)
        self.driver.set_page_load_timeout(30)
        self.driver.set_script_timeout(10)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def text(self, selector: str = "body") -> str:
        """The visible text of every element ``selector`` matches, read in one step (the
        dashboard replaces its elements on each refresh)."""
        script = (
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".filter(e => !e.hidden).map(e => e.innerText.trim()).join('\\n')"
        )
        return str(self.driver.execute_script(script, selector))

    def wait_text(self, *needles: str, selector: str = "body", timeout: float = 20) -> str:
        """The text of ``selector`` once it shows every one of ``needles``."""

        def missing(text: str) -> list[str]:
            return [n for n in needles if n not in text]

        try:
            return wait_for(lambda: self.text(selector), lambda t: not missing(t), timeout, "")
        except ShowcaseError:
            gone = missing(self.text(selector))
            raise ShowcaseError(
                f"{self.driver.current_url} did not show {gone} within {timeout:.0f}s"
            ) from None

    def wait_script(self, script: str, timeout: float = 20, what: str = "") -> Any:
        """The value of ``script`` once it is truthy."""
        return wait_for(lambda: self.driver.execute_script(script), bool, timeout, what or script)

    def shoot(self, name: str, whole: bool = True) -> Path:
        """Save the page as ``folder/name``: all of it (at most ``MAX_HEIGHT`` pixels), or what
        a 1280x900 window shows."""
        path = self.folder / name
        height = 900
        if whole:
            height = min(
                MAX_HEIGHT,
                int(self.driver.execute_script("return document.documentElement.scrollHeight")),
            )
        metrics = {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        try:  # two frames: laid out and painted at the new size
            self.driver.execute_async_script(
                "const done = arguments[0];"
                "requestAnimationFrame(() => requestAnimationFrame(() => done(true)));"
            )
            if not self.driver.save_screenshot(str(path)):
                raise ShowcaseError(f"chromium could not save {path}")
        finally:
            self.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        self.taken.append(path)
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a browser that died already
            self.driver.quit()
