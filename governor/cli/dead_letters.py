"""``governor dead-letters list | show | redrive | drop``: waiting tasks that could not be read
or published, kept in Redis for an operator (see docs/dead-letters.md).

::

    $ governor -A proj dead-letters list
    $ governor -A proj dead-letters show 3f2a9c1e0b
    $ governor -A proj dead-letters redrive 3f2a9c1e0b     # once the app can read it again
    $ governor -A proj dead-letters drop --all --yes

An ID may be shortened to any prefix that names one letter. ``redrive`` parks a letter again,
due now: a worker's releaser publishes it, and the gate decides it like any call (a fair call
waits in its fair queue again, a capped one in its cap's line). With ``-A`` it refuses when the
app does not park (``governor_park_after = False``): nothing would publish it.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from .common import CliError, State, echo_json, format_time, pass_state
from .views import console

__all__ = ["dead_letters"]

_json = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
_yes = click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
_all = click.option("--all", "every", is_flag=True, help="Every letter.")


def _module() -> Any:
    try:
        from ..celery.waiting import dead_letters as module
    except ImportError:
        raise CliError(
            "dead letters need Celery: install governor's celery extra (pip install -e '.[celery]')"
        ) from None
    return module


def letter_json(letter: Any, text: bool = False) -> dict[str, Any]:
    out = {
        "id": letter.id,
        "kind": letter.kind,
        "source": letter.source,
        "entry": letter.entry,
        "task": letter.task,
        "reason": letter.reason,
        "at": letter.at,
        "times": letter.times,
        "where": dict(letter.where),
    }
    if text:
        raw = letter.text
        out["text"] = raw if isinstance(raw, str) else None
        out["text_hex"] = raw.hex() if isinstance(raw, bytes) else None
    return out


def _pick(state: State, ids: tuple[str, ...], every: bool) -> list[Any]:
    """The letters ``ids`` name (each an id or a prefix naming one), or all of them."""
    module = _module()
    letters = module.entries(state.client, state.prefix)
    if every:
        if ids:
            raise CliError("give IDs or --all, not both")
        return list(letters)
    if not ids:
        raise CliError("give the IDs of the letters (see `governor dead-letters list`), or --all")
    out = []
    for given in ids:
        found = [d for d in letters if d.id.startswith(given)]
        if not found:
            raise CliError(f"no dead letter {given!r} (see `governor dead-letters list`)")
        if len(found) > 1:
            raise CliError(f"{given!r} names {len(found)} letters: give more of its id")
        out.append(found[0])
    return out


@click.group("dead-letters")
def dead_letters() -> None:
    """Waiting tasks that could not be read or published: list, show, redrive, drop."""


@dead_letters.command("list")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Show at most this many (oldest first).",
)
@_json
@pass_state
def list_command(state: State, limit: int, as_json: bool) -> None:
    """Every dead letter, oldest first."""
    module = _module()
    letters = module.entries(state.client, state.prefix, limit)
    total = module.count(state.client, state.prefix)
    if as_json:
        echo_json({"count": total, "letters": [letter_json(d) for d in letters]})
        return
    if not letters:
        click.echo("No dead letters.")
        return
    table = Table(box=None, pad_edge=False)
    for name in ("id", "since", "times", "source", "entry", "task", "reason"):
        table.add_column(name, overflow="fold" if name == "reason" else "ellipsis")
    for d in letters:
        reason = d.reason if len(d.reason) <= 80 else d.reason[:77] + "..."
        table.add_row(
            d.id[:10], format_time(d.at), str(d.times), d.source, d.entry, d.task or "?", reason
        )
    out = console()
    out.print(table)
    if total > len(letters):
        out.print(f"... {total - len(letters)} more (--limit to see them)", style="dim")


@dead_letters.command("show")
@click.argument("letter_id", metavar="ID")
@_json
@pass_state
def show(state: State, letter_id: str, as_json: bool) -> None:
    """One letter in full: where it waited, why it is here, the message as it was kept."""
    [letter] = _pick(state, (letter_id,), False)
    shown = letter_json(letter, text=True)
    if as_json:
        echo_json(shown)
        return
    for key in ("id", "kind", "source", "entry", "task", "reason", "times"):
        click.echo(f"{key}: {shown[key]}")
    click.echo(f"since: {format_time(letter.at)}")
    for key, value in sorted(letter.where.items()):
        click.echo(f"{key}: {value}")
    click.echo("message:")
    if isinstance(letter.text, bytes):
        click.echo(f"  (not UTF-8, {len(letter.text)} bytes) {letter.text.hex()}")
        return
    try:
        click.echo(json.dumps(json.loads(letter.text), indent=2))
    except ValueError:
        click.echo(f"  {letter.text!r}")


def _check_parking(state: State) -> None:
    if state.app is None:
        return
    from .apps import settings_of

    if settings_of(state.app).park_after is None:
        raise CliError(
            f"app {state.app_name!r} does not park (governor_park_after = False): a re-driven "
            "letter is parked again, and no releaser would publish it"
        )


@dead_letters.command("redrive")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@_all
@_yes
@_json
@pass_state
def redrive(state: State, ids: tuple[str, ...], every: bool, yes: bool, as_json: bool) -> None:
    """Send letters back to wait (parked, due now): fix what made them unreadable first."""
    module = _module()
    _check_parking(state)
    letters = _pick(state, ids, every)
    if letters and not yes:
        click.confirm(
            f"Send {len(letters)} dead letter(s) back to run? Workers must be able to read them.",
            abort=True,
            err=True,
        )
    parked = [module.redrive(state.client, state.prefix, d) for d in letters]
    if as_json:
        echo_json({"redriven": [{"id": d.id, "parked": p} for d, p in zip(letters, parked)]})
        return
    for d, p in zip(letters, parked, strict=True):
        click.echo(f"{d.id[:10]} ({d.source} {d.entry}): parked as {p}, due now")
    if not letters:
        click.echo("No dead letters.")


@dead_letters.command("drop")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@_all
@_yes
@_json
@pass_state
def drop(state: State, ids: tuple[str, ...], every: bool, yes: bool, as_json: bool) -> None:
    """Forget letters for good (their tasks never run; asks first)."""
    module = _module()
    letters = _pick(state, ids, every)
    if letters and not yes:
        click.confirm(
            f"Drop {len(letters)} dead letter(s)? Their tasks will never run.", abort=True, err=True
        )
    dropped = module.drop(state.client, state.prefix, [d.id for d in letters])
    if as_json:
        echo_json({"dropped": dropped, "ids": [d.id for d in letters]})
    else:
        click.echo(f"Dropped {dropped} dead letter(s).")
