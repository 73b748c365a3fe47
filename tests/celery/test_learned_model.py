"""Learned estimates (governor.celery.metering.learned) against a pure-Python model: the
percentile the script reads back after any sequence of settled uses, with Redis's real script;
and the units a call reserves from it."""

from __future__ import annotations

import math
import uuid

import redis
from hypothesis import given
from hypothesis import strategies as st

from governor.celery.config.settings import load_settings
from governor.celery.metering.costs import Learned
from governor.celery.metering.learned import KEEP, MAX_RATIO_PPM, MIN_USES, Learning, use_ppm
from support.servers import ServerHandle


def model(uses: list[int], q: float) -> int | None:
    """The ratio (ppm) the last KEEP uses give: their ceil(n * q)-th smallest, None below
    MIN_USES."""
    kept = sorted(min(u, MAX_RATIO_PPM) for u in uses[-KEEP:])
    if len(kept) < MIN_USES:
        return None
    return kept[max(1, math.ceil(len(kept) * round(q * 1_000_000) / 1_000_000)) - 1]


@given(
    uses=st.lists(st.integers(0, 2 * MAX_RATIO_PPM), max_size=260),
    q=st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
def test_the_percentile_is_the_models(
    redis_server: ServerHandle, uses: list[int], q: float
) -> None:
    client = redis.Redis.from_url(redis_server.url(2))
    settings = load_settings(
        {
            "governor_redis_url": redis_server.url(2),
            "governor_prefix": f"lm{uuid.uuid4().hex[:8]}",
            "governor_learned_percentile": q,
        }
    )
    learning = Learning(settings, lambda: client)
    key = ("t", "tokens")
    seen = learning.record({}, {key: None})[key]
    assert seen is None
    for use in uses:
        seen = learning.record({"tokens|settled|t": 1}, {key: use})[key]
    assert seen == model(uses, q)
    assert learning.ratio(*key) == seen  # what a decision reads: cached, no Redis call
    default = 1000
    expected = default if seen is None else -(-default * seen // 1_000_000)
    assert learning.estimate("t", "tokens", Learned(default)) == expected
    assert learning.estimate("t", "tokens", Learned(default, most=300)) == min(expected, 300)


@given(used=st.integers(0, 10**12), default=st.integers(0, 10**12))
def test_a_use_is_a_bounded_ratio_of_its_default(used: int, default: int) -> None:
    ppm = use_ppm(used, default)
    if default == 0:
        assert ppm is None
    else:
        assert ppm == min(MAX_RATIO_PPM, used * 1_000_000 // default)
