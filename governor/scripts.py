"""The Lua scripts, loaded from ``governor/lua`` and shared by the sync and asyncio limiters."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from .errors import StorageUnavailable

__all__ = [
    "LuaScript",
    "algorithm_script",
    "block_script",
    "cap_ops_script",
    "capped_script",
    "package_script",
    "run_script",
]


@dataclass(frozen=True, slots=True)
class LuaScript:
    """Script text and its SHA1, for EVALSHA with an EVAL fallback."""

    name: str
    text: str
    sha: str


def _read(name: str) -> str:
    return (resources.files("governor") / "lua" / f"{name}.lua").read_text("utf-8")


def _make(name: str, text: str) -> LuaScript:
    return LuaScript(name, text, hashlib.sha1(text.encode("utf-8")).hexdigest())


@cache
def algorithm_script(name: str) -> LuaScript:
    """An algorithm script with the shared prelude (``common.lua``) in front."""
    return _make(name, _read("common") + "\n" + _read(name))


@cache
def block_script() -> LuaScript:
    return _make("block", _read("block"))


@cache
def pause_script() -> LuaScript:
    return _make("pause", _read("pause"))


@cache
def plain_script(name: str) -> LuaScript:
    """A standalone script of ``governor/lua`` (no prelude): block, pause."""
    return _make(name, _read(name))


@cache
def package_script(package: str, name: str) -> LuaScript:
    """``<name>.lua`` from ``package``'s own directory: the Celery layer's scripts live beside
    the modules that run them (``package_script("governor.celery.waiting", "park")``)."""
    return _make(name, (resources.files(package) / f"{name}.lua").read_text("utf-8"))


def run_script(client: Any, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
    """EVALSHA, loading the script on ``NOSCRIPT``; a Redis that does not answer is
    :class:`~governor.errors.StorageUnavailable` (callers choose what an outage means)."""
    try:
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(script.text, len(keys), *keys, *args)
    except (RedisError, RedisClusterException) as exc:
        raise StorageUnavailable(f"Redis did not answer ({script.name}.lua): {exc}") from exc


@cache
def capped_script(algorithm: str | None) -> LuaScript:
    """A decision under rules (``algorithm``; None: no rules) and a concurrency cap at once:
    the algorithm runs as a function, ``rate()``, between the cap's check and its taking."""
    if algorithm is None:
        rate = _read("cap_none")  # a cap without rules: only a block denies; bookings hold nothing
    else:
        rate = f"local function rate()\n{_read(algorithm)}\nend"
    parts = [_read("common"), _read("cap"), rate, _read("cap_decide")]
    return _make(f"capped_{algorithm or 'none'}", "\n".join(parts))


@cache
def cap_ops_script() -> LuaScript:
    """The cap's own operations: release, renew, wait, cancel, sweep, usage."""
    return _make("cap_ops", "\n".join([_read("common"), _read("cap"), _read("cap_ops")]))
