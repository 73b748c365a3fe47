"""The ``governor`` command line against the suite's real Redis (every test has its own prefix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import click
import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result

from governor import Limiter
from governor.celery import Governor
from governor.cli import cli
from governor.cli.common import GovernorGroup, format_duration, mask_url, parse_duration
from governor.cli.top import Rates
from support.celery_helpers import limits_app
from support.servers import ServerHandle

UNREACHABLE = "redis://127.0.0.1:1/0"


@pytest.fixture
def url(redis_server: ServerHandle) -> str:
    return redis_server.url(0)


def invoke(*args: str, obj: Any = None, input: str | None = None, **env: str) -> Result:
    """Run the CLI in process; unexpected exceptions propagate (so they fail the test)."""
    runner = CliRunner(env={"COLUMNS": "120", "GOVERNOR_REDIS_URL": "", **env})
    return runner.invoke(cli, list(args), obj=obj, input=input, catch_exceptions=False)


def gov(url: str, prefix: str, *args: str, **kw: Any) -> Result:
    return invoke("--redis-url", url, "--prefix", prefix, *args, **kw)


def data(result: Result) -> Any:
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def make_app(url: str, prefix: str) -> Celery:
    """A Celery app with a queue quota, a whole-task limit and a per-key limit."""
    return limits_app(url, prefix, "cli", __name__)


# -- plan (offline) ---------------------------------------------------------------------------


def test_plan_text_needs_no_redis() -> None:
    result = invoke(
        "--redis-url", UNREACHABLE, "plan", "1/s, 20/m, 200/h, 800/d", "--jobs", "10000"
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "last job   can start after 12d 1h 9m 19s (12.05 days)" in out
    assert "at most 800 jobs a day (rule 800/d): 10000 jobs = 12.5 days of quota" in out
    assert "+0h   +4h             200          800" in out  # per hour, first day
    assert "+0d  +12d            800         9600" in out  # per day
    assert "+12d  +13d            400        10000" in out


def test_plan_json_and_clock_times() -> None:
    result = invoke("plan", "1/s, 20/m, 200/h, 800/d", "--jobs", "1000", "--json")
    p = data(result)
    assert p["last_after"] == 86400 + 9 * 60 + 19
    assert p["per_day"] == [{"day": 0, "jobs": 800}, {"day": 1, "jobs": 200}]
    assert p["per_hour"][:2] == [{"hour": 0, "jobs": 200}, {"hour": 1, "jobs": 200}]
    assert p["tightest_rule"] == "800/d" and p["start"] is None

    p = data(invoke("plan", "2/s", "--jobs", "5", "--start", "2025-06-01T09:00Z", "--json"))
    assert p["start"] == 1748768400.0 and p["last_at"] == 1748768402.0
    assert p["last_at_iso"].startswith("2025-06-01")

    p = data(invoke("plan", "2/s", "--jobs", "3", "--now", "--schedule", "--json"))
    assert p["starts_after"] == [0.0, 0.0, 1.0] and p["start"] > 1.7e9

    text = invoke("plan", "10/m", "--jobs", "12", "--start", "2025-06-01T09:00", "--schedule")
    assert text.exit_code == 0
    assert "jobs per minute (first hour)" in text.stdout
    assert "job 12: 2025-06-01 09:01:06.000" in text.stdout  # waiting jobs keep W/N apart


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["1/x", "--jobs", "3"], "unknown unit 'x'"),
        (["1/s", "--jobs", "3", "--cost", "2"], "can never start under rule '1/s'"),
        (["1/s", "--jobs", "0"], "--jobs"),
        (["1/s", "--jobs", "3", "--start", "soon"], "is not a time"),
        (["1/s", "--jobs", "3", "--start", "2025-01-01", "--now"], "not both"),
        (["30000/m", "--jobs", "5"], "the sliding log allows at most 20000"),
    ],
)
def test_plan_bad_input(args: list[str], message: str) -> None:
    result = invoke("plan", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    no_traceback(result)


# -- without an app: what Redis holds -----------------------------------------------------------


def test_status_without_an_app_lists_what_redis_holds(
    url: str, prefix: str, r: redis.Redis
) -> None:
    assert "Nothing found" in gov(url, prefix, "status").stdout
    api = Limiter(r, "5/s", name="partner-api", prefix=prefix)
    api.acquire("c1")
    api.block("c2", 3600, "runaway")
    Limiter(r, "1/s", name="queue", prefix=prefix).acquire("emails")

    s = data(gov(url, prefix, "status", "--json"))
    assert s["source"] == "redis" and s["app"] is None and s["prefix"] == prefix
    by_name = {lim["name"]: lim for lim in s["limits"]}
    assert set(by_name) == {"partner-api", "queue"}
    api_state = by_name["partner-api"]
    assert api_state["rules"] is None and api_state["subject_count"] == 2
    first = api_state["subjects"][0]  # blocked subjects first
    assert (first["subject"], first["blocked"], first["block_reason"]) == ("c2", True, "runaway")
    assert 3590 < first["blocked_for"] <= 3600

    text = gov(url, prefix, "status").stdout
    assert "partner-api" in text
    assert "BLOCKED 1h: runaway" in text or "BLOCKED 59m 59s: runaway" in text
    assert "-A APP adds rules" in text


def test_inspect_with_rules(url: str, prefix: str, r: redis.Redis) -> None:
    api = Limiter(r, "2/s, 10/m", name="partner-api", prefix=prefix)
    api.acquire("c1")
    i = data(gov(url, prefix, "inspect", "partner-api", "c1", "--rules", "2/s, 10/m", "--json"))
    assert i["admits_now"] is True and i["blocked"] is False and i["booked"] == 0
    assert [(x["rule"], x["used"], x["remaining"]) for x in i["rules"]] == [
        ("2/s", 1, 1),
        ("10/m", 1, 9),
    ]
    assert i["rules"][0]["next_free_in"] == 0.0 and 0 < i["rules"][1]["fully_free_in"] <= 60

    api.acquire("c1")
    api.reserve("c1")  # full: the third is booked a second later
    full = gov(url, prefix, "inspect", "partner-api", "c1", "--rules", "2/s, 10/m")
    assert full.exit_code == 1  # denied now
    assert "bookings: held up to" in full.stdout and "admits one more now: no" in full.stdout
    booked = data(
        gov(url, prefix, "inspect", "partner-api", "c1", "--rules", "2/s, 10/m", "--json")
    )
    assert booked["booked"] == 1 and 0.5 < booked["booked_for"] <= 1.1
    assert "2/s" in full.stdout and "10/m" in full.stdout


def test_inspect_without_rules_says_how_to_give_them(url: str, prefix: str) -> None:
    result = gov(url, prefix, "inspect", "partner-api", "c1")
    assert result.exit_code == 2
    assert "--rules" in result.stderr and "-A" in result.stderr
    no_traceback(result)


def test_block_unblock(url: str, prefix: str, r: redis.Redis) -> None:
    api = Limiter(r, "5/s", name="partner-api", prefix=prefix)
    result = gov(url, prefix, "block", "partner-api", "c1", "--for", "1h30m", "--reason", "abuse")
    assert result.exit_code == 0 and "Blocked partner-api c1 for 1h 30m" in result.stdout
    usage = api.usage("c1")
    assert usage.blocked == "abuse" and 5390 < usage.blocked_for <= 5400
    assert not api.acquire("c1").allowed

    inspected = gov(url, prefix, "inspect", "partner-api", "c1", "--rules", "5/s")
    assert inspected.exit_code == 1 and "blocked for 1h 30m" in inspected.stdout

    b = data(gov(url, prefix, "block", "partner-api", "c1", "--for", "90s", "--json"))
    assert b["blocked"] is True and b["seconds"] == 90 and b["reason"] == ""
    assert 80 < api.usage("c1").blocked_for <= 90  # replaced the longer block

    u = data(gov(url, prefix, "unblock", "partner-api", "c1", "--json"))
    assert u == {"name": "partner-api", "subject": "c1", "was_blocked": True}
    assert api.acquire("c1").allowed
    assert "was not blocked" in gov(url, prefix, "unblock", "partner-api", "c1").stdout


@pytest.mark.parametrize("duration", ["2x", "0s", "h", "1h-5m", ""])
def test_bad_duration(url: str, prefix: str, duration: str) -> None:
    result = gov(url, prefix, "block", "partner-api", "c1", "--for", duration)
    assert result.exit_code == 2
    assert "Invalid value for '--for'" in result.stderr
    no_traceback(result)


def test_reset_asks_first(url: str, prefix: str, r: redis.Redis) -> None:
    api = Limiter(r, "5/s, 100/h", name="partner-api", prefix=prefix)
    for _ in range(3):
        api.acquire("c1")
    api.block("c1", 60)

    refused = gov(url, prefix, "reset", "partner-api", "c1", input="n\n")
    assert refused.exit_code == 1 and "Forget everything counted" in refused.output
    assert api.usage("c1").rules[1].used == 3

    accepted = gov(url, prefix, "reset", "partner-api", "c1", input="y\n")
    assert accepted.exit_code == 0 and "Reset partner-api c1." in accepted.stdout
    usage = api.usage("c1")
    assert usage.rules[1].used == 0 and usage.blocked is not None  # a block stays

    api.unblock("c1")
    api.acquire("c1")
    j = data(gov(url, prefix, "reset", "partner-api", "c1", "--yes", "--json"))
    assert j == {"name": "partner-api", "subject": "c1", "reset": True, "keys": 1}
    assert api.usage("c1").rules[1].used == 0


def test_a_name_redis_never_saw_is_pointed_out(url: str, prefix: str, r: redis.Redis) -> None:
    """Without -A governor cannot check limit names: a typo is pointed out, not silently used."""
    Limiter(r, "5/s", name="partner-api", prefix=prefix).acquire("c1")
    typo = gov(url, prefix, "block", "partner-apl", "c1", "--for", "5s")
    assert typo.exit_code == 0 and "Redis holds nothing for limit 'partner-apl'" in typo.stderr
    known = gov(url, prefix, "block", "partner-api", "c2", "--for", "5s")
    assert known.exit_code == 0 and "Warning" not in known.stderr
    nothing = gov(url, prefix, "reset", "partner-apx", "c1", "--yes")
    assert "Nothing to reset" in nothing.stdout and "Warning" in nothing.stderr


# -- Redis trouble ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["inspect", "partner-api", "c1", "--rules", "1/s"],
        ["block", "partner-api", "c1", "--for", "1h"],
        ["unblock", "partner-api", "c1"],
        ["reset", "partner-api", "c1", "--yes"],
        ["top", "--once"],
    ],
)
def test_unreachable_redis_exits_3(args: list[str]) -> None:
    result = invoke("--redis-url", UNREACHABLE, *args)
    assert result.exit_code == 3, result.output
    assert "Error: cannot reach Redis at redis://127.0.0.1:1/0" in result.stderr
    assert "GOVERNOR_REDIS_URL" in result.stderr
    no_traceback(result)


def test_bad_redis_url_and_masked_password() -> None:
    result = invoke("--redis-url", "http://localhost:6379", "status")
    assert result.exit_code == 2 and "bad Redis URL 'http://localhost:6379'" in result.stderr
    no_traceback(result)
    result = invoke("--redis-url", "redis://:s3cret@127.0.0.1:1/0", "status")
    assert result.exit_code == 3 and "s3cret" not in result.output and "***" in result.stderr
    assert mask_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"


def test_a_bad_database_in_the_redis_url(url: str) -> None:
    base = url.rsplit("/", 1)[0]
    word = invoke("--redis-url", f"{base}/abc", "status")
    assert word.exit_code == 2 and "the database must be a number, got 'abc'" in word.stderr
    far = invoke("--redis-url", f"{base}/99", "status")
    assert far.exit_code == 2 and "no such database" in far.stderr
    no_traceback(far)


def test_redis_url_from_the_environment(url: str, prefix: str, r: redis.Redis) -> None:
    Limiter(r, "1/s", name="from-env", prefix=prefix).acquire("x")
    result = invoke("--prefix", prefix, "status", "--json", GOVERNOR_REDIS_URL=url)
    assert [lim["name"] for lim in data(result)["limits"]] == ["from-env"]
    assert data(invoke("status", "--json", GOVERNOR_REDIS_URL=url, GOVERNOR_PREFIX=prefix))[
        "limits"
    ]


# -- with a Celery app ------------------------------------------------------------------------


def test_status_with_an_app(url: str, prefix: str, r: redis.Redis) -> None:
    app = make_app(url, prefix)
    Limiter(r, "10/s", name="queue", prefix=prefix).acquire("emails")
    partner = Limiter(r, "5/s, 200/h", name="partner-api", prefix=prefix)
    for customer in ("c1", "c2", "c2"):
        partner.acquire(customer)
    partner.block("c3", 600, "manual")

    # the app gives the Redis URL and the prefix: no --redis-url, even with another in the env
    s = data(invoke("status", "--json", obj=app, GOVERNOR_REDIS_URL=UNREACHABLE))
    assert s["source"] == "app" and s["prefix"] == prefix and s["app"] == app.main
    limits = {lim["label"]: lim for lim in s["limits"]}
    assert list(limits) == ["queue:emails", "task:cli.sync", "partner-api"]
    queue = limits["queue:emails"]
    assert queue["rules"] == ["10/s"] and queue["parked"] == 0
    assert queue["subjects"][0]["rules"][0]["used"] == 1
    assert limits["task:cli.sync"]["subjects"][0]["rules"][0]["limit"] == 3
    keyed = limits["partner-api"]
    assert keyed["kind"] == "key" and keyed["tasks"] == [f"{__name__}.call_partner"]
    assert [x["subject"] for x in keyed["subjects"]] == ["c3", "c2", "c1"]  # blocked, fullest
    assert keyed["subjects"][1]["rules"][0]["used"] == 2

    capped = data(invoke("status", "--json", "--subjects", "1", obj=app))
    assert capped["limits"][2]["subject_count"] == 3 and len(capped["limits"][2]["subjects"]) == 1

    text = invoke("status", obj=app).stdout
    assert f"Limits of app '{app.main}'" in text
    assert "queue:emails  10/s  sliding_log" in text
    assert "partner-api  5/s, 200/h  sliding_log  per key" in text
    assert "BLOCKED 10m: manual" in text or "BLOCKED 9m 59s: manual" in text


def test_inspect_and_block_with_an_app(url: str, prefix: str, r: redis.Redis) -> None:
    app = make_app(url, prefix)
    Limiter(r, "5/s, 200/h", name="partner-api", prefix=prefix).acquire("c1")
    i = data(invoke("inspect", "partner-api", "c1", "--json", obj=app))  # rules from the app
    assert i["label"] == "partner-api" and [x["used"] for x in i["rules"]] == [1, 1]
    assert data(invoke("inspect", "queue", "emails", "--json", obj=app))["rules"][0]["limit"] == 10

    unknown = invoke("inspect", "partner", "c1", obj=app)
    assert unknown.exit_code == 2
    assert "unknown limit name 'partner'" in unknown.stderr
    assert "partner-api, queue (emails), task (cli.sync)" in unknown.stderr
    no_traceback(unknown)
    other_queue = invoke("inspect", "queue", "sms", obj=app)
    assert other_queue.exit_code == 2 and "queue 'sms' has no limit" in other_queue.stderr
    # a typo must not block a limiter nobody uses
    assert invoke("block", "partnr-api", "c1", "--for", "1h", obj=app).exit_code == 2
    assert invoke("block", "partner-api", "c1", "--for", "1h", obj=app).exit_code == 0
    assert invoke("inspect", "partner-api", "c1", obj=app).exit_code == 1  # blocked


def test_top_once_and_frames(url: str, prefix: str, r: redis.Redis) -> None:
    app = make_app(url, prefix)
    Limiter(r, "10/s", name="queue", prefix=prefix).acquire("emails")
    once = invoke("top", "--once", obj=app)
    assert once.exit_code == 0, once.output
    assert once.stdout.count("governor top") == 1
    assert "queue:emails" in once.stdout and "1/10" in once.stdout
    assert "task:cli.sync" in once.stdout and "partner-api" in once.stdout
    assert "(admissions + bookings - expiries)" in once.stdout

    frames = invoke("top", "--frames", "2", "--interval", "0.05", obj=app)
    assert frames.exit_code == 0 and frames.stdout.count("governor top") == 2
    assert "0.00" in frames.stdout  # the second frame has rates
    assert "rules unknown" in invoke("--redis-url", url, "--prefix", prefix, "top", "--once").stdout

    lines = invoke("top", "--json", "--frames", "2", "--interval", "0.05", obj=app)
    assert lines.exit_code == 0, lines.output
    first, second = (json.loads(line) for line in lines.stdout.splitlines())
    emails = next(lim for lim in second["limits"] if lim["label"] == "queue:emails")
    assert emails["subjects"][0]["rules"][0]["used"] == 1 and emails["subjects"][0]["rate"] == 0
    assert first["limits"][0]["subjects"][0]["rate"] is None  # no rate on the first frame


def test_rates_come_from_successive_samples() -> None:
    rates = Rates()
    assert rates.update("queue:emails", "emails", now=10.0, used=4) is None
    assert rates.update("queue:emails", "emails", now=12.0, used=10) == 3.0
    assert rates.update("queue:emails", "emails", now=13.0, used=8) == -2.0  # expiries
    assert rates.update("queue:emails", "emails", now=13.0, used=9) is None  # no time passed


def test_app_from_a_module(
    url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"cliproj_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{module}.py").write_text(APP_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CLI_TEST_REDIS_URL", url)
    monkeypatch.setenv("CLI_TEST_PREFIX", prefix)
    for spec in (module, f"{module}:app"):
        s = data(invoke("-A", spec, "status", "--json"))
        assert [lim["label"] for lim in s["limits"]] == ["queue:emails", "partner-api"]

    no_attr = invoke("-A", f"{module}:nope", "status")
    assert no_attr.exit_code == 2 and f"module {module!r} has no attribute 'nope'" in no_attr.stderr
    missing = invoke("-A", "no_such_module_xyz", "status")
    assert missing.exit_code == 2 and "no module named 'no_such_module_xyz'" in missing.stderr
    no_traceback(missing)
    (tmp_path / f"{module}_bad.py").write_text("raise RuntimeError('boom')\n")
    broken = invoke("-A", f"{module}_bad", "status")
    assert broken.exit_code == 2 and "RuntimeError: boom" in broken.stderr
    no_traceback(broken)


APP_MODULE = textwrap.dedent(
    """
    import os

    from celery import Celery

    from governor.celery import Governor

    app = Celery("cliproj", set_as_current=False)
    app.conf.governor_redis_url = os.environ["CLI_TEST_REDIS_URL"]
    app.conf.governor_prefix = os.environ["CLI_TEST_PREFIX"]
    app.conf.governor_queues = {"emails": "10/s"}
    governor = Governor(app)


    @governor.task(
        "5/m", key=lambda customer_id, **_: customer_id, limit_name="partner-api", shared=False
    )
    def call_partner(customer_id):
        pass
    """
)


@pytest.mark.compat
def test_celery_sub_command(url: str, prefix: str, tmp_path: Path, r: redis.Redis) -> None:
    """``celery -A proj governor status``: through Celery's plugin entry point."""
    (tmp_path / "cliproj.py").write_text(APP_MODULE)
    # a booking an hour ahead keeps the subject's key while a loaded machine starts celery
    Limiter(r, "5/s", name="partner-api", prefix=prefix).reserve(
        "c1", not_before=time.time() + 3600
    )
    env = {
        **os.environ,
        "CLI_TEST_REDIS_URL": url,
        "CLI_TEST_PREFIX": prefix,
        "PYTHONPATH": str(tmp_path),
    }
    env.pop("GOVERNOR_REDIS_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "cliproj", "governor", "status", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["app"] == "cliproj" and s["prefix"] == prefix
    keyed = next(lim for lim in s["limits"] if lim["label"] == "partner-api")
    assert [x["subject"] for x in keyed["subjects"]] == ["c1"]


def test_console_script_main() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "governor.cli", "plan", "5/s", "--jobs", "11", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["last_after"] == 2.0


# -- the command group and helpers ------------------------------------------------------------


def test_help_and_unknown_command() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for name in ("status", "inspect", "block", "unblock", "reset", "top", "plan"):
        assert name in result.stdout
    assert invoke("nope").exit_code == 2


def test_a_command_whose_dependency_is_missing_says_so() -> None:
    @click.group(cls=GovernorGroup, lazy={"demo": "no_such_module:demo"})
    def group() -> None: ...

    result = CliRunner().invoke(group, ["demo"])
    assert result.exit_code == 2 and "needs" in result.output and "not installed" in result.output


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("45", 45)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration("500ms") == 0.5
    assert format_duration(5400) == "1h 30m"
    assert format_duration(float("inf")) == "never"


def test_submit_books_a_batch(redis_server: Any, tmp_path: Any) -> None:
    """`governor submit` with an app: every call booked and enqueued (nothing runs here)."""
    import uuid as _uuid

    from celery import Celery

    base = redis_server.url(0).rsplit("/", 1)[0]
    queue = f"sub-{_uuid.uuid4().hex[:6]}"
    app = Celery(f"sub-{_uuid.uuid4().hex[:6]}", broker=f"{base}/1")
    app.conf.update(
        governor_redis_url=f"{base}/2",
        governor_prefix=f"gt{_uuid.uuid4().hex[:8]}",
        governor_queues={queue: "2/s"},
        task_default_queue=queue,
    )
    Governor(app)

    @app.task(name="cli.sub", shared=False)
    def sub(n: int) -> None: ...

    calls = tmp_path / "calls.jsonl"
    calls.write_text("\n".join(json.dumps([n]) for n in range(5)) + "\n")
    result = CliRunner().invoke(cli, ["submit", "cli.sub", str(calls), "--json"], obj=app)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["calls"] == 5 and summary["booked"] == 5
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"argz": 1}\n')
    result = CliRunner().invoke(cli, ["submit", "cli.sub", str(bad)], obj=app)
    assert result.exit_code == 2 and "line 1" in result.output
    result = CliRunner().invoke(cli, ["submit", "cli.nope", str(calls)], obj=app)
    assert result.exit_code == 2 and "unknown task" in result.output
    # a call the task cannot take (line 3 of 3) stops the batch before anything is sent
    broker = redis.Redis.from_url(f"{base}/1")
    queued = broker.llen(queue)
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("[1]\n[2]\n[]\n")
    result = CliRunner().invoke(cli, ["submit", "cli.sub", str(wrong)], obj=app)
    assert result.exit_code == 2, result.output
    assert "line 3 of CALLS" in result.output and "Nothing was sent" in result.output
    assert "Traceback" not in result.output and broker.llen(queue) == queued
