"""``governor dashboard``: a small web page showing every limit live (read-only by default).

::

    $ governor -A proj dashboard                      # http://127.0.0.1:8055
    $ governor -A proj dashboard --allow-writes       # adds block / unblock / reset buttons
    $ GOVERNOR_DASHBOARD_TOKEN=... governor -A proj dashboard --host 0.0.0.0 \
          --allowed-host dash.example.com --allow-writes    # others: a token, see below

Needs the ``dashboard`` extra (``pip install 'celery-governor[dashboard]'``). One background thread
reads Redis every ``--interval`` (see :mod:`governor.dashboard.sampler` for the cost of one
refresh); every open page polls that one reading, so more browsers add no Redis load.

It shows every limit, subject and block reason to whoever reaches its port, so it listens on
127.0.0.1 by default and answers only requests whose ``Host`` is a loopback name, the address
it listens on or an ``--allowed-host`` (a page that rebinds its own name to 127.0.0.1 is
refused), and writes only from its own pages (``Origin``). A token (``GOVERNOR_DASHBOARD_TOKEN``
or ``--token-file``) makes it ask for it: browsers log in once (a cookie), scripts send
``Authorization: Bearer TOKEN``. Listening on anything but loopback with ``--allow-writes``
needs one. See docs/security.md.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click

from ..dashboard.access import TOKEN_ENV, check_token, host_name, is_loopback
from ..dashboard.app import MAX_BLOCK
from ..dashboard.server import Dashboard
from .common import CliError, Duration, State, format_duration, pass_state

__all__ = ["dashboard"]


@click.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Any but loopback shows every limit, subject and block reason "
    "to whoever reaches the port (with --allow-writes it needs a token): see docs/security.md.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this Host name (the name browsers use, e.g. behind a "
    "proxy; .example.com: it and its subdomains). Repeat for several. Loopback names and the "
    "--host address are always answered; other names are refused (DNS rebinding).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Ask for the token in this file (or set {TOKEN_ENV}): browsers log in once, "
    "scripts send 'Authorization: Bearer TOKEN'.",
)
@click.option(
    "--max-block",
    type=Duration(),
    default=MAX_BLOCK,
    show_default=format_duration(MAX_BLOCK),
    help="The longest block the page may make (longer ones: governor block).",
)
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
    help="Add block / unblock / reset buttons (each asks for confirmation). Off by default; "
    "with a --host other than loopback it needs a token.",
)
@pass_state
def dashboard(
    state: State,
    host: str,
    allowed_hosts: tuple[str, ...],
    token_file: Path | None,
    max_block: float,
    port: int,
    interval: float,
    examine: int,
    allow_writes: bool,
) -> None:
    """Serve a live web page of every limit: usage against each rule, starts per second,
    blocks, bookings, concurrency, fair queues, parked tasks.

    It answers only requests for its own host names (loopback, --host, --allowed-host), takes
    writes only from its own pages, and with a token asks every caller for it."""
    state.redis_target()  # a bad URL fails here; an unreachable Redis shows on the page
    if interval < 0.1:
        raise CliError("--interval must be at least 100ms")
    for name in allowed_hosts:
        if not host_name(name).lstrip(".") or any(c in name for c in "/@?# "):
            raise CliError(f"--allowed-host takes a host name like dash.example.com, got {name!r}")
    token = _token(token_file)
    local = is_loopback(host)
    if allow_writes and not local and token is None:
        raise CliError(
            f"--allow-writes on {host!r} (not a loopback address) lets whoever reaches the port "
            f"block, unblock and reset limits: give a token ({TOKEN_ENV} or --token-file), or "
            "listen on 127.0.0.1 behind a proxy that checks who calls (docs/security.md)"
        )
    try:
        board = Dashboard(
            state,
            host=host,
            port=port,
            interval=interval,
            allow_writes=allow_writes,
            examine=examine,
            allowed_hosts=allowed_hosts,
            token=token,
            max_block=max_block,
        )
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    mode = "block/unblock/reset allowed" if allow_writes else "read-only"
    if token is not None:
        mode += ", token required"
    click.echo(f"governor dashboard on {board.url} ({mode}); Ctrl-C to stop", err=False)
    if not local and token is None:
        click.echo(
            f"Warning: listening on {host} without a token: whoever reaches this port sees "
            f"every limit, subject and block reason. Set {TOKEN_ENV} or --token-file, or see "
            "docs/security.md.",
            err=True,
        )
    with contextlib.suppress(KeyboardInterrupt):
        board.serve_forever()


def _token(path: Path | None) -> str | None:
    """The token from ``--token-file`` (first), else the environment; None without one."""
    if path is not None:
        try:
            text, where = path.read_text(encoding="utf-8"), f"--token-file {str(path)!r}"
        except (OSError, UnicodeError) as exc:
            raise CliError(f"cannot read --token-file {str(path)!r}: {exc}") from None
    elif os.environ.get(TOKEN_ENV):
        text, where = os.environ[TOKEN_ENV], TOKEN_ENV
    else:
        return None
    try:
        return check_token(text, where)
    except ValueError as exc:
        raise CliError(str(exc)) from None
