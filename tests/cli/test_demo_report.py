"""``governor demo``'s verdict and its ``--report`` page, from synthetic runs (no processes), and
the ``counted_at`` of ``task_admitted`` that the verdict rests on."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Task
from click.testing import CliRunner
from rich.console import Console

from governor.celery import signals
from governor.celery.admission.gate import Gate
from governor.celery.types import Call, LimitConfig, LimitSpec, Outcome, WaitState
from governor.cli import cli
from governor.cli.demo.page import render
from governor.cli.demo.report import DemoRecord, Summary, summary_renderable
from governor.decision import Decision, Slot
from governor.rules import parse_rules

HOSTILE = "<script>alert('x')</script>&\"@host"
SVG = "{http://www.w3.org/2000/svg}"
UNREACHABLE = "redis://127.0.0.1:1/0"


def flood(hostile: bool = False, over: bool = False) -> list[DemoRecord]:
    """30 tasks under 10/s from t=1000: 10 at once, then one every 0.1s from 1001.0. The first
    body starts 0.3s late, so 11 bodies start within a second; ``over``: one admission too."""
    records = []
    for n in range(30):
        counted = 1000.0 + n * 0.001 if n < 10 else 1001.0 + (n - 10) * 0.1
        if over and n == 10:
            counted = 1000.95
        started = counted + (0.3 if n == 0 else 0.005)
        node = (HOSTILE if hostile else "demo2-abc@host") if n % 2 else "demo1-abc@host"
        records.append(DemoRecord(n, started, 0 if n < 10 else 1, node, counted, 100 + n % 4))
    return records


def summary(records: list[DemoRecord], **kw: Any) -> Summary:
    extra = {
        "run": "abc",
        "redis": "private Redis on 127.0.0.1:6390",
        "processes": {"workers": [11, 12], "nodes": ["demo1-abc", "demo2-abc"], "redis": 10},
    }
    return Summary(parse_rules("10/s"), 30, records, 3.2, 10.0, extra=extra, **kw)


class Checker(HTMLParser):
    """Every element closed in order (XHTML-like); the tags seen."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.stack.append(tag)
        self.tags.append(tag)

    def handle_startendtag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()


def check_page(page: str) -> ET.Element:
    checker = Checker()
    checker.feed(page)
    checker.close()
    assert not checker.stack, checker.stack
    assert "script" not in checker.tags and "link" not in checker.tags  # nothing to run or fetch
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.startswith("<!DOCTYPE html>\n")
    return ET.fromstring(page.split("\n", 1)[1])  # well-formed XML too


def check_text(path: Path) -> str:
    page = path.read_text(encoding="utf-8")
    check_page(page)
    return page


def test_the_verdict_is_on_admissions_and_body_starts_are_shown() -> None:
    s = summary(flood())
    assert s.ok and s.limits_held
    assert s.windows() == [
        {
            "rule": "10/s",
            "limit": 10,
            "period": 1.0,
            "max_counted": 10,
            "max_starts": 11,
            "ok": True,
        }
    ]
    assert s.pace()["span"] == pytest.approx(2.9) and s.pace()["allowed_span"] == 2.9
    over = summary(flood(over=True))
    assert not over.ok and over.windows()[0]["max_counted"] == 11
    console = Console(width=80, record=True)
    console.print(summary_renderable(s))
    text = console.export_text()
    assert "10/s   at most 10 admissions in any 1s, limit 10: ok" in text, text
    assert "bodies at most 11 in any 1s" in text and "not checked" in text, text


def test_records_without_counted_times_are_checked_at_their_start() -> None:
    old = DemoRecord.parse(json.dumps({"n": 1, "t": 5.0, "waits": 0, "node": "a"}))
    new = DemoRecord.parse(json.dumps({"n": 1, "t": 5.0, "counted": 4.9, "node": "a", "pid": 7}))
    assert (old.at, old.counted, old.pid) == (5.0, None, None)
    assert (new.at, new.counted, new.pid, new.waits) == (4.9, 4.9, 7, 0)


