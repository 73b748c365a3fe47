"""One algorithm's script against another version of it, in the same run (issue 22).

    python -m bench.script_ab --algorithm sliding_log --rules 4 --against 50bbba7
    python -m bench.script_ab --rules 4 --against baseline      # the stamp log (bench/)
    GOVERNOR_BENCH_REDIS_URL=redis://127.0.0.1:6379/15 python -m bench.script_ab ...

The workload is bench.limiter's throughput: one thread, decisions through ``Limiter.acquire``
(the lean lane, Redis TIME), 1 unit each, round-robin over the same ``--calls`` subjects of
10,000 in every round. Each round measures every version in turn (each going first in turn),
in blocks alternating with redis-py PING round trips (as bench.limiter), and the script's time
inside Redis from INFO commandstats (reset before each version's run): the median of
``--rounds`` rounds is shown.
Versions keep their state under keys of their own. A version is ``now`` (this tree's scripts),
``baseline`` (bench/baseline_sliding_log.lua, the one-stamp-per-unit log) or a git revision
(its governor/lua files, includes resolved as governor.scripts does, or the prelude put in
front as before includes). On a shared machine the µs per call moves less than the ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import redis

from bench.common import bench_redis, table
from bench.limiter import FOUR, ONE, SUBJECTS, paired, script_us
from governor import Limiter
from governor.scripts import DIRECTIVE, LuaScript, algorithm_script, capped_script

ROOT = Path(__file__).resolve().parent.parent
RULES = {"1": ONE, "4": FOUR}


def revision_text(rev: str, name: str, rate: str | None = None) -> str:
    """``name``.lua of governor/lua at ``rev``, as that revision's scripts.py built it
    (``rate``: the rules script a capped decision puts where it says ``-- @rate``)."""

    def show(file: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:governor/lua/{file}.lua"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout

    text = show(name)
    if "@include" not in text:
        return show("common") + "\n" + text  # before includes: the prelude in front
    seen: set[str] = {name}

    def expand(body: str) -> str:
        def one(match: re.Match[str]) -> str:
            kind, arg = match.group(1), match.group(2)
            if kind == "rate" and rate is not None:
                return f"local function rate()\n{expand(show(rate))}\nend"
            if kind != "include" or arg in seen:
                return match.group(0)
            seen.add(arg)
            return expand(show(arg))

        return DIRECTIVE.sub(one, body)

    return expand(text)


def version(spec: str, algorithm: str) -> str:
    """The script of ``algorithm`` (or ``cap``: the decision of a cap without rules) at
    ``spec``."""
    if algorithm == "cap":
        if spec == "baseline":
            raise SystemExit("the baseline is a sliding log")
        if spec == "now":
            return capped_script(None).text
        return revision_text(spec, "cap_decide", rate="cap_none")
    if spec == "now":
        return algorithm_script(algorithm).text
    if spec == "baseline":
        if algorithm != "sliding_log":
            raise SystemExit("the baseline is a sliding log")
        return (ROOT / "bench" / "baseline_sliding_log.lua").read_text("utf-8")
    return revision_text(spec, algorithm)


def compare(
    client: redis.Redis, algorithm: str, rules: str, specs: list[str], calls: int, rounds: int
) -> list[list[object]]:
    subjects = [f"customer-{i}" for i in range(SUBJECTS)]
    limiters = []
    for n, spec in enumerate(specs):
        lim = Limiter(client, rules, algorithm=algorithm, name=f"ab-{algorithm}-{n}")
        text = version(spec, algorithm)
        sha = client.script_load(text)
        lim._script = LuaScript(f"{algorithm}@{spec}", text, sha)
        limiters.append(lim)
    ping = client.ping
    ratios: list[list[float]] = [[] for _ in specs]
    inside: list[list[float]] = [[] for _ in specs]
    rates: list[float] = []
    for r in range(rounds):
        for n in [(r + j) % len(specs) for j in range(len(specs))]:  # each first in turn
            lim = limiters[n]
            client.config_resetstat()
            ping_rate, rate = paired(
                lambda i: ping(), lambda i, lim=lim: lim.acquire(subjects[i % SUBJECTS]), calls
            )
            ratios[n].append(rate / ping_rate)
            inside[n].append(script_us(client) / calls)
            rates.append(ping_rate)
    ping_median = statistics.median(rates)
    rows: list[list[object]] = [["redis-py PING", f"{ping_median:,.0f}", "1.00", "-"]]
    for n, spec in enumerate(specs):
        ratio = statistics.median(ratios[n])
        rows.append(
            [
                spec,
                f"{ratio * ping_median:,.0f}",
                f"{ratio:.2f}",
                f"{statistics.median(inside[n]):.1f}",
            ]
        )
    return rows


def versions_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments choosing the scripts compared (here and in bench.script_instructions)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--algorithm", default="sliding_log")
    parser.add_argument("--rules", default="4", help="1, 4 (bench.limiter's) or a rule spec")
    parser.add_argument(
        "--against", action="append", default=[], help="baseline or a git revision (repeatable)"
    )
    return parser


def main() -> None:
    parser = versions_parser(__doc__)
    parser.add_argument("--calls", type=int, default=4000, help="calls per measurement")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (the median is shown)")
    args = parser.parse_args()
    if args.algorithm == "cap":
        raise SystemExit(
            "a cap's decision is compared by python -m bench.script_instructions --algorithm cap "
            "(its time: python -m bench.decision_parts)"
        )
    specs = [*(args.against or ["baseline"]), "now"]
    rules = RULES.get(args.rules, args.rules)
    with bench_redis() as url:
        client = redis.Redis.from_url(url)
        info = client.info("server")
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"Redis {info['redis_version']} at {url}; Python {sys.version.split()[0]}; "
            f"redis-py {redis.__version__}; load average {load}"
        )
        print(f"\n{args.algorithm}, rules {rules!r}: {args.rounds} rounds of {args.calls} calls\n")
        print(
            table(
                ["version", "decisions/s", "x PING", "us in Redis/decision"],
                compare(client, args.algorithm, rules, specs, args.calls, args.rounds),
            )
        )
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
