"""``governor demo``: a real run (private Redis, two worker nodes) and its clean-up, also when
interrupted; then the arithmetic and the usage errors, without processes.

The clean-up checks watch the demo's process tree while it runs (Redis, the workers, their pool
processes) and require every process seen to be gone after it exits, and no process anywhere
to carry the run's node names.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from governor.cli import cli
from governor.cli.demo import command as demo_module
from governor.cli.demo.command import (
    default_tasks,
    most_in_window,
    per_second_limit,
    starts_within,
)
from governor.rules import parse_rules

ROOT = Path(__file__).resolve().parents[2]
PROC = Path("/proc")
pytestmark = pytest.mark.skipif(not PROC.is_dir(), reason="needs /proc to watch processes")

Seen = dict[int, tuple[str, str]]
"""pid -> (start time in clock ticks, command line)"""


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(ppid, state, start time) of a process, or None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]), fields[0], fields[19]


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(root: int) -> Seen:
    """Every process below ``root`` now."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry.name))
    found: Seen = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            stat = _stat(child)
            if stat is not None:
                found[child] = (stat[2], _cmdline(child))
                todo.append(child)
    return found


def still_running(seen: Seen) -> list[str]:
    """The processes in ``seen`` that still run (same pid and start time, not a zombie)."""
    left = []
    for pid, (started, cmd) in seen.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == started and stat[1] != "Z":
            left.append(f"{pid} {cmd}")
    return left


