"""``governor dashboard``: a small web page showing every limit live (read-only by default).

::

    $ governor -A proj dashboard                      # http://127.0.0.1:8055
    $ governor dashboard --port 9000 --host 0.0.0.0   # the limits found in Redis (rules unknown)
    $ governor -A proj dashboard --allow-writes       # adds block / unblock / reset buttons

Needs the ``dashboard`` extra (``pip install 'celery-governor[dashboard]'``). One background thread
reads Redis every ``--interval`` (see :mod:`governor.dashboard.sampler` for the cost of one
refresh); every open page polls that one reading, so more browsers add no Redis load.
"""

from __future__ import annotations

import contextlib

import click

from ..dashboard.server import Dashboard
from .common import CliError, Duration, State, pass_state

__all__ = ["dashboard"]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8055,
    show_default=True,
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--interval",
    type=Duration(),
    default=1.0,
    show_default="1s",
    help="How often to read Redis (and the pages to refresh).",
)
@click.option(
    "--examine",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many subjects of each limit read per refresh (bounds the Redis calls).",
)
@click.option(
    "--allow-writes",
    is_flag=True,
    help="Add block / unblock / reset buttons (each asks for confirmation). Off by default.",
)
@pass_state
def dashboard(
    state: State, host: str, port: int, interval: float, examine: int, allow_writes: bool
) -> None:
    """Serve a live web page of every limit: usage against each rule, starts per second,
    blocks, bookings, concurrency, fair queues, parked tasks."""
    state.redis_target()  # a bad URL fails here; an unreachable Redis shows on the page
    if interval < 0.1:
        raise CliError("--interval must be at least 100ms")
    try:
        board = Dashboard(
            state,
            host=host,
            port=port,
            interval=interval,
            allow_writes=allow_writes,
            examine=examine,
        )
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    mode = "block/unblock/reset allowed" if allow_writes else "read-only"
    click.echo(f"governor dashboard on {board.url} ({mode}); Ctrl-C to stop", err=False)
    with contextlib.suppress(KeyboardInterrupt):
        board.serve_forever()
