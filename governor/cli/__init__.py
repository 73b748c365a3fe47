"""``governor``: see and steer governor's limits from a shell.

::

    governor status                                 every limit: usage bars, blocks, bookings
    governor inspect NAME SUBJECT                   one subject in detail (exit 1: denied now)
    governor block NAME SUBJECT --for 2h --reason "runaway client"
    governor unblock NAME SUBJECT
    governor reset NAME SUBJECT [--yes]
    governor top [--once] [--interval 1]            live usage per configured limit
    governor plan "1/s, 20/m, 200/h, 800/d" --jobs 10000    (offline, no Redis)
    governor -A proj submit TASK calls.jsonl        book and enqueue a batch (progress bar)
    governor demo [--rules "20/s, 300/m"] [--json]  a local flood across two worker nodes
    governor -A proj limits set queue:emails "20/s"  change a limit for every worker (show, reset)

    governor -A proj status                         limits from a Celery app's configuration
    celery -A proj governor status                  the same, as a Celery sub-command

Exit codes: 0 ok, 1 a check failed, 2 usage error, 3 Redis unreachable (see
:mod:`governor.cli.common`). Each command lives in its own module, imported on first use;
register a new one with one line in :data:`COMMANDS`.
"""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from .common import DEFAULT_REDIS_URL, GovernorGroup, State

__all__ = ["COMMANDS", "celery_command", "cli", "main"]

COMMANDS: dict[str, str] = {
    "status": "status:status",
    "inspect": "inspect:inspect_command",
    "block": "admin:block",
    "unblock": "admin:unblock",
    "reset": "admin:reset",
    "top": "top:top",
    "plan": "plan:plan_command",
    "submit": "submit:submit",
    "demo": "demo:demo",
    "limits": "live:limits",
}
"""Command name -> ``module:attribute`` under ``governor.cli``."""

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
EPILOG = (
    "Exit codes: 0 ok; 1 a check failed (inspect: blocked or full); 2 usage error (bad option, "
    "duration, rule, Redis URL, unknown limit); 3 Redis unreachable."
)


def _celery_app(obj: Any) -> Any | None:
    """The Celery app in a parent's context object: celery's ``CLIContext`` or an app given
    as ``obj`` (e.g. ``CliRunner().invoke(cli, [...], obj=app)``)."""
    if obj is None or isinstance(obj, State):
        return None
    if hasattr(obj, "conf") and hasattr(obj, "tasks"):
        return obj
    return getattr(obj, "app", None)


def _setup(ctx: click.Context, redis_url: str | None, prefix: str | None, app: str | None) -> None:
    from .apps import load_app, settings_of

    celery_app = load_app(app) if app else _celery_app(ctx.obj)
    settings = None
    if celery_app is not None:
        settings = settings_of(celery_app)
        app_name = str(celery_app.main)

    given = ctx.get_parameter_source("redis_url") == ParameterSource.COMMANDLINE
    if redis_url and given:
        url, source = redis_url, "--redis-url"
    elif settings is not None and settings.redis_url:
        url, source = settings.redis_url, f"app {app_name!r}"
    elif redis_url:
        url, source = redis_url, "GOVERNOR_REDIS_URL"
    else:
        url, source = DEFAULT_REDIS_URL, "the default"

    given = ctx.get_parameter_source("prefix") == ParameterSource.COMMANDLINE
    if not (prefix and given) and settings is not None:
        prefix = settings.prefix
    ctx.obj = State(
        redis_url=url, prefix=prefix or "governor", app=celery_app, redis_url_from=source
    )


_REDIS_HELP = (
    f"Redis holding governor's state [env GOVERNOR_REDIS_URL; else the app's; else "
    f"{DEFAULT_REDIS_URL}]"
)
_PREFIX_HELP = "key prefix [env GOVERNOR_PREFIX; else the app's governor_prefix; else governor]"


@click.group(cls=GovernorGroup, lazy=COMMANDS, context_settings=CONTEXT, epilog=EPILOG)
@click.option("--redis-url", envvar="GOVERNOR_REDIS_URL", metavar="URL", help=_REDIS_HELP)
@click.option("--prefix", envvar="GOVERNOR_PREFIX", help=_PREFIX_HELP)
@click.option(
    "-A",
    "--app",
    metavar="APP",
    help="Celery app whose limits to show: module, module.attr or module:attr",
)
@click.version_option(package_name="governor", prog_name="governor")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, prefix: str | None, app: str | None) -> None:
    """Global, exact rate limits for Celery tasks: inspect and steer them in Redis."""
    _setup(ctx, redis_url, prefix, app)


@click.group("governor", cls=GovernorGroup, lazy=COMMANDS, context_settings=CONTEXT, epilog=EPILOG)
@click.option("--redis-url", envvar="GOVERNOR_REDIS_URL", metavar="URL", help=_REDIS_HELP)
@click.option("--prefix", envvar="GOVERNOR_PREFIX", help=_PREFIX_HELP)
@click.pass_context
def celery_command(ctx: click.Context, redis_url: str | None, prefix: str | None) -> None:
    """governor's limits for this Celery app (status, inspect, block, top, plan...)."""
    _setup(ctx, redis_url, prefix, None)


def main(argv: list[str] | None = None) -> None:
    """The ``governor`` console script."""
    cli.main(args=argv, prog_name="governor", auto_envvar_prefix=None)
