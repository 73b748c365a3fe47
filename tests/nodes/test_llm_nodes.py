"""Issue 19 end to end: the real ``openai`` client, in tasks on two ``celery worker`` nodes,
calls a local chat-completions server that enforces per-organisation requests and tokens per
window (tests/support/llm_server.py). governor's limits equal the server's; each call reserves
its prompt and ``max_tokens``, settles what it used and observes the server's headers.

- Every call done, (almost) no 429s (at most one call in 20; none in the runs measured with
  the limit's ``transit`` of 0.1 s, see below), and the token quota used at least 85 % while
  calls wait (the mean fill of the server's token windows; reserving ``max_tokens`` without
  settling fills about 64 % here, bench/llm.py).
- Another client spends 30 % of one organisation's tokens outside governor (calls like the
  tasks', sent again after a 429): the server's x-ratelimit-remaining-* headers keep 429s
  rare, at most one call in 20 (issue 19). observe compares the server's count with
  governor's as of the call's admission (``sync_remaining(as_of=...)``, over the server's
  window) and charges the difference there; the limit's ``transit`` (0.1 s) covers the time a
  call takes to reach the server; and the headroom the sliding log keeps from what the
  readings found covers what the other client spends after the latest reading, which no answer
  shows yet. Measured 1.0 to 2.4 % in eleven runs (before the headroom: 2.0 to 5.2 %, held
  to one in 12); the rest come at window ends, where the other client, refused while the
  window was full, catches up in a burst (docs/token-quotas.md).
"""

from __future__ import annotations

import pytest

from support.llm_runs import Result, Setup, run
from support.servers import ServerHandle

pytestmark = [pytest.mark.worker, pytest.mark.slow]


def _run(redis_server: ServerHandle, setup: Setup, mode: str = "settle") -> Result:
    url = redis_server.url
    result = run(mode, setup, url(1), url(2), url(3), timeout=180)
    print(
        f"\n{mode}: {result.done}/{setup.orgs * setup.calls} done, {len(result.calls)} calls, "
        f"{result.refused} 429s, token fill {result.fill:.0%} over {len(result.fills)} windows "
        f"{[round(f, 2) for f in result.fills]}, {result.wall:.1f} s (ideal {result.ideal:.1f} s)"
        + (f", outside client: {result.outside} calls" if setup.outside else "")
    )
    return result


def test_settled_tokens_fill_the_quota_without_429s(redis_server: ServerHandle) -> None:
    setup = Setup()
    result = _run(redis_server, setup)
    assert result.done == setup.orgs * setup.calls, result.log
    assert result.refused * 20 <= len(result.calls), result.refusals
    assert len(result.fills) >= 3 and result.fill >= 0.85, result.fills


def test_header_sync_keeps_429s_rare_when_another_client_shares_the_quota(
    redis_server: ServerHandle,
) -> None:
    setup = Setup(outside=0.3)
    result = _run(redis_server, setup)
    assert result.done == setup.orgs * setup.calls, result.log
    assert result.outside > 0
    assert result.refused * 20 <= len(result.calls), result.refusals


def test_the_openai_client_against_the_server() -> None:
    """The server speaks what the client expects: usage, headers, a 429 with retry-after."""
    import openai

    from governor.upstream import quotas_from_headers, wait_from_headers
    from support.llm_server import llm_server

    with llm_server(requests=2, tokens=10_000, window=60.0) as server:
        c = openai.OpenAI(base_url=server.url, api_key="k", organization="org-a", max_retries=0)
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "x" * 400}], max_tokens=50
        )
        resp = raw.parse()
        assert resp.usage is not None and resp.usage.prompt_tokens == 100
        assert 1 <= resp.usage.completion_tokens <= 50
        quotas = quotas_from_headers(raw)
        assert quotas["tokens"].remaining == 10_000 - resp.usage.total_tokens
        assert quotas["requests"].remaining == 1
        c.chat.completions.create(model="m", messages=[], max_tokens=1)
        with pytest.raises(openai.RateLimitError) as info:
            c.chat.completions.create(model="m", messages=[], max_tokens=1)
        wait = wait_from_headers(info.value.response)
        assert wait is not None and 50 < wait <= 60
