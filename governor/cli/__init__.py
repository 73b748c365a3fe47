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
    governor doctor [--json]                        deployment checks (exit 1: something is wrong)
    governor -A proj dashboard [--port 8055]        a live web page of every limit (read-only)
    governor dead-letters list                      waiting tasks that could not be read (show,
                                                    redrive, drop)

    governor -A proj status                         limits from a Celery app's configuration
    celery -A proj governor status                  the same, as a Celery sub-command
    governor --redis-url "sentinel://h1:26379;sentinel://h2:26379/0" --sentinel-master gov status
    governor --redis-url redis://h1:7000,h2:7000 --cluster status

Exit codes: 0 ok, 1 a check failed, 2 usage error, 3 Redis unreachable (see
:mod:`governor.cli.common`). Each command lives in its own module, imported on first use;
register a new one with one line in :data:`COMMANDS`.
"""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from .common import DEFAULT_REDIS_URL, CliError, GovernorGroup, State

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
    "doctor": "doctor:doctor",
    "dashboard": "dashboard:dashboard",
    "dead-letters": "dead_letters:dead_letters",
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


def _setup(
    ctx: click.Context,
    redis_url: str | None,
    prefix: str | None,
    app: str | None,
    sentinel_master: str | None = None,
    cluster: bool = False,
) -> None:
    from .apps import load_app, settings_of

    celery_app = load_app(app) if app else _celery_app(ctx.obj)
    settings = None
    if celery_app is not None:
        settings = settings_of(celery_app)
        app_name = str(celery_app.main)

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE

    target = None
    if redis_url and given("redis_url"):
        url, source = redis_url, "--redis-url"
    elif settings is not None and settings.redis is not None:
        target = settings.redis
        url = target.describe() if target.kind == "factory" else target.url
        source = f"app {app_name!r}"
        flags = [
            f
            for f, name in (("--sentinel-master", "sentinel_master"), ("--cluster", "cluster"))
            if given(name)
        ]
        if flags:
            raise CliError(
                f"{' and '.join(flags)} {'apply' if len(flags) > 1 else 'applies'} to "
                f"--redis-url; without it the Redis of app "
                f"{app_name!r} is used as its settings say (governor_redis_*)"
            )
    elif redis_url:
        url, source = redis_url, "GOVERNOR_REDIS_URL"
    else:
        url, source = DEFAULT_REDIS_URL, "the default"

    if not (prefix and given("prefix")) and settings is not None:
        prefix = settings.prefix
    ctx.obj = State(
        redis_url=url,
        prefix=prefix or "governor",
        app=celery_app,
        redis_url_from=source,
        sentinel_master=sentinel_master or None,
        cluster=bool(cluster),
        target=target,
    )


_REDIS_HELP = (
    f"Redis holding governor's state [env GOVERNOR_REDIS_URL; else the app's; else "
    f"{DEFAULT_REDIS_URL}]"
)
_PREFIX_HELP = "key prefix [env GOVERNOR_PREFIX; else the app's governor_prefix; else governor]"
_MASTER_HELP = (
    "with a sentinel:// URL (sentinels separated by ';'): the master's name "
    "[env GOVERNOR_SENTINEL_MASTER]"
)
_CLUSTER_HELP = (
    "the URL lists a Redis Cluster's nodes: redis://h1:7000,h2:7000 [env GOVERNOR_REDIS_CLUSTER]"
)


def _redis_options(command: Any) -> Any:
    """--redis-url, --sentinel-master, --cluster and --prefix (both entry points)."""
    for option in reversed(
        [
            click.option(
                "--redis-url", envvar="GOVERNOR_REDIS_URL", metavar="URL", help=_REDIS_HELP
            ),
            click.option(
                "--sentinel-master",
                envvar="GOVERNOR_SENTINEL_MASTER",
                metavar="NAME",
                help=_MASTER_HELP,
            ),
            click.option(
                "--cluster", is_flag=True, envvar="GOVERNOR_REDIS_CLUSTER", help=_CLUSTER_HELP
            ),
            click.option("--prefix", envvar="GOVERNOR_PREFIX", help=_PREFIX_HELP),
        ]
    ):
        command = option(command)
    return command


@click.group(cls=GovernorGroup, lazy=COMMANDS, context_settings=CONTEXT, epilog=EPILOG)
@_redis_options
@click.option(
    "-A",
    "--app",
    metavar="APP",
    help="Celery app whose limits to show: module, module.attr or module:attr",
)
@click.version_option(package_name="governor", prog_name="governor")
@click.pass_context
def cli(
    ctx: click.Context,
    redis_url: str | None,
    sentinel_master: str | None,
    cluster: bool,
    prefix: str | None,
    app: str | None,
) -> None:
    """Global, exact rate limits for Celery tasks: inspect and steer them in Redis."""
    _setup(ctx, redis_url, prefix, app, sentinel_master, cluster)


@click.group("governor", cls=GovernorGroup, lazy=COMMANDS, context_settings=CONTEXT, epilog=EPILOG)
@_redis_options
@click.pass_context
def celery_command(
    ctx: click.Context,
    redis_url: str | None,
    sentinel_master: str | None,
    cluster: bool,
    prefix: str | None,
) -> None:
    """governor's limits for this Celery app (status, inspect, block, top, plan...)."""
    _setup(ctx, redis_url, prefix, None, sentinel_master, cluster)


def main(argv: list[str] | None = None) -> None:
    """The ``governor`` console script."""
    cli.main(args=argv, prog_name="governor", auto_envvar_prefix=None)
