"""``governor block | unblock | reset NAME SUBJECT``: steer one subject by hand.

::

    $ governor block proj.call_partner customer-42 --for 2h --reason "runaway retries"
    $ governor unblock proj.call_partner customer-42
    $ governor reset queue emails --yes        # forget what was counted (a block stays)

A block denies every call for the subject until it ends, whatever the rules. None of these
needs the rules: with an app (``-A``) the name is checked against its limits (exit 2 if
unknown), without one any name is accepted.
"""

from __future__ import annotations

import click

from ..limiter import Limiter
from ..rules import Rule
from ..text import as_text
from .common import (
    Duration,
    State,
    echo_json,
    format_duration,
    format_time,
    pass_state,
)
from .limits import LimitEntry, glob_escape, has_state, resolve

__all__ = ["block", "forget_counts", "reset", "unblock"]

_json = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
_rules = click.option("--rules", help="The limiter's rules (checked; not needed to block).")


def _entry(state: State, name: str, subject: str, rules: str | None) -> LimitEntry:
    entry = resolve(state, name, subject, rules)
    if entry is None and rules is None and not has_state(state, name):
        # without an app governor cannot check the name: a typo must not pass unnoticed
        click.echo(
            f"Warning: Redis holds nothing for limit {name!r} (prefix {state.prefix!r}): is the "
            "name right? Pass -A APP to check names against the app's limits.",
            err=True,
        )
    return entry or LimitEntry("given", name, None, subject)


def forget_counts(state: State, name: str, subject: str) -> int:
    """Delete every state key of ``subject`` of limiter ``name``, whatever algorithm and rules
    wrote it, but not its block; the number of keys deleted."""
    state_key, block_key = Limiter(
        state.client, (Rule(1, 1.0),), name=name, prefix=state.prefix
    ).keys(subject)
    pattern = glob_escape(state_key.rsplit(":", 1)[0] + ":") + "*"
    doomed = [
        k for k in state.client.scan_iter(match=pattern, count=1000) if as_text(k) != block_key
    ]
    if doomed:
        state.client.delete(*doomed)
    return len(doomed)


@click.command()
@click.argument("name")
@click.argument("subject")
@click.option(
    "--for",
    "seconds",
    type=Duration(),
    required=True,
    help="How long: 90s, 15m, 2h, 1d, 1h30m.",
)
@click.option("--reason", default="", help="Why (shown by status and inspect).")
@_rules
@_json
@pass_state
def block(
    state: State,
    name: str,
    subject: str,
    seconds: float,
    reason: str,
    rules: str | None,
    as_json: bool,
) -> None:
    """Deny SUBJECT of limit NAME for a while (replaces any block)."""
    until = _entry(state, name, subject, rules).limiter(state).block(subject, seconds, reason)
    if as_json:
        echo_json(
            {
                "name": name,
                "subject": subject,
                "blocked": True,
                "seconds": seconds,
                "until": until,
                "until_iso": format_time(until),
                "reason": reason,
            }
        )
        return
    why = f": {reason}" if reason else ""
    click.echo(
        f"Blocked {name} {subject} for {format_duration(seconds)} (until {format_time(until)}){why}"
    )


@click.command()
@click.argument("name")
@click.argument("subject")
@_rules
@_json
@pass_state
def unblock(state: State, name: str, subject: str, rules: str | None, as_json: bool) -> None:
    """Lift the manual block of SUBJECT (no-op if there is none)."""
    was = _entry(state, name, subject, rules).limiter(state).unblock(subject)
    if as_json:
        echo_json({"name": name, "subject": subject, "was_blocked": was})
    elif was:
        click.echo(f"Unblocked {name} {subject}.")
    else:
        click.echo(f"{name} {subject} was not blocked.")


@click.command()
@click.argument("name")
@click.argument("subject")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@_rules
@_json
@pass_state
def reset(
    state: State, name: str, subject: str, yes: bool, rules: str | None, as_json: bool
) -> None:
    """Forget what was counted for SUBJECT, bookings too (asks first).

    A block stays.
    Asks first unless --yes. Tasks holding a booking still start on time; the limit may then
    admit more than its rules allow until the windows pass.
    """
    _entry(state, name, subject, rules)  # an app checks the name before anything is asked
    if not yes:
        click.confirm(
            f"Forget everything counted for {name} {subject} (a block stays)?",
            abort=True,
            err=True,
        )
    doomed = forget_counts(state, name, subject)
    if as_json:
        echo_json({"name": name, "subject": subject, "reset": True, "keys": doomed})
    elif doomed:
        click.echo(f"Reset {name} {subject}.")
    else:
        click.echo(f"Nothing to reset: Redis holds no counts for {name} {subject}.")
