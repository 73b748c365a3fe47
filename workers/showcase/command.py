"""``python -m workers.showcase``: the example apps under load, and the docs' pictures of it.

Exit codes: 0 done (every picture taken, with ``--screenshots``); 1 something did not happen in
time or a process failed (the message says what, the logs' ends follow); 2 usage (also: no
chromium, chromedriver or selenium for ``--screenshots``); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from governor.cli.demo.processes import _signal_group, _signals_interrupt

from .load import Trickle, flood
from .partner import Partner
from .pictures import Camera, browser_missing
from .scene import Board, Scene, ShowcaseError, tail, wait_for

__all__ = ["main"]

LIVE = ("partner-api", "3/s, 200/h", "ops-alice")
"""The live limit set with ``governor limits set``: (label, rules, who)."""
BLOCK = ("partner-api", "initech", "30m", "invoice overdue: ask billing")
"""The block made with ``governor block``: (limit, subject, for, reason)."""
PAUSED = "globex"
"""The customer the partner refuses after its quota of calls (429, ``Retry-After: 600``)."""
QUOTA = 15
PAGE_BLOCK = ("queue", "emails", "15m", "provider incident #2291")
"""The block made from the writes page: (limit, subject, for, reason)."""
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
PICTURES = (
    "dashboard.png",
    "dashboard-limit.png",
    "dashboard-inspect.png",
    "dashboard-cap.png",
    "dashboard-writes.png",
    "dashboard-redis-down.png",
    "demo-report.png",
)


class Showcase:
    """One run: the scene, its load, and the pictures."""

    def __init__(self, workdir: Path) -> None:
        self.started = time.monotonic()
        self.workdir = workdir
        self.scene = Scene(workdir)
        self.partner = Partner({PAUSED: QUOTA}, retry_after=600)
        self.trickles: list[Trickle] = []

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {message}", file=sys.stderr, flush=True)

    # -- the scene --------------------------------------------------------------------------

    def start(self, show_token: bool) -> tuple[Board, Board]:
        """Start everything and bring the load; the dashboards: (read-only, with writes)."""
        scene = self.scene
        scene.start_redis(self.partner.url)
        self.say(f"Redis on {scene.env['GOVERNOR_REDIS_URL']}, partner API on {self.partner.url}")
        scene.start_workers()
        board = scene.start_dashboard("dashboard")  # read-only, as by default
        writes = scene.start_dashboard(
            "dashboard-writes", "--allow-writes", token=secrets.token_urlsafe(24)
        )
        self.partner.start()  # threads only once the children are forked
        scene.wait_workers(timeout=60)
        scene.wait_dashboard(board, timeout=30)
        scene.wait_dashboard(writes, timeout=30)
        self.say(f"{scene.nodes} worker nodes ready; dashboard (read-only): {board.url}")
        login = f"/?token={writes.token}" if show_token else ""
        self.say(f"dashboard with --allow-writes and a token: {writes.url}{login}")

        label, rules, who = LIVE
        scene.governor("limits", "set", label, rules, "--by", who)
        self.say(f"governor limits set {label} {rules!r} --by {who}")
        sent = flood(scene.env)
        name, subject, duration, reason = BLOCK
        self.trickles = [Trickle(customer, 2.0) for customer in (subject, PAUSED)]
        for trickle in self.trickles:
            trickle.start()
        self.say("sent " + ", ".join(f"{n} {kind}" for kind, n in sent.items()))
        self.say(f"{subject} and {PAUSED} call the partner 2 a second each")

        wait_for(lambda: self.partner.count(subject), lambda n: n >= 20, 60, f"{subject}'s calls")
        scene.governor("block", name, subject, "--for", duration, "--reason", reason)
        self.say(f"governor block {name} {subject} --for {duration} --reason {reason!r}")
        wait_for(lambda: self.partner.count(PAUSED, 429), bool, 60, f"a 429 to {PAUSED}")
        self.say(f"the partner answered {PAUSED} 429 (Retry-After: 600) after {QUOTA} calls")
        # their calls start no more: the rates the dashboard samples fall to 0
        for customer, end in ((subject, "block"), (PAUSED, "pause")):
            path = f"api/inspect?name={name}&subject={customer}"
            wait_for(
                lambda: scene.read(board, path)["rate"],  # noqa: B023 (called at once)
                lambda rate: rate == 0,
                60,
                f"{customer}'s rate to fall to 0 after its {end}",
            )
            self.say(f"{customer}'s calls wait for the end of its {end}: its rate is 0")
        scene.check_workers()
        return board, writes

    def stop(self) -> None:
        for trickle in self.trickles:
            trickle.stop()
        self.scene.stop()
        with contextlib.suppress(Exception):
            self.partner.close()

    # -- the pictures -----------------------------------------------------------------------

    def pictures(self, camera: Camera, board: Board, writes: Board, with_demo: bool) -> None:
        self.overview(camera, board)
        self.limit_page(camera, board)
        self.subject_page(camera, board)
        self.cap_page(camera, board)
        self.writes_page(camera, writes)
        self.redis_down(camera, board)
        if with_demo:
            self.stop()  # the demo starts its own Redis and workers: give it the machine
            self.demo_report(camera)

    def overview(self, camera: Camera, board: Board) -> None:
        camera.open(board.url)
        camera.wait_text(
            "queue:emails",
            "booked up to",
            "parked",
            "PAUSED by upstream",
            "BLOCKED",
            BLOCK[3],  # the block made from the command line, with its reason
            f"live · set by {LIVE[2]}",
            "waiting for a slot",
            "waiting fairly",
        )
        # every tenant of the fair queue has calls waiting
        reports = 'section.limit[data-label="queue:reports"] td.state'
        camera.wait_text("globex:", "acme:", "initech:", selector=reports)
        # half a minute of the emails' rate on their sparkline (of the last minute)
        line = 'section.limit[data-label="queue:emails"] svg path.series'
        points = f"return document.querySelector('{line}')?.getAttribute('d').split('L').length"
        wait_for(
            lambda: camera.driver.execute_script(points) or 0,
            lambda n: n >= 30,
            60,
            "30 samples of the emails' rate",
        )
        self.took(camera.shoot("dashboard.png"))

    def limit_page(self, camera: Camera, board: Board) -> None:
        camera.open(f"{board.url}/limit?label={LIVE[0]}")
        camera.wait_text(
            f"set by {LIVE[2]}", "PAUSED by upstream", "HTTP 429", "BLOCKED", "umbrella", "acme"
        )
        self.took(camera.shoot("dashboard-limit.png"))

    def subject_page(self, camera: Camera, board: Board) -> None:
        name, subject, _, reason = BLOCK
        camera.open(f"{board.url}/inspect?name={name}&subject={subject}")
        camera.wait_text("blocked for", reason, selector="#block-state")
        camera.wait_script("return document.querySelector('#chart svg path.series')")
        self.took(camera.shoot("dashboard-inspect.png"))

    def cap_page(self, camera: Camera, board: Board) -> None:
        camera.open(f"{board.url}/inspect?name=queue&subject=exports")
        # its 3 slots held, the other exports in line (one may be in transit to a worker)
        wait_for(
            lambda: camera.text("#details"),
            lambda text: bool(re.search(r"3 of 3 at once; [1-9]\d* waiting", text)),
            20,
            "the exports' 3 slots held and exports waiting",
        )
        self.took(camera.shoot("dashboard-cap.png"))

    def writes_page(self, camera: Camera, board: Board) -> None:
        from selenium.webdriver.common.by import By

        name, subject, duration, reason = PAGE_BLOCK
        # a link with the token logs in once (a cookie), and loads the page without it
        camera.open(f"{board.url}/inspect?name={name}&subject={subject}&token={board.token}")
        camera.wait_text("none", selector="#block-state")
        camera.wait_script("return document.querySelector('#chart svg path.series')")
        field = camera.driver.find_element(By.ID, "duration")
        field.clear()
        field.send_keys(duration)
        camera.driver.find_element(By.ID, "reason").send_keys(reason)
        camera.driver.find_element(By.ID, "block").click()
        wait_for(lambda: _alert(camera.driver), bool, 10, "the page's confirmation").accept()
        camera.wait_text("blocked for", reason, selector="#block-state")
        camera.wait_text("block: done", selector="#write-result")
        self.took(camera.shoot("dashboard-writes.png"))

    def redis_down(self, camera: Camera, board: Board) -> None:
        camera.open(board.url)
        camera.wait_text("queue:emails", PAGE_BLOCK[3])  # the block made from the page, read
        for trickle in self.trickles:
            trickle.stop()
        self.scene.stop_workers()
        self.scene.stop_redis()
        camera.wait_text("Redis is unreachable", selector="#banner")
        self.took(camera.shoot("dashboard-redis-down.png", whole=False))

    def demo_report(self, camera: Camera) -> None:
        page, log = self.workdir / "demo.html", self.workdir / "demo.log"
        command = [sys.executable, "-m", "governor.cli", "demo", "--duration", "20s"]
        # the demo makes its own Redis: none of the scene's settings
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GOVERNOR_", "CELERY_"))}
        self.say("governor demo --duration 20s --report demo.html")
        with log.open("wb") as out:
            demo = subprocess.Popen(
                [*command, "--report", str(page)],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        code: int | None = None
        try:
            code = demo.wait(90)
        except subprocess.TimeoutExpired:
            _signal_group(demo.pid, signal.SIGINT)  # the demo stops what it started
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = demo.wait(30)
        finally:
            if demo.poll() is None:
                _signal_group(demo.pid, signal.SIGKILL)
                demo.wait(5)
        if code != 0 or not page.exists():
            raise ShowcaseError(f"governor demo failed ({code}):\n{tail(log)}")
        camera.open(page.as_uri())
        camera.wait_text("governor demo", "every task ran")
        self.took(camera.shoot("demo-report.png"))

    def took(self, path: Path) -> None:
        self.say(f"took {path.name}")


def _alert(driver: Any) -> Any:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = driver.switch_to.alert
        alert.text  # noqa: B018 (raises when there is none)
        return alert
    except NoAlertPresentException:
        return None


def _too_long(signum: int, frame: FrameType | None) -> None:
    raise ShowcaseError("the showcase took longer than --timeout: stopping it")


def run(args: argparse.Namespace) -> None:
    """One run, stopping everything it started on the way out (an error, a signal, the end)."""
    folder: Path | None = args.screenshots
    with contextlib.ExitStack() as stack, _signals_interrupt():
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="showcase-")))
        # the pictures are taken into workdir, and copied to the folder once all are taken
        camera = Camera(workdir) if folder is not None else None
        if camera is not None:
            stack.callback(camera.close)
        show = Showcase(workdir)
        stack.callback(show.stop)
        signal.signal(signal.SIGALRM, _too_long)
        signal.alarm(int(args.timeout))
        stack.callback(signal.alarm, 0)
        try:
            board, writes = show.start(show_token=camera is None)
            if camera is not None:
                show.pictures(camera, board, writes, with_demo=not args.no_demo)
            else:
                signal.alarm(0)
                show.say(f"holding for {args.hold:.0f}s (Ctrl-C stops it)")
                end = time.monotonic() + args.hold
                while time.monotonic() < end:
                    show.scene.check_workers()
                    time.sleep(1)
        except ShowcaseError:
            for log in sorted(workdir.glob("*.log")):
                print(f"--- {log.name}\n{tail(log, 1500)}", file=sys.stderr)
            raise
        show.say("stopping")
        if camera is not None and folder is not None:
            for taken in camera.taken:
                print(shutil.copy(taken, folder / taken.name), flush=True)


def main(argv: list[str] | None = None) -> None:
    """Run the example apps under load on two worker nodes, with the dashboard; with
    --screenshots, take the docs' pictures of it and stop."""
    parser = argparse.ArgumentParser(prog="python -m workers.showcase", description=main.__doc__)
    parser.add_argument(
        "--screenshots",
        type=Path,
        metavar="DIR",
        help=f"save the pictures ({', '.join(PICTURES)}) in DIR (e.g. docs/)",
    )
    parser.add_argument(
        "--no-demo", action="store_true", help="no picture of governor demo's report"
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=300.0,
        help="without --screenshots: seconds the scene runs, dashboards open (default 300)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=240.0,
        help="with --screenshots: stop everything and fail after this many seconds (default 240)",
    )
    args = parser.parse_args(argv)
    if args.timeout < 30 or args.hold < 0:
        parser.error("--timeout must be at least 30 and --hold at least 0")
    if args.screenshots is not None:
        if not args.screenshots.is_dir() or not os.access(args.screenshots, os.W_OK):
            parser.error(f"--screenshots {str(args.screenshots)!r}: not a writable folder")
        problem = browser_missing()
        if problem:
            parser.exit(EXIT_USAGE, f"error: cannot take pictures: {problem}\n")
    try:
        run(args)
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None
    except KeyboardInterrupt:
        print("interrupted: everything started was stopped", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
