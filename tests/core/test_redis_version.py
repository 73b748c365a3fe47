"""governor's scripts need Redis 6.2 or later (``ZADD ... LT``, ``SET ... KEEPTTL``): the worker
refuses to start on an older one, ``governor doctor`` says so. (No older server runs here: the
check is judged on ``INFO server`` replies as such a server gives them.)"""

from __future__ import annotations

import pytest
import redis
from click.testing import CliRunner

from governor.celery import Governor
from governor.cli import cli
from governor.deployment import FAIL, OK, WARN, too_old_servers, version
from support.celery_helpers import new_app
from support.servers import ServerHandle


@pytest.mark.parametrize(
    ("reported", "status"),
    [
        ("6.2.0", OK),
        ("6.2.14", OK),
        ("7.0.15", OK),
        ("10.0.0", OK),
        ("6.0.16", FAIL),
        ("5.0.7", FAIL),
        ("4.0.14", FAIL),
        ("unstable", WARN),
        ("", WARN),
    ],
)
def test_the_version_check(reported: str, status: str) -> None:
    check = version("h:6379", {"redis_version": reported})
    assert check.status == status
    if status == FAIL:
        assert f"Redis {reported}: governor needs Redis 6.2 or later" in check.detail
        assert "ZADD LT" in check.detail


def test_this_server_passes(r: redis.Redis, redis_server: ServerHandle) -> None:
    assert version("here", r.info("server")).status == OK
    assert too_old_servers(r) == []
    Governor(new_app(redis_server.url(), "q"))._refuse_old_redis()  # starts
    result = CliRunner(env={"GOVERNOR_REDIS_URL": ""}).invoke(
        cli, ["--redis-url", redis_server.url(0), "doctor"]
    )
    assert f"ok    redis        {r.info('server')['redis_version']} at" in result.output
    assert " version " not in result.output  # a line of its own only when it fails
