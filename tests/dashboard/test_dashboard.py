"""``governor dashboard``'s server and JSON against the suite's real Redis (no browser: the
browser tests are in test_dashboard_browser.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import redis

from governor import Limiter
from governor.cli.common import State
from governor.dashboard.server import Dashboard
from governor.embedded import EmbeddedRedis
from support.celery_helpers import wait_for
from support.dashboard_helpers import get, limits_app, post, state_of
from support.servers import ServerHandle


def test_overview_search_paging_and_inspect(
    redis_server: ServerHandle, prefix: str, r: redis.Redis
) -> None:
    app = limits_app(redis_server.url(0), prefix)
    Limiter(r, "10/s", name="queue", prefix=prefix).acquire("emails")
    partner = Limiter(r, "5/s, 200/h", name="partner-api", prefix=prefix)
    for customer in ("c1", "c2", "c2"):
        partner.acquire(customer)
    partner.block("c3", 600, "runaway client")
    with Dashboard(state_of(app), port=0, interval=0.2) as board:
        status, data = get(f"{board.url}/api/limits")
        assert status == 200 and data["source"] == "app" and data["error"] is None
        labels = [x["label"] for x in data["limits"]]
        assert labels == ["queue:emails", "task:dash.sync", "partner-api"]
        assert data["summary"] == {"limits": 3, "subjects": 5, "blocked": 1, "paused": 0, "full": 1}
        assert 0 < data["calls"] < 20 and data["writes"] is False
        keyed = data["limits"][2]
        assert [s["subject"] for s in keyed["subjects"]] == ["c3", "c2", "c1"]
        c3 = keyed["subjects"][0]
        assert c3["blocked"] and c3["block_reason"] == "runaway client"
        c2 = keyed["subjects"][1]
        assert c2["rules"][1]["used"] == 2  # 200/h
        # the rate: what the shortest rule (5/s) counts, per second of its window
        assert c2["rate"] == c2["rules"][0]["used"] / 1.0 and c2["rate_limit"] == 5.0

        found = get(f"{board.url}/api/limits?q=partner")[1]
        assert [x["label"] for x in found["limits"]] == ["partner-api"]
        by_subject = get(f"{board.url}/api/limits?q=c2")[1]["limits"]
        assert [s["subject"] for s in by_subject[0]["subjects"]] == ["c2"]
        blocked = get(f"{board.url}/api/limits?blocked=1")[1]["limits"]
        assert [(x["label"], [s["subject"] for s in x["subjects"]]) for x in blocked] == [
            ("partner-api", ["c3"])
        ]
        paged = get(f"{board.url}/api/limits?per=2&page=2")[1]
        assert paged["pages"] == 2 and [x["label"] for x in paged["limits"]] == ["partner-api"]
        assert get(f"{board.url}/api/limits?page=x")[0] == 400

        status, one = get(f"{board.url}/api/inspect?name=partner-api&subject=c2")
        assert status == 200 and one["label"] == "partner-api" and one["rules_text"] == "5/s, 200/h"
        assert [x["used"] for x in one["rules"]] == [2, 2] and one["admits_now"] is True
        # the series grows with each refresh
        series = wait_for(
            lambda: get(f"{board.url}/api/inspect?name=queue&subject=emails")[1]["history"],
            lambda h: len(h) >= 3,
            timeout=5,
        )
        assert len(series) >= 3

        status, page = get(f"{board.url}/inspect?name=partner-api&subject=c3")
        assert status == 200 and 'data-subject="c3"' in page and "writes allowed" not in page


def test_a_limit_page_lists_every_subject_with_pauses_and_live_rules(
    redis_server: ServerHandle, prefix: str, r: redis.Redis
) -> None:
    """The overview shows a few subjects per limit; a limit's page pages through all of them
    (by name, searchable). A pause from upstream feedback shows as such, not as a manual block,
    and a limit set live shows who set it and what the configuration says."""
    from governor.celery.config.live import LiveLimits

    app = limits_app(redis_server.url(0), prefix)
    partner = Limiter(r, "5/s, 200/h", name="partner-api", prefix=prefix)
    for n in range(90):  # fewer than the overview examines: it sees them all
        partner.acquire(f"cust-{n:03d}")
    partner.pause("cust-007", 600, "HTTP 429")
    partner.block("cust-008", 600, "by hand")
    LiveLimits(r, prefix).set("queue:emails", {"rules": "2/s"}, by="ops-alice")
    with Dashboard(state_of(app), port=0, interval=0.2) as board:
        data = get(f"{board.url}/api/limits")[1]
        assert data["summary"]["paused"] == 1 and data["summary"]["blocked"] == 1
        emails, _, keyed = data["limits"]
        assert emails["rules"] == ["2/s"] and emails["live"]["by"] == "ops-alice"
        assert emails["live"]["configured"] == "10/s" and emails["live"]["at"] > 0
        assert keyed["live"] is None and len(keyed["subjects"]) == 5  # the overview shows 5
        paused = keyed["subjects"][0]
        assert (paused["subject"], paused["paused"], paused["block_reason"]) == (
            "cust-007", True, "HTTP 429"
        )  # fmt: skip
        assert keyed["subjects"][1]["paused"] is False  # cust-008: blocked by hand

        status, page1 = get(f"{board.url}/api/limit?label=partner-api&per=40")
        assert status == 200 and (page1["subject_count"], page1["pages"]) == (90, 3)
        names = [s["subject"] for s in page1["subjects"]]
        assert names == [f"cust-{n:03d}" for n in range(40)]  # by name
        assert (page1["paused"], page1["blocked"]) == (1, 1)
        page3 = get(f"{board.url}/api/limit?label=partner-api&per=40&page=3")[1]
        assert [s["subject"] for s in page3["subjects"]] == [f"cust-{n:03d}" for n in range(80, 90)]
        found = get(f"{board.url}/api/limit?label=partner-api&q=-01")[1]
        assert found["matched"] == 10 and found["subjects"][0]["rules"][1]["used"] == 1
        one = get(f"{board.url}/api/limit?label=queue:emails")[1]
        assert [s["subject"] for s in one["subjects"]] == ["emails"] and one["live"] is not None
        status, html = get(f"{board.url}/limit?label=partner-api")
        assert status == 200 and 'data-label="partner-api"' in html
        status, missing = get(f"{board.url}/api/limit?label=nope")
        assert status == 404 and "unknown limit 'nope'" in missing["error"]
        status, html = get(f"{board.url}/limit?label=%3Cscript%3E")
        assert status == 404 and "<script>" not in html and "Traceback" not in html
    with Dashboard(state_of(app), port=0, interval=0.2, examine=10) as board:
        overview = get(f"{board.url}/api/limits")[1]["limits"][2]
        assert overview["subject_count"] == 10 and overview["subject_count_capped"] is True
        every = get(f"{board.url}/api/limit?label=partner-api&per=200")[1]
        assert every["subject_count"] == 90 and len(every["subjects"]) == 90  # past the 10


def test_bad_input_gives_a_message_not_a_traceback(redis_server: ServerHandle, prefix: str) -> None:
    app = limits_app(redis_server.url(0), prefix)
    with Dashboard(state_of(app), port=0, interval=0.5) as board:
        status, page = get(f"{board.url}/inspect?name=nope&subject=x")
        assert status == 404 and "unknown limit name &#39;nope&#39;" in page
        assert "Traceback" not in page and 'id="problem"' in page
        status, data = get(f"{board.url}/api/inspect?name=nope&subject=x")
        assert status == 404 and "unknown limit name 'nope'" in data["error"]
        status, data = get(f"{board.url}/api/inspect?name=queue&subject=sms")
        assert status == 404 and "queue 'sms' has no limit" in data["error"]
        status, page = get(f"{board.url}/inspect?name=queue")
        assert status == 400 and "missing &#39;subject&#39;" in page
        assert get(f"{board.url}/no/such/page")[0] == 404


def test_without_an_app_the_limits_found_in_redis(
    redis_server: ServerHandle, prefix: str, r: redis.Redis
) -> None:
    Limiter(r, "5/s", name="api", prefix=prefix).acquire("k1")
    state = State(redis_url=redis_server.url(0), prefix=prefix)
    with Dashboard(state, port=0, interval=0.5) as board:
        data = get(f"{board.url}/api/limits")[1]
        assert data["source"] == "redis"
        assert [(x["label"], x["kind"], x["rules"]) for x in data["limits"]] == [
            ("api", "found", None)
        ]
        status, one = get(f"{board.url}/api/inspect?name=api&subject=k1")
        assert status == 200 and one["rules"] == [] and one["algorithm"] == "sliding_log"
        status, data = get(f"{board.url}/api/inspect?name=apx&subject=k1")
        assert status == 404 and "Redis holds nothing for it" in data["error"]


def test_writes_only_with_allow_writes(
    redis_server: ServerHandle, prefix: str, r: redis.Redis
) -> None:
    app = limits_app(redis_server.url(0), prefix)
    body = {"name": "partner-api", "subject": "c9", "duration": "10m", "reason": "test"}
    with Dashboard(state_of(app), port=0, interval=0.5) as board:
        for action in ("block", "unblock", "reset"):
            assert post(f"{board.url}/api/{action}", body)[0] in (404, 405)
    partner = Limiter(r, "5/s, 200/h", name="partner-api", prefix=prefix)
    with Dashboard(state_of(app), port=0, interval=0.5, allow_writes=True) as board:
        assert "writes allowed" in get(f"{board.url}/inspect?name=partner-api&subject=c9")[1]
        # a form post (which any page could make) is refused: JSON only
        assert post(f"{board.url}/api/block", "name=partner-api", "text/plain")[0] == 415
        status, data = post(f"{board.url}/api/block", {**body, "duration": "soon"})
        assert status == 400 and "not a duration" in data["error"]
        status, data = post(f"{board.url}/api/block", {**body, "name": "partnr"})
        assert status == 404 and "unknown limit name 'partnr'" in data["error"]

        status, data = post(f"{board.url}/api/block", body)
        assert status == 200 and data["blocked"] is True
        assert partner.usage("c9").blocked == "test"
        limits = get(f"{board.url}/api/limits?blocked=1")[1]["limits"]  # refreshed at once
        assert limits[0]["subjects"][0]["subject"] == "c9"

        status, data = post(f"{board.url}/api/unblock", body)
        assert status == 200 and data["was_blocked"] is True
        assert partner.usage("c9").blocked is None

        partner.block("c9", 60, "kept")
        Limiter(r, "5/s, 200/h", name="partner-api", prefix=prefix).acquire("c8")
        status, data = post(f"{board.url}/api/reset", {**body, "subject": "c8"})
        assert status == 200 and data["keys"] >= 1
        assert [x.used for x in partner.usage("c8").rules] == [0, 0]
        assert partner.usage("c9").blocked == "kept"  # a reset leaves blocks alone


def test_redis_going_away_shows_an_error_and_recovers(prefix: str) -> None:
    server = EmbeddedRedis().start()
    try:
        client = redis.Redis.from_url(server.url())
        Limiter(client, "5/s", name="api", prefix=prefix).acquire("k1")
        state = State(redis_url=server.url(), prefix=prefix)
        with Dashboard(state, port=0, interval=0.2) as board:
            assert get(f"{board.url}/api/limits")[1]["error"] is None
            server.stop()
            down = wait_for(
                lambda: get(f"{board.url}/api/limits")[1], lambda d: d["error"], timeout=10
            )
            assert "cannot reach Redis" in down["error"]
            assert [x["label"] for x in down["limits"]] == ["api"]  # the last reading stays
            status, data = get(f"{board.url}/api/inspect?name=api&subject=k1")
            assert status == 503 and "cannot reach Redis" in data["error"]
            status, data = get(f"{board.url}/api/limit?label=api")
            assert status == 503 and "cannot reach Redis" in data["error"]
            with Dashboard(state, port=0, interval=0.2) as fresh:  # nothing read yet
                status, data = get(f"{fresh.url}/api/limit?label=api")
                assert status == 503 and "no limit read yet" in data["error"], data
            server.start()
            up = wait_for(
                lambda: get(f"{board.url}/api/limits")[1],
                lambda d: d["error"] is None,
                timeout=10,
            )
            assert up["error"] is None and up["limits"] == []  # a fresh Redis: nothing counted
        client.close()
    finally:
        server.close()


def test_the_command(redis_server: ServerHandle, prefix: str, r: redis.Redis) -> None:
    # a booking an hour ahead keeps the subject's key while a loaded machine starts the command
    Limiter(r, "5/s", name="api", prefix=prefix).reserve("k1", not_before=time.time() + 3600)
    env = {**os.environ, "GOVERNOR_REDIS_URL": redis_server.url(0), "GOVERNOR_PREFIX": prefix}
    command = [sys.executable, "-m", "governor.cli", "dashboard", "--port", "0"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "(read-only)" in line, line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        data: Any = get(f"{url}/api/limits")[1]
        assert [x["label"] for x in data["limits"]] == ["api"]
    finally:
        process.terminate()
        process.wait(10)
    bad = subprocess.run(
        [*command[:4], "--interval", "10ms"], env=env, capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "at least 100ms" in bad.stderr and "Traceback" not in bad.stderr


def test_importing_governor_leaves_the_dashboard_out() -> None:
    code = (
        "import sys, governor, governor.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('flask', 'governor.dashboard'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "[]", out.stderr
