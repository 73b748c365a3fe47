"""``governor plan ... --chart plan.svg``: the SVG file it writes, and its errors (no Redis)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from governor import Rule
from governor.cli import cli
from governor.cli.svg import MAX_BARS, bucket_for, ceiling

SVG = "{http://www.w3.org/2000/svg}"
UNREACHABLE = "redis://127.0.0.1:1/0"


def invoke(*args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "120", "GOVERNOR_REDIS_URL": ""})
    return runner.invoke(cli, list(args), catch_exceptions=False)


def read(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return root


def of_class(root: ET.Element, tag: str, name: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}{tag}") if e.get("class") == name]


def texts(root: ET.Element, name: str) -> list[str]:
    return ["".join(e.itertext()) for e in of_class(root, "text", name)]


def test_chart_of_the_partner_api_batch_per_day(tmp_path: Path) -> None:
    path = tmp_path / "plan.svg"
    result = invoke(
        "--redis-url", UNREACHABLE, "plan", "1/s, 20/m, 200/h, 800/d", "--jobs", "10000",
        "--chart", str(path),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "+12d  +13d            400        10000" in result.stdout  # the text is as before
    assert f"chart written to {path}" in result.stderr
    root = read(path)
    bars = of_class(root, "rect", "bar")
    assert len(bars) == 13  # one per day: 12 days of 800, then 400
    tips = ["".join(b.itertext()) for b in bars]
    assert tips[0] == "+0d: 800 jobs" and tips[-1] == "+12d: 400 jobs"
    heights = [float(b.get("height", "")) for b in bars]
    assert heights[:12] == [heights[0]] * 12 and heights[12] == pytest.approx(heights[0] / 2)
    # the tightest rule's ceiling is drawn at the full bars' top; the others are far above
    lines = of_class(root, "line", "ceiling")
    assert [line.get("data-rule") for line in lines] == ["800/d"]
    assert float(lines[0].get("y1", "")) == pytest.approx(float(bars[0].get("y", "")))
    assert texts(root, "rule") == [
        "1/s: 86,400 (above the chart)",
        "20/m: 28,800 (above the chart)",
        "200/h: 4,800 (above the chart)",
        "800/d: 800",
    ]
    assert texts(root, "title")[0].startswith("10000 jobs under 1/s, 20/m, 200/h, 800/d")
    assert texts(root, "y-label") == ["jobs per day"]
    assert texts(root, "x-label") == ["days after the start"]


def test_chart_per_minute_with_clock_times_and_json(tmp_path: Path) -> None:
    path = tmp_path / "minutes.SVG"
    result = invoke(
        "plan", "10/s, 500/m", "--jobs", "2000", "--start", "2025-06-01T09:00", "--json",
        "--chart", str(path),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)  # stdout stays JSON
    root = read(path)
    bars = of_class(root, "rect", "bar")
    assert len(bars) == int(plan["last_after"] // 60) + 1 == 4
    assert ["".join(b.itertext()) for b in bars][:2] == ["09:00: 500 jobs", "09:01: 500 jobs"]
    assert [line.get("data-rule") for line in of_class(root, "line", "ceiling")] == [
        "10/s",
        "500/m",
    ]
    assert texts(root, "rule") == ["10/s: 600", "500/m: 500"]
    assert texts(root, "x-label") == ["local time, from 2025-06-01 09:00:00"]


def test_buckets_and_ceilings() -> None:
    assert [bucket_for(s).name for s in (0, 179, 180 * 60 - 1, 3 * 86400, 200 * 86400)] == [
        "second",
        "second",
        "minute",
        "hour",
        "week",
    ]
    many = bucket_for(2000 * 86400)
    assert many.name == "2 weeks" and many.plural == "weeks"
    assert 2000 * 86400 // many.size + 1 <= MAX_BARS
    assert ceiling(Rule.parse("5/30s"), 60) == 10
    assert ceiling(Rule.parse("5/30s"), 45) == 10  # 45 s spans parts of two windows
    assert ceiling(Rule.parse("10/m"), 1) == 10
    assert ceiling(Rule.parse("10/m"), 3600, cost=3) == 3 * 60


@pytest.mark.parametrize(
    ("chart", "message"),
    [
        ("plan.png", "only .svg charts are supported"),
        ("plan", "only .svg charts are supported"),
        ("missing/plan.svg", "no folder"),
        (".", "is a directory"),
    ],
)
def test_bad_chart_paths(tmp_path: Path, chart: str, message: str) -> None:
    result = invoke("plan", "5/s", "--jobs", "20", "--chart", str(tmp_path / chart))
    assert result.exit_code == 2
    assert message in result.stderr and "--chart" in result.stderr
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_chart_that_cannot_be_written() -> None:
    result = invoke("plan", "5/s", "--jobs", "20", "--chart", "/proc/plan.svg")
    assert result.exit_code == 2
    assert "cannot write the chart to '/proc/plan.svg'" in result.stderr
    assert result.stdout == ""  # nothing printed before the error
