"""Who may change limits: anyone who can write governor's Redis. ``governor limits set`` checks
the label against the app's limits with ``-A`` (exit 2), warns without it, and ``limits show``
marks a live limit no configured limit has (stored, listed, used by no worker)."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner, Result

from governor.cli import cli
from support.celery_helpers import limits_app
from support.servers import ServerHandle


def run(*args: str, obj: Any = None) -> Result:
    runner = CliRunner(env={"COLUMNS": "160", "GOVERNOR_REDIS_URL": ""})
    return runner.invoke(cli, list(args), obj=obj, catch_exceptions=False)


def test_labels_are_checked_with_an_app_and_warned_about_without(
    redis_server: ServerHandle, prefix: str
) -> None:
    app = limits_app(redis_server.url(0), prefix, "live", __name__)
    unknown = run("limits", "set", "queue:nosuch", "5/s", obj=app)
    assert unknown.exit_code == 2 and "has no limit 'queue:nosuch'" in unknown.stderr
    assert "queue:emails" in unknown.stderr  # what it has

    bare = ["--redis-url", redis_server.url(0), "--prefix", prefix, "limits", "set"]
    stored = run(*bare, "queue:nosuch", "5/s")
    assert stored.exit_code == 0, stored.output
    assert "Warning: without -A, 'queue:nosuch' is not checked" in stored.stderr
    assert "no worker uses it" in stored.stderr and "Pass -A APP" in stored.stderr
    keyed = run(*bare, "nosuch-key", "5/s")
    assert keyed.exit_code == 0 and "taken as a per-key limit's name" in keyed.stderr
    assert run(*bare, "queue:emails", "20/s").exit_code == 0

    text = run("limits", "show", obj=app).stdout
    assert "queue:nosuch: 5/s  [app" in text and "has no such limit: no worker uses it" in text
    assert "queue:emails: 20/s  [configured: 10/s]" in text
    listed = json.loads(run("limits", "show", "--json", obj=app).stdout)
    rows = {row["label"]: row for row in listed}
    assert rows["queue:nosuch"]["known"] is False and rows["queue:emails"]["known"] is True
    assert rows["nosuch-key"]["known"] is False
    plain = json.loads(run(*bare[:4], "limits", "show", "--json").stdout)
    assert {row["known"] for row in plain} == {None}  # without an app nothing is known