def test_report_of_a_run() -> None:
    page = render(summary(flood(hostile=True)), generated=1000.0)
    root = check_page(page)
    assert HOSTILE not in page and "<script" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;@host" in page
    svgs = {svg.get("class"): svg for svg in root.iter(f"{SVG}svg")}
    assert set(svgs) == {"rates", "nodes", "waits", "pace"}
    # per second from the first admission: 10 at once, then 10 a second (bodies alike)
    bars = [
        "".join(r.itertext()) for r in svgs["rates"].iter(f"{SVG}rect") if r.get("class") == "bar"
    ]
    assert bars == [
        f"+{k}s: {what} 10" for k in range(3) for what in ("admissions counted", "body starts")
    ]
    ceilings = [c.get("data-name") for c in svgs["rates"].iter(f"{SVG}line") if c.get("class")]
    assert ceilings == ["10/s: at most 10"]
    tips = ["".join(t.itertext()) for t in svgs["nodes"].iter(f"{SVG}title")]
    assert HOSTILE in tips  # the text itself, escaped in the file (cut short in the legend)
    waits = [r for r in svgs["waits"].iter(f"{SVG}rect") if r.get("class") == "bar"]
    assert ["".join(r.itertext()) for r in waits] == ["0: tasks 10", "1: tasks 20"]
    lines = [line.get("data-name") for line in svgs["pace"].iter(f"{SVG}polyline")]
    assert lines == ["achieved (admissions counted)", "fastest allowed"]
    assert "ok: every task ran" in page
    assert "10.00/s over 2.9s" in page  # achieved = allowed
    assert "private Redis on 127.0.0.1:6390 (pid 10)" in page
    assert "101, 103" in page  # the pool processes seen on the hostile node


@pytest.mark.parametrize(
    ("kw", "verdict"),
    [
        ({"interrupted": True}, "interrupted: 0 of 30 tasks had started"),
        (
            {"error": "worker demo1 exited with code <1>"},
            "failed: worker demo1 exited with code &lt;1&gt;",
        ),
    ],
)
def test_report_of_a_run_that_stopped_early(kw: dict[str, Any], verdict: str) -> None:
    page = render(summary([], **kw))
    check_page(page)
    assert verdict in page and "No task started" in page and "<svg" not in page
    assert "Tasks that did not start" in page and "0, 1, 2" in page


def test_report_paths_are_checked_before_anything_starts(tmp_path: Path) -> None:
    runner = CliRunner()
    for path, why in [
        (tmp_path / "missing" / "run.html", "no folder"),
        (tmp_path, "directory"),
        (tmp_path / "file" / "run.html", "no folder"),
    ]:
        (tmp_path / "file").touch()
        result = runner.invoke(cli, ["demo", "--redis-url", UNREACHABLE, "--report", str(path)])
        assert result.exit_code == 2 and "--report" in result.output, result.output
        assert why in result.output and "cannot reach Redis" not in result.output, result.output
    report = tmp_path / "run.html"  # a run that fails at once still writes its report
    result = runner.invoke(cli, ["demo", "--redis-url", UNREACHABLE, "--report", str(report)])
    assert result.exit_code == 3 and f"report written to {report}" in result.output, result.output
    assert "failed: cannot reach Redis at redis://127.0.0.1:1/0" in check_text(report)


def test_counted_at_is_when_the_rules_counted_the_admission() -> None:
    """A booking's slot start (not when it was claimed), else the decision's time; the
    earliest over the limits; None when only a concurrency cap admitted the call."""
    cap = LimitSpec("queue", "queue", LimitConfig((), "sliding_log", concurrency=2), "q")
    task = LimitSpec("task", "task", LimitConfig(parse_rules("10/s"), "sliding_log"), "t")
    key = LimitSpec("key", "api", LimitConfig(parse_rules("5/s"), "fixed_window"), "k")

    def held(spec: LimitSpec, now: float, start: float | None = None) -> Any:
        slot = None if start is None else Slot(round(start * 1e6), round(start * 1e6) + 20_000)
        return (None, spec, Decision(True, 0.0, 0, 0.0, None, None, now, slot))

    booked = WaitState(waits=1, slots={"k": [100_000_000, 100_020_000]})
    cases = [
        (booked, [held(cap, 99.0, 99.0), held(task, 100.012, 100.0)], 100.0),
        (WaitState(), [held(task, 100.5, 100.5), held(key, 100.4)], 100.4),
        (WaitState(), [held(cap, 99.0, 99.0)], None),
    ]
    seen: list[Any] = []

    def receive(sender: Any = None, counted_at: Any = None, **_: Any) -> None:
        seen.append(counted_at)

    signals.task_admitted.connect(receive, weak=False)
    try:
        for state, decisions, expected in cases:
            specs = [spec for _, spec, _ in decisions]
            request = SimpleNamespace(id="1", headers={})
            call = Call(Task(), request, (), {}, specs, 1, state)
            Gate._admitted(object.__new__(Gate), call, Outcome(True, held=decisions))
            assert seen.pop() == expected
    finally:
        signals.task_admitted.disconnect(receive)
