"""Very long blocks and pauses (finding 11): ``%d`` of a moment past 2**63 microseconds
overflowed in ``block.lua`` and ``pause.lua``, so ``block(1e13)`` stored a negative end and
admitted at once, and longer ones failed with a raw ``ResponseError``. Lengths are bounded at
the edge (100 years, with a clear error), and the scripts cut what a raw caller sends."""

from __future__ import annotations

import pytest
import redis
from click.testing import CliRunner

from governor import ConfigError, Limiter
from governor.blocks import MAX_DURATION
from governor.cli import cli
from governor.scripts import block_script, pause_script
from support.servers import ServerHandle

T = 1_700_000_000.0  # explicit clock (Unix seconds)
LONG = [1e13, 1e16, 1e300, MAX_DURATION + 1]


@pytest.mark.parametrize("seconds", LONG)
def test_too_long_blocks_and_pauses_are_refused(
    r: redis.Redis, prefix: str, seconds: float
) -> None:
    lim = Limiter(r, "5/s", name="api", prefix=prefix)
    with pytest.raises(ConfigError, match="at most 3155760000s"):
        lim.block("c", seconds, "forever", now=T)
    with pytest.raises(ConfigError, match="at most 3155760000s"):
        lim.pause("c", seconds, "HTTP 429", now=T)
    with pytest.raises(ConfigError, match="at most 3155760000s"):
        lim.pause("c", None, "HTTP 429", base=1, max_pause=seconds, now=T)
    assert lim.acquire("c", now=T).allowed  # nothing was written


def test_the_longest_block_and_pause_hold(r: redis.Redis, prefix: str) -> None:
    lim = Limiter(r, "5/s", name="api", prefix=prefix)
    assert lim.block("c", MAX_DURATION, "forever", now=T) == T + MAX_DURATION
    late = T + MAX_DURATION - 1
    assert lim.acquire("c", now=late).blocked == "forever"
    assert lim.pause("p", MAX_DURATION, now=T).until == T + MAX_DURATION
    assert lim.acquire("p", now=late).blocked is not None


@pytest.mark.parametrize("duration_us", [10**19, 10**25, 2**70])
def test_the_scripts_cut_what_a_raw_caller_sends(
    r: redis.Redis, prefix: str, duration_us: int
) -> None:
    lim = Limiter(r, "5/s", name="api", prefix=prefix)
    state, block = lim.keys("c")
    now_us = round(T * 1e6)
    longest = now_us + round(MAX_DURATION * 1e6)
    until, _ = r.eval(block_script().text, 1, block, now_us, duration_us, "raw")
    assert until == longest
    assert lim.acquire("c", now=T + 86_400 * 365 * 50).blocked == "raw"
    level = block[: -len("block")] + "bo"
    paused = r.eval(pause_script().text, 2, "p:" + block, level, now_us, duration_us, "x", 1, 1)
    assert paused[0] == longest
    exponential = r.eval(
        pause_script().text, 2, "e:" + block, level, now_us, "", "x", 10**6, duration_us
    )
    assert exponential[0] == now_us + 10**6  # the base: the first of the exponential pauses
    assert state  # (the state key is not touched)


def test_the_cli_says_so(redis_server: ServerHandle, prefix: str) -> None:
    result = CliRunner(env={"GOVERNOR_REDIS_URL": ""}).invoke(
        cli,
        [
            "--redis-url",
            redis_server.url(0),
            "--prefix",
            prefix,
            "block",
            "api",
            "c1",
            "--for",
            "20000000w",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "at most 3155760000s (100 years)" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("setting", ["governor_backoff_max", "governor_max_pause"])
def test_too_long_pause_settings_fail_at_start_up(redis_server: ServerHandle, setting: str) -> None:
    from support.celery_helpers import config_error

    message = config_error(redis_server.url(), **{setting: 1e13})
    assert setting in message and "at most 3155760000" in message
