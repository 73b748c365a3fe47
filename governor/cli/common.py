"""What every ``governor`` command shares: the context object, errors and exit codes, durations.

Commands get a :class:`State` with ``@pass_state`` and raise :class:`CliError` (or let a
governor / redis error escape): :class:`GovernorGroup` turns those into one line on stderr and
an exit code, never a traceback.

=====  ==============================================================================
code   meaning
=====  ==============================================================================
0      ok
1      a check failed: the subject is blocked or full (``inspect``), Redis refused
2      usage error: bad option, duration, rule, URL, unknown limit name, bad Celery app
3      Redis unreachable
=====  ==============================================================================
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import click
import redis
from redis.exceptions import AuthenticationError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..connect import Names, RedisTarget, close_client, mask_url, target
from ..errors import GovernorError, StorageUnavailable

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CliError",
    "Duration",
    "FloatParam",
    "GovernorGroup",
    "State",
    "echo_json",
    "format_duration",
    "format_time",
    "json_number",
    "mask_url",
    "parse_duration",
    "pass_state",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
DEFAULT_REDIS_URL = "redis://localhost:6379/0"


class CliError(click.ClickException):
    """A user error: printed as ``Error: <message>`` with ``exit_code`` (no traceback). The
    message goes through :func:`mask_url`: whatever it quotes (an exception's text, a worker's
    log), no password is printed."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(mask_url(message))
        setattr(self, "exit_code", exit_code)  # noqa: B010 (click declares it a ClassVar)


# -- durations --------------------------------------------------------------------------------

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """Seconds in ``"90s"``, ``"15m"``, ``"2h"``, ``"1d"``, ``"1h30m"``, ``"500ms"`` or ``"45"``.

    >>> parse_duration("1h30m")
    5400.0
    """
    raw = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        value = float(raw)
    elif raw and _PART.sub("", raw) == "":
        value = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(raw))
    else:
        raise ValueError(
            f"{text!r} is not a duration: write e.g. 90s, 15m, 2h, 1d or 1h30m "
            "(units ms, s, m, h, d, w; a bare number is seconds)"
        )
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"duration {text!r} must be longer than zero")
    return value


if TYPE_CHECKING:  # click >= 8.4 makes ParamType generic; older ones cannot be subscripted
    FloatParam = click.ParamType[float]
else:
    FloatParam = click.ParamType


