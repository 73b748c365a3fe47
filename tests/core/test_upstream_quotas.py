"""The upstream's own counters read from its headers (OpenAI, Anthropic, Azure's oddities), and
Go durations and RFC 3339 times: untrusted values are bounded or ignored, never a crash.
(Parsing only: no Redis involved.)"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor.upstream import (
    MAX_COUNT,
    Quota,
    go_duration,
    quotas_from_headers,
    rfc3339,
    wait_from_headers,
)

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def test_go_durations() -> None:
    assert go_duration("6m0s") == 360.0
    assert go_duration("12ms") == pytest.approx(0.012)
    assert go_duration("1h2m3.5s") == pytest.approx(3723.5)
    assert go_duration("2m59.56s") == pytest.approx(179.56)
    assert go_duration("500us") == pytest.approx(0.0005)
    assert go_duration("1\u00b5s") == pytest.approx(1e-6)
    assert go_duration("0") == 0.0 and go_duration("0s") == 0.0
    assert go_duration("1.5") == 1.5  # a plain number is seconds
    for bad in ("", "-1s", "1x", "s", "1h-2m", "1 h", "abc", "1e999", "9" * 70 + "s"):
        assert go_duration(bad) is None, bad


def test_rfc3339_times() -> None:
    assert rfc3339("2027-01-15T08:00:00Z") == NOW
    assert rfc3339("2027-01-15T09:00:00+01:00") == NOW
    assert rfc3339("2027-01-15t07:30:00.250-00:30") == NOW + 0.25
    for bad in ("2027-01-15T08:00:00", "2027-13-01T00:00:00Z", "yesterday", "", "2027-01-15"):
        assert rfc3339(bad) is None, bad


def test_openai_headers() -> None:
    headers = {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-remaining-tokens": "29000",
        "x-ratelimit-reset-requests": "120ms",
        "x-ratelimit-reset-tokens": "2s",
    }
    assert quotas_from_headers(headers, now=NOW) == {
        "requests": Quota("requests", 500, 499, 0.12),
        "tokens": Quota("tokens", 30000, 29000, 2.0),
    }


def test_anthropic_headers() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:30Z",
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": "2027-01-15T08:00:01.5Z",
        "anthropic-ratelimit-output-tokens-remaining": "8000",
        "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:00Z",  # in the past: full now
        "retry-after": "30",
    }
    quotas = quotas_from_headers(headers, now=NOW)
    assert quotas == {
        "requests": Quota("requests", 50, 0, 30.0),
        "input_tokens": Quota("input_tokens", 40000, 39000, 1.5),
        "output_tokens": Quota("output_tokens", None, 8000, None),
        "tokens": Quota("tokens", None, None, 0.0),
    }
    assert wait_from_headers(headers, now=NOW) == 30.0


def test_retry_after_ms_first() -> None:
    assert wait_from_headers({"retry-after-ms": "1500", "retry-after": "2"}, now=NOW) == 1.5
    assert wait_from_headers({"retry-after-ms": "soon", "retry-after": "2"}, now=NOW) == 2.0


def test_azure_unknowns_are_dropped_quietly(caplog: pytest.LogCaptureFixture) -> None:
    headers = {
        "x-ratelimit-limit-tokens": "0",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-remaining-requests": "-1",
        "x-ratelimit-limit-requests": "-1",
    }
    with caplog.at_level(logging.WARNING, "governor.upstream"):
        assert quotas_from_headers(headers, now=NOW) == {}
    assert not caplog.records


def test_hostile_values_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    headers = {
        "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "150",  # more left than the limit: cut to it
        "x-ratelimit-reset-tokens": "9999h",  # cut to max_reset
        "x-ratelimit-remaining-requests": str(MAX_COUNT + 1),
        "x-ratelimit-reset-requests": "\u0000\u2603",
        "anthropic-ratelimit-tokens-remaining": "12.5",
        "anthropic-ratelimit-tokens-reset": "x" * 10_000,  # too long: not even read
    }
    with caplog.at_level(logging.WARNING, "governor.upstream"):
        quotas = quotas_from_headers(headers, now=NOW, max_reset=600)
    assert quotas == {"tokens": Quota("tokens", 100, 100, 600.0)}
    assert len(caplog.records) == 5


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
                "anthropic-ratelimit-requests-reset",
                "anthropic-ratelimit-requests-remaining",
            ]
        ),
        st.text(max_size=40),
    )
)
def test_any_text_parses_or_is_ignored(headers: dict[str, str]) -> None:
    for quota in quotas_from_headers(headers, now=NOW, max_reset=60).values():
        assert quota.limit is None or 1 <= quota.limit <= MAX_COUNT
        assert quota.remaining is None or 0 <= quota.remaining <= MAX_COUNT
        assert quota.reset_in is None or 0 <= quota.reset_in <= 60
        if quota.limit is not None and quota.remaining is not None:
            assert quota.remaining <= quota.limit
