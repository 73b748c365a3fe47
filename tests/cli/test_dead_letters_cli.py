"""``governor dead-letters`` and the dead letters in ``governor status``, against the suite's
real Redis (each test has its own prefix)."""

from __future__ import annotations

import json
from typing import Any

import redis
from click.testing import CliRunner, Result

from governor.celery.waiting import dead_letters, parking
from governor.cli import cli
from support.celery_helpers import limits_app
from support.servers import ServerHandle

T = 1_800_000_000.0


def gov(url: str, prefix: str, *args: str, obj: Any = None, input: str | None = None) -> Result:
    runner = CliRunner(env={"COLUMNS": "160", "GOVERNOR_REDIS_URL": ""})
    head = [] if obj is not None else ["--redis-url", url, "--prefix", prefix]
    return runner.invoke(cli, [*head, *args], obj=obj, input=input, catch_exceptions=False)


def letters(r: redis.Redis, prefix: str) -> list[dead_letters.DeadLetter]:
    envelope = json.dumps({"ct": "application/json", "task": "proj.report", "body": "{"})
    return [
        dead_letters.put(r, prefix, "parked", "p1", envelope, "unreadable: JSONDecodeError", now=T),
        dead_letters.put(r, prefix, "fair:queue:reports", "m1", "not-json", "unreadable", now=T),
        dead_letters.put(r, prefix, "cap:queue:emails", "h:0", b"\xff", "unreadable", now=T),
    ]


def test_list_and_show(redis_server: ServerHandle, r: redis.Redis, prefix: str) -> None:
    url = redis_server.url(0)
    assert gov(url, prefix, "dead-letters", "list").output.strip() == "No dead letters."
    made = letters(r, prefix)
    shown = gov(url, prefix, "dead-letters", "list")
    assert shown.exit_code == 0
    for d in made:
        assert d.id[:10] in shown.output and d.source in shown.output
    assert "proj.report" in shown.output
    listed = json.loads(gov(url, prefix, "dead-letters", "list", "--json", "--limit", "2").stdout)
    assert listed["count"] == 3 and len(listed["letters"]) == 2
    assert listed["letters"][0]["kind"] == "parked"
    one = gov(url, prefix, "dead-letters", "show", made[0].id[:8])
    assert one.exit_code == 0 and "reason: unreadable: JSONDecodeError" in one.output
    assert '"task": "proj.report"' in one.output
    raw = json.loads(gov(url, prefix, "dead-letters", "show", made[2].id, "--json").stdout)
    assert raw["text"] is None and raw["text_hex"] == "ff"
    missing = gov(url, prefix, "dead-letters", "show", "zzzz")
    assert missing.exit_code == 2 and "no dead letter 'zzzz'" in missing.output


def test_status_counts_them(redis_server: ServerHandle, r: redis.Redis, prefix: str) -> None:
    url = redis_server.url(0)
    assert "dead letters" not in gov(url, prefix, "status").output
    letters(r, prefix)
    shown = gov(url, prefix, "status")
    assert "3 dead letters" in shown.output and "governor dead-letters list" in shown.output
    assert json.loads(gov(url, prefix, "status", "--json").stdout)["dead_letters"] == 3


def test_redrive_and_drop(redis_server: ServerHandle, r: redis.Redis, prefix: str) -> None:
    url = redis_server.url(0)
    _, fair, cap = letters(r, prefix)
    asked = gov(url, prefix, "dead-letters", "drop", cap.id, input="n\n")
    assert asked.exit_code == 1 and dead_letters.count(r, prefix) == 3  # aborted
    both = gov(url, prefix, "dead-letters", "drop", "--all", cap.id)
    assert both.exit_code == 2 and "not both" in both.output
    assert gov(url, prefix, "dead-letters", "drop").exit_code == 2
    dropped = gov(url, prefix, "dead-letters", "drop", cap.id, "--yes")
    assert dropped.exit_code == 0 and "Dropped 1" in dropped.output
    again = json.loads(gov(url, prefix, "dead-letters", "redrive", "--all", "-y", "--json").stdout)
    assert sorted(x["parked"] for x in again["redriven"]) == sorted(["p1", f"r~{fair.id}"])
    assert dead_letters.count(r, prefix) == 0
    assert parking.parked_count(r, prefix) == 2  # back to wait: a releaser publishes them


def test_redrive_refuses_when_nothing_would_publish(redis_server: ServerHandle) -> None:
    prefix = "gtnopark"
    app = limits_app(redis_server.url(0), prefix, "dl", __name__)
    app.conf.governor_park_after = False
    client = redis.Redis.from_url(redis_server.url(0))
    letter = dead_letters.put(client, prefix, "parked", "p", "{}", "unreadable")
    try:
        refused = gov("", "", "dead-letters", "redrive", letter.id, "-y", obj=app)
        assert refused.exit_code == 2 and "does not park" in refused.output
    finally:
        dead_letters.drop(client, prefix, [letter.id])