class Duration(FloatParam):
    """A click option type for :func:`parse_duration` (bad input exits 2 with the fix)."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def format_duration(seconds: float) -> str:
    """``0.25s``, ``4.5s``, ``42s``, ``1h 30m``, ``12d 1h 9m 19s``; ``never`` for infinity.

    >>> format_duration(1040959), format_duration(0.4), format_duration(0)
    ('12d 1h 9m 19s', '0.4s', '0s')
    """
    if math.isinf(seconds):
        return "never"
    if seconds <= 0:
        return "0s"
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.3g}s"
    total = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts)


def format_time(unix: float) -> str:
    """A Unix time as local ISO text with the offset, to the second."""
    return datetime.fromtimestamp(unix, timezone.utc).astimezone().isoformat(timespec="seconds")


def json_number(value: float) -> float | None:
    """JSON has no infinity: ``never`` becomes null."""
    return None if math.isinf(value) or math.isnan(value) else round(value, 6)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


# -- the context object -----------------------------------------------------------------------


@dataclass
class State:
    """Options and lazily made resources shared by the commands of one invocation."""

    redis_url: str
    prefix: str
    app: Any | None = None
    redis_url_from: str = "default"
    sentinel_master: str | None = None
    """``--sentinel-master`` (GOVERNOR_SENTINEL_MASTER): the URL is a Sentinel URL."""
    cluster: bool = False
    """``--cluster`` (GOVERNOR_REDIS_CLUSTER): the URL lists a Redis Cluster's nodes."""
    target: RedisTarget | None = None
    """The app's way to Redis (with ``-A``, unless --redis-url is given)."""
    cache: dict[str, Any] = field(default_factory=dict, repr=False)
    """Per-invocation memo (e.g. the app's configured limits, read once for every top frame)."""
    _client: redis.Redis | None = field(default=None, repr=False)

    @property
    def app_name(self) -> str | None:
        """The Celery app's name (``app.main``), or None without an app."""
        return None if self.app is None else str(self.app.main)

    def redis_target(self) -> RedisTarget:
        """How to reach Redis: the app's, or the URL and flags given (checked, not connected)."""
        if self.target is not None:
            return self.target
        names = Names(
            url=self.redis_url_from,
            options="--sentinel-master",
            cluster="--cluster",
            master="--sentinel-master NAME (or GOVERNOR_SENTINEL_MASTER)",
        )
        options = {"master_name": self.sentinel_master} if self.sentinel_master else None
        try:
            return target(self.redis_url, cluster=self.cluster, options=options, names=names)
        except GovernorError as exc:
            raise CliError(str(exc)) from None

    def target_kind(self) -> str:
        """``redis``, ``sentinel``, ``cluster`` or ``factory``."""
        return self.redis_target().kind

    @property
    def client(self) -> redis.Redis:
        """The Redis client, made on first use (``plan`` never makes one)."""
        if self._client is None:
            self._client = self.redis_target().client(
                socket_connect_timeout=3.0, socket_timeout=10.0
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            close_client(self._client)
            self._client = None


pass_state = click.make_pass_decorator(State)
"""Give a command the :class:`State` as its first argument."""


# -- error handling ---------------------------------------------------------------------------


def _state(given: State | None) -> State | None:
    """The given state, else the current click command's (None outside of one)."""
    ctx = click.get_current_context(silent=True)
    return given if given is not None or ctx is None else ctx.find_object(State)


def _redis_message(exc: Exception, state: State | None = None) -> str:
    state = _state(state)
    where = f" at {mask_url(state.redis_url)}" if state else ""
    if isinstance(exc, AuthenticationError):
        return (
            f"Redis{where} refused the credentials: {mask_url(str(exc))}. Fix the password in "
            "--redis-url"
        )
    return (
        f"cannot reach Redis{where}: {mask_url(str(exc)).rstrip('.')}. Is it running? Point "
        "--redis-url or GOVERNOR_REDIS_URL at it (e.g. redis://localhost:6379/0)"
    )


@contextlib.contextmanager
def user_errors(state: State | None = None) -> Iterator[None]:
    """Turn governor and redis errors into :class:`CliError` with the right exit code
    (``state`` names the Redis in messages; by default the current command's)."""
    try:
        yield
    except click.ClickException:
        raise
    except (
        StorageUnavailable,
        RedisConnectionError,
        RedisTimeoutError,
        RedisClusterException,
    ) as exc:
        raise CliError(_redis_message(exc, state), EXIT_UNREACHABLE) from None
    except GovernorError as exc:
        # bad input (ConfigError, RuleError, CostError, SubjectError) is a usage error;
        # StateError (a key holding something else) and the like are failures
        code = EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILED
        raise CliError(str(exc), code) from None
    except RedisError as exc:
        if "DB index is out of range" in str(exc):
            state = _state(state)
            where = f" {mask_url(state.redis_url)!r}" if state else ""
            raise CliError(
                f"bad Redis URL{where}: that server has no such database ({exc})", EXIT_USAGE
            ) from None
        raise CliError(f"Redis answered with an error: {exc}", EXIT_FAILED) from None


class GovernorGroup(click.Group):
    """A click group whose commands live in their own modules, imported on first use.

    ``lazy`` maps a command name to ``"module:attribute"`` under ``governor.cli``; adding a
    command is one line there. Importing lazily keeps ``celery`` start-up (which loads this
    group through its plugin entry point) fast, and a missing optional dependency (rich) only
    fails the commands that need it, with a message instead of a traceback.
    """

    def __init__(self, *args: Any, lazy: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: Mapping[str, str] = lazy if lazy is not None else {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in self.lazy:
            return found
        module, _, attr = self.lazy[cmd_name].partition(":")
        try:
            command = getattr(importlib.import_module(f"governor.cli.{module}"), attr)
        except ImportError as exc:
            return _unavailable(cmd_name, exc)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with user_errors():
                return super().invoke(ctx)
        finally:
            state = ctx.find_object(State)
            if state is not None:
                state.close()


def _unavailable(name: str, exc: ImportError) -> click.Command:
    missing = exc.name or str(exc)
    if missing.startswith("rich"):
        hint = "install governor's cli extra (pip install 'celery-governor[cli]')"
    elif missing.split(".")[0] in ("flask", "werkzeug", "jinja2", "markupsafe"):
        hint = "install governor's dashboard extra (pip install 'celery-governor[dashboard]')"
    else:
        hint = f"install {missing}"

    def fail() -> None:
        raise CliError(f"'governor {name}' needs {missing!r}, which is not installed: {hint}")

    return click.Command(name, callback=fail, help=f"(unavailable: {missing} is not installed)")
