"""The configured rules are a ceiling on every algorithm (finding 4).

State keys were named after a hash of the rules, and every step of an adaptive factor makes
new rules, so each step started a full bucket: 30 s of climb under ``60/m`` admitted 375 (gcra)
and 357 (fixed_window) over 7 state keys. An adaptive limit's state is now named after its
configured rules (``Limiter(..., ceiling=)``), which every share of them reads; explicit clock.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from governor import ConfigError, Limiter
from governor.celery.config.factors import Factor, scaled
from governor.celery.config.limit_config import limit_config
from governor.celery.config.settings import load_settings
from governor.celery.config.store import Store
from governor.rules import parse_rules
from support.servers import ServerHandle
from support.windows import breach

US = 1_000_000
T = 1_700_000_000 * US  # explicit clock (microseconds)
ALGORITHMS = ["sliding_log", "gcra", "token_bucket", "fixed_window", "sliding_window"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_climbing_factor_stays_under_the_configured_rules(
    redis_server: ServerHandle, algorithm: str
) -> None:
    """30 s of climb from half of ``60/m``, a call every 50 ms: at most what ``60/m`` allows."""
    prefix = f"gt{uuid.uuid4().hex[:8]}"
    store = Store(
        load_settings({"governor_redis_url": redis_server.url(0), "governor_prefix": prefix})
    )
    config = limit_config({"rules": "60/m", "adaptive": True}, algorithm, "x")
    factor = Factor(0.5, T / US)  # lowered just now; climbs 0.02 a second
    admitted, keys = [], set()
    for i in range(600):
        now = T + i * 50_000
        share = scaled(config, factor.at(now / US, 0.02))
        lim = store.limiter("queue", share)
        keys.add(lim.keys("q")[0])
        if lim.acquire("q", now=now / US).allowed:
            admitted.append((now, 1))
    assert len(keys) == 1  # one state whatever the share
    assert breach(admitted, [(60, 60 * US)], algorithm) is None, len(admitted)
    assert len(admitted) >= 30  # (and it admits: at least the share it started with)


def test_a_token_bucket_full_for_a_share_is_not_full_for_the_ceiling(
    redis_server: ServerHandle,
) -> None:
    """Found by the model (test_adaptive_model.py, thorough): a token bucket keeps no key for a
    full bucket and reads a missing key as full. Lowered to 2/5s with 2 tokens left, its key
    went; at 3/5s a second later the missing key read as 3 tokens: 5 calls within a second
    under 4/5s, which allows 4."""
    prefix = f"gt{uuid.uuid4().hex[:8]}"
    store = Store(
        load_settings({"governor_redis_url": redis_server.url(0), "governor_prefix": prefix})
    )
    config = limit_config({"rules": "4/5s", "adaptive": True}, "token_bucket", "x")
    admitted = []
    for factor, at in [(1.0, 0), (0.7, 0), (0.75, US), (0.75, US), (0.75, US)]:
        lim = store.limiter("queue", scaled(config, factor))
        if lim.acquire("q", now=(T + at) / US).allowed:
            admitted.append((T + at, 1))
    assert breach(admitted, [(4, 5 * US)], "token_bucket") is None, admitted
    assert len(admitted) == 4


def test_a_share_must_keep_the_state_right() -> None:
    r = redis.Redis()  # never connected: the check is at construction
    ok = [
        ("5/s", "10/s", "fixed_window"),
        ("1/s, 5/m", "10/s, 10/m", "token_bucket"),
        ("1/3s", "10/s", "sliding_log"),
        ("1/3s", "10/s", "gcra"),
        ("10/s", "10/s", "sliding_window"),
    ]
    for rules, ceiling, algorithm in ok:
        Limiter(r, rules, algorithm=algorithm, name="x", ceiling=ceiling)
    bad = [
        ("11/s", "10/s", "sliding_log"),  # above the ceiling
        ("1/3s", "10/s", "fixed_window"),  # its windows count per period
        ("1/3s", "10/s", "token_bucket"),
        ("1/3s", "10/s", "sliding_window"),
        ("2/3s", "10/s", "gcra"),  # a burst over a longer period
        ("5/s", "10/s, 100/m", "gcra"),  # as many rules
        ("5/2s", "10/s", "sliding_log"),
    ]
    for rules, ceiling, algorithm in bad:
        with pytest.raises(ConfigError, match="share"):
            Limiter(r, rules, algorithm=algorithm, name="x", ceiling=ceiling)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_share_reads_the_ceilings_state(r: redis.Redis, algorithm: str) -> None:
    one = Limiter(r, "6/m", algorithm=algorithm, name="x", ceiling="60/m")
    other = Limiter(r, "60/m", algorithm=algorithm, name="x")
    assert one.keys("s") == other.keys("s")
    assert one.ceiling == parse_rules("60/m") and other.ceiling == other.rules