def carrying(marker: str) -> list[str]:
    """Running processes whose command line contains ``marker`` (e.g. a run's node names)."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit() and marker in _cmdline(int(entry.name)):
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] != "Z":
                found.append(f"{entry.name} {_cmdline(int(entry.name))}")
    return found


def _as_from_a_terminal() -> None:
    """In the child: Ctrl-C interrupts, as in a terminal. A suite started in the background
    by a shell (``pytest ... &``) ignores SIGINT, and the demo keeps an ignored signal ignored,
    as it does under ``nohup``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Demo:
    """``governor demo`` in its own session (as from a terminal), its process tree watched."""

    def __init__(self, tmp_path: Path, *args: str | Path) -> None:
        self.out, self.err = tmp_path / "stdout", tmp_path / "stderr"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GOVERNOR_", "CELERY_"))}
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "governor.cli", "demo", *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=_as_from_a_terminal,
            )
        self.seen: Seen = {}

    def output(self) -> str:
        """Both outputs, for assertion messages (stdout holds the summary)."""
        return f"stdout:\n{self.out.read_text()}\nstderr:\n{self.err.read_text()}"

    def note(self) -> None:
        """Add the demo's processes now, with their latest command line (a child seen between
        fork and exec still shows the demo's; one exiting may show none)."""
        for pid, (started, cmd) in descendants(self.proc.pid).items():
            known = self.seen.get(pid)
            if known is None or known[0] != started or cmd:
                self.seen[pid] = (started, cmd)

    def watch(self, until: float, stop_when: str | None = None) -> None:
        """Note the demo's processes until it exits, ``stop_when`` shows in its stderr, or
        ``until`` (monotonic) passes."""
        while self.proc.poll() is None and time.monotonic() < until:
            self.note()
            if stop_when and stop_when in self.err.read_text():
                return
            time.sleep(0.1)

    def wait(self, timeout: float) -> int:
        self.watch(time.monotonic() + timeout)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            pytest.fail(f"the demo did not exit within {timeout}s:\n{self.output()}")
        return self.proc.returncode

    def check_nothing_left(self) -> None:
        kinds = [cmd for _, cmd in self.seen.values()]
        assert sum("redis-server" in c for c in kinds) == 1, kinds
        workers = sum("celery" in c and " worker " in c for c in kinds)
        assert workers >= 2 * 3, [c[:70] for c in kinds]  # two nodes and their pool processes
        deadline = time.monotonic() + 5
        while still_running(self.seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not still_running(self.seen), still_running(self.seen)


@pytest.mark.worker
def test_demo_runs_within_the_limit_and_cleans_up(tmp_path: Path) -> None:
    report = tmp_path / "run.html"
    args = ("--rules", "10/s", "--tasks", "60", "--duration", "10", "--json", "--report")
    demo = Demo(tmp_path, *args, report)
    code = demo.wait(timeout=45)
    assert code == 0, demo.output()
    summary = json.loads(demo.out.read_text())
    assert summary["ok"] and summary["all_done"], summary
    assert (summary["tasks"], summary["done"], summary["missing"]) == (60, 60, 0)
    # checked: admissions as Redis counted them; shown: body starts, which may bunch up a bit
    assert summary["windows"][0].pop("max_starts") >= 1, summary
    assert summary["windows"] == [
        {"rule": "10/s", "limit": 10, "period": 1.0, "max_counted": 10, "ok": True}
    ]
    assert summary["waits"]["histogram"]["0"] == 10  # the first 10 at once, the rest waited
    assert summary["waits"]["max"] <= 2
    assert summary["pace"]["allowed_span"] == 5.9
    assert 5.9 <= summary["pace"]["span"] < 8.0
    assert len(summary["nodes"]) == 2 and sum(summary["nodes"].values()) >= 60
    assert summary["elapsed"] < 10
    demo.check_nothing_left()
    pids = summary["processes"]
    assert set(pids["workers"]) | {pids["redis"]} <= set(demo.seen)
    assert not carrying(f"-{summary['run']}@")
    page = report.read_text()  # the page (its content: test_demo_report.py)
    assert f"report written to {report}" in demo.err.read_text()
    assert "ok: every task ran" in page and page.count("<svg") == 4, page[:2000]
    assert f"demo1-{summary['run']}@" in page and str(pids["redis"]) in page


@pytest.mark.worker
@pytest.mark.parametrize(
    ("how", "signum"),
    [("group", signal.SIGINT), ("demo", signal.SIGTERM), ("redis", signal.SIGKILL)],
    ids=["ctrl-c-on-the-terminal", "sigterm-to-the-demo", "redis-dies"],
)
def test_interrupting_the_demo_stops_everything(
    tmp_path: Path, how: str, signum: signal.Signals
) -> None:
    """Ctrl-C on a terminal signals the demo's whole process group (its private Redis too; the
    workers have their own); ``kill`` signals the demo alone; or the private Redis dies. The
    report is written all the same."""
    report = tmp_path / "run.html"
    demo = Demo(
        tmp_path, "--rules", "5/s", "--tasks", "200", "--duration", "60", "--report", report
    )
    demo.watch(time.monotonic() + 40, stop_when="flooding")
    assert demo.proc.poll() is None, demo.output()
    time.sleep(1.5)  # a few tasks run, most wait
    demo.note()
    if how == "group":
        os.killpg(demo.proc.pid, signum)
    elif how == "demo":
        demo.proc.send_signal(signum)
    else:
        os.kill(next(p for p, (_, cmd) in demo.seen.items() if "redis-server" in cmd), signum)
    started = time.monotonic()
    code = demo.wait(timeout=20)
    err, out = demo.err.read_text(), demo.out.read_text()
    assert time.monotonic() - started < 10, "clean-up took too long"
    assert "Traceback" not in err, demo.output()
    if how == "redis":
        assert code == 3, demo.output()
        assert "Error: lost Redis at private Redis on 127.0.0.1:" in err
    else:
        assert code == 130, demo.output()
        assert f"interrupted ({signal.Signals(signum).name})" in err
        assert "governor demo: interrupted" in out and "had not started" in out, out
    page = report.read_text()
    assert ("failed: lost Redis" if how == "redis" else "interrupted: ") in page, page[:2000]
    demo.check_nothing_left()
    run = next(cmd for _, cmd in demo.seen.values() if " -n demo1-" in cmd)
    marker = run.split(" -n demo1-")[1].split("@")[0]
    assert not carrying(f"-{marker}@")


@pytest.mark.worker
def test_every_cli_command_works_against_a_running_demo(tmp_path: Path) -> None:
    """What the demo prints for "another terminal" works while it runs: status, inspect, top,
    block (tasks wait, none is lost), unblock, reset; then Ctrl-C stops it all."""
    demo = Demo(tmp_path, "--rules", "5/s", "--tasks", "200", "--duration", "60")
    demo.watch(time.monotonic() + 40, stop_when="(or status")
    err = demo.err.read_text()
    assert demo.proc.poll() is None, demo.output()
    export = re.search(r"^  export (GOVERNOR_REDIS_URL=.*)$", err, re.M)
    assert export and "  governor -A governor.cli.demo.app top" in err, err
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOVERNOR_")}
    env.update(item.split("=", 1) for item in shlex.split(export[1]))
    assert env["GOVERNOR_DEMO_RULES"] == "5/s", env
    base = [sys.executable, "-m", "governor.cli", "-A", "governor.cli.demo.app"]

    def cli_run(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*base, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    time.sleep(1.5)  # some tasks start, the rest are booked
    status = cli_run("status", "--json")
    assert status.returncode == 0, status.stderr
    found = {
        (limit["name"], subject["subject"])
        for limit in json.loads(status.stdout)["limits"]
        for subject in limit["subjects"]
    }
    assert ("task", "governor.demo.call") in found, status.stdout
    inspect = cli_run("inspect", "task", "governor.demo.call", "--json")  # rules from the app
    assert inspect.returncode in (0, 1), inspect.stderr  # 1: denied right now
    used = json.loads(inspect.stdout)["rules"][0]
    assert used["limit"] == 5 and used["used"] <= 5, used
    top = cli_run("top", "--once")
    assert top.returncode == 0 and "governor.demo.call" in top.stdout, top.stdout
    block = cli_run("block", "task", "governor.demo.call", "--for", "2s", "--reason", "test")
    assert block.returncode == 0, block.stderr
    blocked = cli_run("inspect", "task", "governor.demo.call", "--json")
    assert blocked.returncode == 1 and json.loads(blocked.stdout)["blocked"], blocked.stdout
    assert cli_run("unblock", "task", "governor.demo.call").returncode == 0
    assert cli_run("reset", "task", "governor.demo.call", "--yes").returncode == 0
    bad = cli_run("inspect", "nosuchlimit", "x")
    assert bad.returncode in (1, 2) and "Error" in bad.stderr, bad.stderr
    assert demo.proc.poll() is None, demo.output()
    os.killpg(demo.proc.pid, signal.SIGINT)
    assert demo.wait(timeout=20) == 130, demo.output()
    demo.check_nothing_left()


# -- without processes ----------------------------------------------------------------------


def test_arithmetic() -> None:
    assert most_in_window([], 1.0) == 0
    assert most_in_window([0.0, 0.999, 1.0, 1.5], 1.0) == 3
    assert per_second_limit(parse_rules("20/s, 300/m")) == 20
    assert per_second_limit(parse_rules("1/s, 20/m")) == 1
    assert per_second_limit(parse_rules("5/500ms")) == 10
    assert default_tasks(parse_rules("20/s, 300/m"), 30) == 240  # 80% of the 300/m
    assert default_tasks(parse_rules("10/s"), 10) == 53  # 80% of 10 at once + 57 in 5.67s
    assert default_tasks(parse_rules("1000/s"), 30) == demo_module.MAX_DEFAULT_TASKS
    assert default_tasks(parse_rules("1/h"), 30) == 1
    assert starts_within(parse_rules("10/s, 50/10s"), 12, jobs=80) == 71


def test_usage_errors_start_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    bad = runner.invoke(cli, ["demo", "--rules", "10/fortnight"])
    assert bad.exit_code == 2 and "--rules" in bad.output and "unknown unit" in bad.output
    bad = runner.invoke(cli, ["demo", "--duration", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output
    unreachable = runner.invoke(cli, ["demo", "--redis-url", "redis://127.0.0.1:1/0", "--json"])
    assert unreachable.exit_code == 3, unreachable.output
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in unreachable.output
    assert "Traceback" not in unreachable.output

    real = demo_module.importlib.util.find_spec
    monkeypatch.setattr(
        demo_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "rich" else real(name, *a),
    )
    missing = runner.invoke(cli, ["demo"])
    assert missing.exit_code == 2
    assert "'rich'" in missing.output and "pip install 'celery-governor[demo]'" in missing.output
