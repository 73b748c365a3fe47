"""Instructions a decision's script costs inside Redis, counted by callgrind: the same count
whatever else the machine runs (issue 22; needs valgrind, e.g. ``apt-get install valgrind``).

    python -m bench.script_instructions --rules 4 --against baseline --against 50bbba7
    python -m bench.script_instructions --algorithm gcra --rules 1 --against 50bbba7
    python -m bench.script_instructions --algorithm cap --against 8e8301c

For each version (as bench.script_ab: ``now``, ``baseline`` or a git revision) a private
redis-server runs under ``valgrind --tool=callgrind`` with instrumentation off; ``--warm``
decisions fill the logs, then instrumentation is switched on for ``--calls`` more and the
instructions Redis executed are divided by them. The decisions are acquires of 1 unit,
pipelined, round-robin over ``--subjects`` subjects on an explicit clock ``--step`` seconds
apart (the defaults: each subject every 10 s, as in bench.limiter, with 8 decisions before
the ones counted). A script that only returns a constant is counted too: what EVALSHA costs
with no script work. ``--algorithm cap`` counts a concurrency cap's decision instead (a cap of
1,000 without rules, one subject): each call takes a slot and gives back the previous call's, as
a busy pool process does with a carried slot (docs/caps.md). Instructions are not time (a cache
miss costs more than an addition), but they compare versions of a script exactly, which timings
on a shared machine cannot.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

import redis

from bench.common import table
from bench.script_ab import RULES, version, versions_parser
from governor import Limiter
from governor.decision import Hold
from governor.embedded import find_redis_server, free_port

T0 = 1_800_000_000.0
CONSTANT = "return '1 0 0 0 0 0 0 0 '"


def instructions(text: str, rules: str, algorithm: str, args: argparse.Namespace) -> float:
    """Instructions per decision Redis ran for ``text`` (see the module)."""
    folder = tempfile.mkdtemp(prefix="governor-callgrind-")
    port = free_port()
    out = os.path.join(folder, "callgrind.out")
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            find_redis_server(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            folder,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        capped = algorithm == "cap"
        if capped:
            lim = Limiter(client, None, concurrency=1000, name="cg")
            assert lim.acquire("s", holder="t0:0", token="tok", now=T0).allowed
        else:
            lim = Limiter(client, rules, algorithm=algorithm, name="cg")
        sha = client.script_load(text)

        def call(i: int) -> tuple[list[str], list[Any]]:
            now = T0 + i * args.step
            if not capped:
                return lim._call("acquire", f"s{i % args.subjects}", 1, now)
            keys, argv = lim._call("acquire", "s", 1, now, hold=Hold(f"t{i + 1}:0", "tok", 0, 30))
            argv[-1] = f"t{i}:0 tok"  # the previous call's slot, given back first
            return keys, argv

        def decide(start: int, count: int) -> None:
            pipe = client.pipeline(transaction=False)
            for i in range(start, start + count):
                keys, argv = call(i)
                pipe.evalsha(sha, len(keys), *keys, *argv)
                if len(pipe) >= 500:
                    pipe.execute()
            pipe.execute()

        decide(0, args.warm)
        subprocess.run(["callgrind_control", "-i", "on", str(server.pid)], capture_output=True)
        decide(args.warm, args.calls)
        subprocess.run(["callgrind_control", "-i", "off", str(server.pid)], capture_output=True)
        client.shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # (the shutdown closes the connection)
    finally:
        server.wait(timeout=120)
    total = 0
    for path in glob.glob(out + "*"):
        with open(path) as counts:
            for line in counts:
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
    shutil.rmtree(folder, ignore_errors=True)
    return total / args.calls


def main() -> None:
    parser = versions_parser(__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="decisions counted")
    parser.add_argument("--warm", type=int, default=16000, help="decisions before them")
    parser.add_argument("--subjects", type=int, default=2000)
    parser.add_argument("--step", type=float, default=0.005, help="seconds between decisions")
    args = parser.parse_args()
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    rules = RULES.get(args.rules, args.rules)
    specs = [*(args.against or ["baseline"]), "now"]
    rows: list[list[object]] = []
    constant = instructions(CONSTANT, rules, args.algorithm, args)
    rows.append(["(a script returning a constant)", f"{constant / 1000:.1f}", "-"])
    for spec in specs:
        count = instructions(version(spec, args.algorithm), rules, args.algorithm, args)
        rows.append([spec, f"{count / 1000:.1f}", f"{(count - constant) / 1000:.1f}"])
    what = "a cap of 1,000 (no rules)" if args.algorithm == "cap" else f"rules {rules!r}"
    print(f"{args.algorithm}, {what}: thousands of instructions per decision\n")
    print(table(["version", "in Redis", "the script's"], rows))


if __name__ == "__main__":
    main()
