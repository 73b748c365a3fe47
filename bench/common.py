"""Helpers shared by the benchmarks: a private Redis and a plain-text table."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from governor.embedded import EmbeddedRedis


@contextmanager
def bench_redis() -> Iterator[str]:
    """A Redis URL for benchmarks: GOVERNOR_BENCH_REDIS_URL, else a private redis-server.

    The private server may be flushed; a server named by the environment never is.
    """
    url = os.environ.get("GOVERNOR_BENCH_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url()


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
