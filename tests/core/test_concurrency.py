"""Eight processes hammer one subject on Redis TIME; the admitted moments must obey the rules."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import redis

from governor import Limiter
from governor.plan import most_in_window

RULES = "10/200ms, 40/s"  # both bind under this load
PROCESSES = 8
SECONDS = 1.5


def hammer(args: tuple[str, str, str, float]) -> list[float]:
    url, prefix, algorithm, deadline = args
    limiter = Limiter(
        redis.Redis.from_url(url), RULES, algorithm=algorithm, name="hot", prefix=prefix
    )
    admitted = []
    while time.time() < deadline:
        d = limiter.acquire("one-subject")
        if d.allowed:
            admitted.append(d.now)
    return admitted


@pytest.mark.parametrize(
    "algorithm", ["sliding_log", "sliding_window", "fixed_window", "gcra", "token_bucket"]
)
def test_no_window_exceeds_its_rule(redis_server: object, prefix: str, algorithm: str) -> None:
    url = redis_server.url(0)  # type: ignore[attr-defined]
    deadline = time.time() + SECONDS
    with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
        results = pool.map(hammer, [(url, prefix, algorithm, deadline)] * PROCESSES)
    stamps = [t for result in results for t in result]
    assert sum(1 for r in results if r) >= 2, "the processes did not overlap"
    limiter = Limiter(None, RULES, algorithm=algorithm, name="hot")
    for rule in limiter.rules:
        seen = most_in_window(stamps, rule.period)
        if algorithm in ("sliding_log", "sliding_window"):
            assert seen <= rule.limit, f"{seen} admitted within {rule} (any window)"
        elif algorithm == "fixed_window":
            per_window: dict[int, int] = {}
            for t in stamps:
                k = int(t * 1_000_000) // rule.period_us
                per_window[k] = per_window.get(k, 0) + 1
            assert max(per_window.values()) <= rule.limit, f"fixed window over {rule}"
            assert seen <= 2 * rule.limit
        else:  # gcra, token bucket: a burst of N, then N per W
            assert seen <= 2 * rule.limit, f"{seen} admitted within {rule}"
    # and the limit is actually reached: the load is far above it
    total_rate = len(stamps) / SECONDS
    assert total_rate >= 0.6 * 40, f"only {total_rate:.1f}/s admitted under a 40/s limit"
