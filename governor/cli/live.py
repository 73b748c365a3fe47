"""``governor limits show | set | reset``: change a limit for every worker, without a deploy.

::

    $ governor -A proj limits set queue:emails "20/s, 800/d"
    $ governor -A proj limits set proj.call_partner "5/s" --shadow     # try it first
    $ governor -A proj limits show
    $ governor -A proj limits reset queue:emails                      # the configuration again

LABEL is a limit as ``status`` names it: ``queue:NAME``, ``task:NAME`` or a per-key limit's name;
with ``-A`` a bare queue or task name is enough and an unknown label exits 2. Without ``-A`` nothing
can be checked: a live limit for a name no app has is stored (and listed) but no worker uses it, so
``set`` and ``reset`` warn. Rules are checked before anything is written. Workers pick a change up
within about a second (see :mod:`governor.celery.config.live`). Whoever can write to governor's
Redis can set live limits (docs/security.md).
"""

from __future__ import annotations

import getpass
import socket
from typing import Any

import click

from .common import CliError, State, echo_json, format_time, pass_state
from .limits import app_limits

__all__ = ["limits"]

_json = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _live(state: State) -> Any:
    try:
        from ..celery.config.live import LiveLimits
    except ImportError:
        raise CliError(
            "live limits need Celery: install governor's celery extra "
            "(pip install 'celery-governor[celery]')"
        ) from None
    return LiveLimits(state.client, state.prefix)


def _label(state: State, name: str) -> str:
    """The label NAME means: checked against the app's limits with -A."""
    if state.app is None:
        bare = ""
        if not name.startswith(("queue:", "task:")):
            bare = " (taken as a per-key limit's name: write queue:NAME or task:NAME for others)"
        click.echo(
            f"Warning: without -A, {name!r} is not checked against an app's limits: a live limit "
            f"for a name no app has is stored and listed, and no worker uses it{bare}. Pass -A "
            "APP to check it.",
            err=True,
        )
        return name.removeprefix("key:")
    labels = [e.label for e in app_limits(state, live=False)]
    if name in labels:
        return name
    matches = [label for label in labels if label.split(":", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise CliError(f"{name!r} is ambiguous: {', '.join(matches)}")
    raise CliError(
        f"app {state.app_name!r} has no limit {name!r}; its limits: {', '.join(labels) or 'none'}"
    )


@click.group("limits")
def limits() -> None:
    """Live limits: change a queue's, task's or key's limit for every worker."""


@limits.command("show")
@_json
@pass_state
def show(state: State, as_json: bool) -> None:
    """List live limits (with -A: next to what the configuration says)."""
    entries = _live(state).entries()
    configured = {e.label: e for e in app_limits(state, live=False)} if state.app else {}
    rows: list[dict[str, Any]] = []
    for label in sorted(set(entries) | set(configured)):
        live = entries.get(label)
        conf = configured.get(label)
        rows.append(
            {
                "label": label,
                "configured": conf.config.text if conf and conf.config else None,
                "live": dict(live.value) if live else None,
                "by": live.by if live else None,
                "at": live.at if live else None,
                "known": None if state.app is None else conf is not None,
            }
        )
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("No live limits.")
        return
    for row in rows:
        live_text = "-" if row["live"] is None else _text(row["live"])
        since = "" if row["at"] is None else f"  (by {row['by']}, {format_time(row['at'])})"
        conf_text = f"  [configured: {row['configured']}]" if row["configured"] else ""
        if row["known"] is False:
            conf_text = f"  [app {state.app_name!r} has no such limit: no worker uses it]"
        click.echo(f"{row['label']}: {live_text}{conf_text}{since}")


@limits.command("set")
@click.argument("label")
@click.argument("rules", required=False)
@click.option("--algorithm", help="Algorithm for these rules (default: the app's).")
@click.option("--concurrency", type=click.IntRange(min=1), help="At most this many at once.")
@click.option("--shadow", is_flag=True, help="Count and log what it would defer; defer nothing.")
@click.option("--fair-by", help="Share it fairly between tenants: a task argument's name.")
@click.option(
    "--weight",
    "weights",
    multiple=True,
    metavar="TENANT=W",
    help="A tenant's weight under --fair-by (default 1; repeat for several).",
)
@click.option("--by", "by", help="Who (default: user@host).")
@_json
@pass_state
def set_command(
    state: State,
    label: str,
    rules: str | None,
    algorithm: str | None,
    concurrency: int | None,
    shadow: bool,
    fair_by: str | None,
    weights: tuple[str, ...],
    by: str | None,
    as_json: bool,
) -> None:
    """Replace LABEL's limit for every worker with RULES (and/or --concurrency)."""
    from ..errors import GovernorError

    if rules is None and concurrency is None:
        raise CliError("give RULES (e.g. '20/s, 800/d'), --concurrency N, or both")
    label = _label(state, label)
    value: dict[str, Any] = {}
    if rules is not None:
        value["rules"] = rules
    if algorithm is not None:
        value["algorithm"] = algorithm
    if concurrency is not None:
        value["concurrency"] = concurrency
    if shadow:
        value["shadow"] = True
    if fair_by is not None:
        value["fair_by"] = fair_by
    if weights:
        value["weights"] = _weights(weights)
    settings = None
    if state.app is not None:
        from .apps import settings_of

        settings = settings_of(state.app)
    who = by or f"{getpass.getuser()}@{socket.gethostname()}"
    try:
        entry = _live(state).set(label, value, who, settings)
    except GovernorError as exc:
        raise CliError(str(exc)) from None
    if as_json:
        echo_json({"label": label, "live": value, "by": entry.by, "at": entry.at})
    else:
        click.echo(f"{label}: {_text(value)} for every worker (by {entry.by}).")


@limits.command("reset")
@click.argument("label")
@_json
@pass_state
def reset_command(state: State, label: str, as_json: bool) -> None:
    """Drop LABEL's live limit: workers go back to the configuration."""
    label = _label(state, label)
    removed = _live(state).reset(label)
    if as_json:
        echo_json({"label": label, "removed": removed})
    elif removed:
        click.echo(f"{label}: back to the configuration.")
    else:
        click.echo(f"{label} had no live limit.")


def _weights(given: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for item in given:
        tenant, eq, number = item.rpartition("=")
        try:
            out[tenant] = float(number)
        except ValueError:
            tenant = ""
        if not eq or not tenant:
            raise CliError(f"--weight takes TENANT=WEIGHT, got {item!r}")
    return out


def _text(value: dict[str, Any]) -> str:
    parts = [str(value["rules"])] if value.get("rules") else []
    if value.get("concurrency") is not None:
        parts.append(f"{value['concurrency']} at once")
    if value.get("algorithm"):
        parts.append(str(value["algorithm"]))
    if value.get("fair_by"):
        weights = value.get("weights") or {}
        shown = "".join(f", {t} x{w:g}" for t, w in sorted(weights.items()))
        parts.append(f"fair by {value['fair_by']}{shown}")
    return ", ".join(parts) + (" (shadow)" if value.get("shadow") else "")
