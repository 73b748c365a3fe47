"""Reading how long an upstream asked to wait: Retry-After, the IETF RateLimit fields and
X-RateLimit-*, from plain mappings and response-like objects; hostile values are ignored or cut,
never a crash. Backoff built from them. (Parsing only: no Redis involved.)"""

from __future__ import annotations

import email.utils
import logging
import urllib.error
from typing import Any

import pytest

from governor import ConfigError
from governor.celery import Backoff
from governor.upstream import status_of, wait_from_headers

NOW = 1_800_000_000.0


def wait(headers: Any, **kw: Any) -> float | None:
    return wait_from_headers(headers, now=NOW, **kw)


def test_retry_after_seconds_and_dates() -> None:
    assert wait({"Retry-After": "30"}) == 30.0
    assert wait({"retry-after": " 2.5 "}) == 2.5  # any case; decimals accepted
    date = email.utils.formatdate(NOW + 90, usegmt=True)
    assert wait({"Retry-After": date}) == pytest.approx(90.0)
    past = email.utils.formatdate(NOW - 90, usegmt=True)
    assert wait({"Retry-After": past}) == 0.0


def test_ratelimit_fields() -> None:
    assert wait({"RateLimit": '"default";r=0;t=12'}) == 12.0
    assert wait({"RateLimit": '"default";r=3;t=12'}) is None  # room left: not a wait
    assert wait({"RateLimit": "limit=100, remaining=0, reset=7"}) == 7.0
    assert wait({"RateLimit-Remaining": "0", "RateLimit-Reset": "4"}) == 4.0
    assert wait({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "9"}) == 9.0
    assert wait({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(NOW) + 20)}) == 20
    ms = str(int(NOW * 1000) + 1500)
    assert wait({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": ms}) == pytest.approx(1.5)
    assert wait({"X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "9"}) is None
    # Retry-After wins over the others
    assert wait({"Retry-After": "3", "RateLimit": '"d";r=0;t=50'}) == 3.0


def test_nothing_said_is_none() -> None:
    assert wait({}) is None
    assert wait({"Content-Type": "text/plain"}) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"Retry-After": "-5"},
        {"Retry-After": "soon"},
        {"Retry-After": "Mon, 99 Foo 2020 99:99:99 GMT"},
        {"Retry-After": "1" * 5000},
        {"Retry-After": "nan"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "-3"},
        {"RateLimit": '"d";r=zero;t=5'},
    ],
)
def test_hostile_values_are_ignored_with_a_warning(
    headers: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="governor.upstream"):
        assert wait(headers) is None
    assert caplog.records


def test_huge_waits_are_cut(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="governor.upstream"):
        assert wait({"Retry-After": "99999999999"}, max_wait=600) == 600.0
        year = email.utils.formatdate(NOW + 400 * 86400, usegmt=True)
        assert wait({"Retry-After": year}) == 3600.0
    assert len(caplog.records) == 2


class Response:
    """What requests and httpx responses look like to governor (status_code, headers)."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status_code = status
        self.headers = headers


class Urllib3Response:
    def __init__(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status
        self.headers = headers


def test_responses_of_every_client() -> None:
    assert wait(Response(429, {"Retry-After": "4"})) == 4.0
    assert wait(Urllib3Response(503, {b"Retry-After": b"6"})) == 6.0
    error = urllib.error.HTTPError(
        "http://x", 429, "Too Many", email.message_from_string("Retry-After: 8\n\n"), None
    )  # type: ignore[arg-type]
    assert wait(error) == 8.0 and status_of(error) == 429
    assert status_of(Response(429, {})) == 429 and status_of({}) is None


def test_backoff_from_a_response() -> None:
    b = Backoff.from_response(Response(429, {"Retry-After": "4"}), limit="queue")
    assert (b.retry_after, b.limit, b.reason) == (4.0, "queue", "HTTP 429")
    bare = Backoff.from_response(Response(503, {}))
    assert bare.retry_after is None and bare.reason == "HTTP 503"
    assert "exponential" in str(bare)
    assert Backoff.from_response({"Retry-After": "2"}).reason == "upstream backoff"
    for bad in (-1, float("inf"), "5", True):
        with pytest.raises(ConfigError):
            Backoff(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Backoff(1, limit=3)  # type: ignore[arg-type]
