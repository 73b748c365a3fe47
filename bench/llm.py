"""LLM token quotas (issue 19): how much of a provider's token quota a backlog of chat
completions uses, how many 429s it meets, and how long it takes against the ideal.

    python -m bench.llm                    # about four minutes on 2 cores
    python -m bench.llm --calls 150 --only governor

The provider: tests/support/llm_server.py, OpenAI's chat-completions format, per organisation
``--requests`` calls and ``--tokens`` tokens in any ``--window`` seconds (exact sliding window,
each call counted with its real tokens at arrival; beyond, 429 with retry-after). A call's
prompt is 50 to 300 tokens, its ``max_tokens`` 256, 512 or 1024, its completion drawn
uniformly from 1 to ``max_tokens``. ``--calls`` calls per organisation, 2 organisations,
published at once; 2 ``celery worker`` nodes of 4 prefork processes each, with the real
``openai`` client (tests/support/llm_app.py). governor's limits equal the provider's.

Scenarios (the first is the reference, measured in the same run):

exact scheduler       one process, 8 threads, a local exact sliding window per organisation that
                      reserves prompt + max_tokens and settles each call's real use when it
                      answers (counted from then on: the provider counted it at its arrival,
                      between the two)
governor              reserve prompt + max_tokens, ``settle``, ``observe`` (issue 19's example)
governor, learned     the tokens ``learned(prompt + max_tokens)``, settle, observe
governor, worst case  reserve prompt + max_tokens, never settle
retry 429s            no governor: a 429 is retried after its retry-after (``self.retry``)

and with another client spending 30 % of one organisation's tokens outside governor: governor
(settle + observe), governor without observe, retry 429s.

fill     the mean token fill of the provider's windows while calls wait (whole windows from the
         first call to each organisation's last success)
429s     refused calls, of all calls the tasks made
wall     first call to last success; ideal: the tokens served at exactly the quota
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

from bench.common import table
from governor.embedded import EmbeddedRedis
from tests.support.llm_runs import Result, Setup, run
from tests.support.llm_server import llm_server


def exact(setup: Setup) -> Result:
    """The reference: one process that knows everything, exactly (no Redis, no broker)."""
    import openai

    work = setup.work()
    calls: list[list[Any]] = []
    lock = threading.Condition()
    logs: dict[str, deque[list[float]]] = {f"org-{o}": deque() for o in range(setup.orgs)}
    pending = deque(work)
    free = [setup.nodes * setup.concurrency]
    done = [0]

    def room(org: str, tokens: int, now: float) -> bool:
        log = logs[org]
        while log and log[0][0] <= now - setup.window:
            log.popleft()
        used = sum(e[1] for e in log)
        return len(log) + 1 <= setup.requests and used + tokens <= setup.tokens

    with llm_server(setup.requests, setup.tokens, setup.window) as server:
        clients = {
            org: openai.OpenAI(
                base_url=server.url, api_key="x", organization=org, max_retries=0, timeout=30
            )
            for org in logs
        }

        def call(org: str, prompt: str, max_tokens: int, n: int, entry: list[float]) -> None:
            try:
                resp = clients[org].chat.completions.create(
                    model="local",
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=max_tokens,
                )
                status, used = 200, resp.usage.total_tokens if resp.usage else 0
            except openai.RateLimitError:
                status, used = 429, 0
            with lock:
                now = time.time()
                calls.append([now, n, org, status, used, 0])
                # settled; counted from its end: the provider stamped it at its arrival, some
                # time after it was sent and before this answer
                entry[0], entry[1] = now, used
                free[0] += 1
                if status == 200:
                    done[0] += 1
                else:
                    pending.appendleft((org, prompt, max_tokens, n))
                lock.notify()

        with lock:
            while done[0] < len(work):
                now = time.time()
                started = False
                for item in list(pending):
                    org, prompt, max_tokens, _ = item
                    if free[0] <= 0:
                        break
                    estimate = len(prompt) // 4 + max_tokens
                    if room(org, estimate, now):
                        entry = [now, float(estimate)]
                        logs[org].append(entry)
                        pending.remove(item)
                        free[0] -= 1
                        started = True
                        threading.Thread(target=call, args=(*item, entry), daemon=True).start()
                if not started:
                    lock.wait(0.005)
        fills: list[float] = []
        served = 0
        for org in logs:
            mine = [c for c in server.calls(org) if c.status == 200]
            start = min(c.t for c in server.calls(org))
            fills += server.fill(org, start, max(c.t for c in mine))
            served += sum(c.tokens for c in mine)
    first = min(c[0] for c in calls)
    last = max(c[0] for c in calls if c[3] == 200)
    ideal = served / (setup.orgs * setup.tokens) * setup.window
    return Result("exact", setup, done[0], calls, fills, last - first, ideal)


def row(name: str, r: Result) -> list[str]:
    total = r.setup.orgs * r.setup.calls
    return [
        name,
        f"{r.done}/{total}",
        f"{r.fill:.0%}",
        f"{r.refused} of {len(r.calls)} ({r.refused / max(1, len(r.calls)):.1%})",
        f"{r.wall:.1f} s ({r.wall / r.ideal:.2f}x ideal {r.ideal:.1f} s)" if r.ideal else "-",
    ]


def decisions(server: EmbeddedRedis, count: int) -> list[list[str]]:
    """The Celery layer's decision (the gate's rounds, no worker) for a cost per meter of 1
    and of 1,000,000 tokens, and an int cost without meters: microseconds per decision."""
    import redis

    from governor.celery.config.limit_config import limit_config
    from governor.celery.config.settings import load_settings
    from governor.celery.config.store import Store
    from governor.celery.decisions.decider import Decider
    from governor.celery.types import LimitSpec, WaitState

    settings = load_settings({"governor_redis_url": server.url(2), "governor_prefix": "bl"})
    store = Store(settings)
    decider = Decider(settings, store)
    metered = limit_config(
        {"rules": {"requests": "10000000/m", "tokens": "1000000000000/m"}}, "sliding_log", "bench"
    )
    plain = limit_config("20000/m", "sliding_log", "bench")
    cases = (
        ("int cost 1, no meters", plain, 1),
        ("{requests: 1, tokens: 1}", metered, {"requests": 1, "tokens": 1}),
        ("{requests: 1, tokens: 1,000,000}", metered, {"requests": 1, "tokens": 1_000_000}),
    )
    client = redis.Redis.from_url(server.url(2))
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in cases}
    for n in range(5):  # the cases alternate, each on fresh subjects (logs of 10 entries)
        for name, config, cost in cases:
            specs = [[LimitSpec("key", "bench", config, f"{name}-{n}-{i}")] for i in range(200)]
            client.config_resetstat()
            start = time.perf_counter()
            for i in range(count):
                decider.decide(specs[i % 200], cost, WaitState())  # type: ignore[arg-type]
            took = (time.perf_counter() - start) / count * 1e6
            stats = client.info("commandstats")
            inside = sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "eval"))
            rounds[name].append((took, inside / count))
    rows = [
        [
            name,
            f"{statistics.median(t for t, _ in r):.0f}",
            f"{statistics.median(i for _, i in r):.1f}",
        ]
        for name, r in rounds.items()
    ]
    redis.Redis.from_url(server.url(2)).flushdb()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per organisation")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=16_000)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--outside", type=float, default=0.3)
    parser.add_argument("--only", choices=["governor", "decisions", "all"], default="all")
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args()
    setup = Setup(requests=args.requests, tokens=args.tokens, window=args.window, calls=args.calls)
    shared = replace(setup, outside=args.outside)
    header = ["scenario", "done", "fill", "429s", "wall"]
    first: list[list[str]] = []
    second: list[list[str]] = []
    with EmbeddedRedis() as server:
        urls = (server.url(1), server.url(2), server.url(3))
        if args.only == "all":
            first.append(row("exact scheduler (reference)", exact(setup)))
            print(first[-1], flush=True)
        plan = [
            ("governor: settle + observe", "settle", setup, first),
            ("governor: learned + settle + observe", "learned", setup, first),
            ("governor: worst case, no settle", "nosettle", setup, first),
            ("retry 429s, no governor", "retry", setup, first),
            ("governor: settle + observe", "settle", shared, second),
            ("governor: settle, no observe", "blind", shared, second),
            ("retry 429s, no governor", "retry", shared, second),
        ]
        for name, mode, s, rows in plan:
            if args.only == "decisions" or (
                args.only == "governor" and not mode.startswith(("settle", "blind"))
            ):
                continue
            rows.append(row(name, run(mode, s, *urls, timeout=300)))
            print(rows[-1], flush=True)
        costs = decisions(server, args.decisions)
    print(
        f"\n{args.calls} calls x 2 organisations, each allowed {args.requests} requests and "
        f"{args.tokens} tokens per {args.window:g} s; 2 nodes x 4 prefork processes\n"
    )
    print(table(header, first))
    print(f"\nanother client spends {args.outside:.0%} of org-0's tokens outside governor:\n")
    print(table(header, second))
    print("\na decision of the Celery layer (Decider.decide, one limit, round trip included):\n")
    print(table(["cost", "us per decision", "us in Redis"], costs))


if __name__ == "__main__":
    main()
