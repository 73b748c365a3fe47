"""The Lua scripts, loaded from ``governor/lua`` and shared by the sync and asyncio limiters.

A script says in its own text what it is made of, one directive a line:

- ``-- @include common`` puts ``common.lua`` there (looked up beside the script, then in
  ``governor/lua``), its own includes resolved the same way; each file goes in at most once,
  where it is first named (a later ``@include`` of it is left as the comment it is);
- ``-- @rate`` (``cap_decide.lua``) is where a capped decision puts its rules' script (from
  ``governor/lua``, its includes resolved as above) as ``local function rate() ... end``
  (``cap_none.lua`` for a cap without rules).

A directive naming a file that does not exist, or an ``@rate`` with nothing to put there, is a
:class:`ScriptError` when the script is loaded.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from .errors import ScriptError, StorageUnavailable

__all__ = [
    "LuaScript",
    "ScriptError",
    "algorithm_script",
    "block_script",
    "cap_ops_script",
    "capped_script",
    "package_script",
    "resolve",
    "run_script",
]

LUA = "governor.lua"
"""Where the core's scripts live (and where an include not found beside its script is looked up)."""
DIRECTIVE = re.compile(r"^--[ \t]*@(include|rate)\b[ \t]*(\S*)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class LuaScript:
    """Script text and its SHA1, for EVALSHA with an EVAL fallback."""

    name: str
    text: str
    sha: str


def _file(package: str, name: str) -> Traversable:
    return resources.files(package) / f"{name}.lua"


def _place(package: str) -> str:
    return package.replace(".", "/")


def resolve(package: str, name: str, rate: str | None = None) -> str:
    """The text of ``<name>.lua`` in ``package``, its directives resolved (see the module).
    ``rate``: the script of ``governor/lua`` that ``-- @rate`` wraps as ``rate()``."""
    seen: set[str] = set()
    used_rate = [False]

    def text_of(pkg: str, file: str, by: str | None) -> str:
        for where in dict.fromkeys([pkg, LUA]):
            path = _file(where, file)
            if path.is_file():
                seen.add(file)
                return expand(where, file, path.read_text("utf-8"))
        raise ScriptError(
            f"{by} includes {file!r}: there is no {_place(pkg)}/{file}.lua"
            + (f" nor {_place(LUA)}/{file}.lua" if pkg != LUA else "")
            if by
            else f"no script {_place(pkg)}/{file}.lua"
        )

    def expand(pkg: str, file: str, text: str) -> str:
        def directive(match: re.Match[str]) -> str:
            kind, arg = match.group(1), match.group(2)
            at = f"{_place(pkg)}/{file}.lua"
            if kind == "rate":
                if rate is None or used_rate[0] or arg:
                    raise ScriptError(f"{at}: '-- @rate' needs one rules script to put there")
                used_rate[0] = True
                return f"local function rate()\n{text_of(LUA, rate, at)}\nend"
            if not re.fullmatch(r"[A-Za-z0-9_]+", arg):
                raise ScriptError(f"{at}: '-- @include' needs a script name, got {arg!r}")
            return match.group(0) if arg in seen else text_of(pkg, arg, at)

        return DIRECTIVE.sub(directive, text)

    out = text_of(package, name, None)
    if rate is not None and not used_rate[0]:
        raise ScriptError(f"{_place(package)}/{name}.lua has no '-- @rate' for its rules")
    return out


def _make(name: str, text: str) -> LuaScript:
    return LuaScript(name, text, hashlib.sha1(text.encode("utf-8")).hexdigest())


@cache
def algorithm_script(name: str) -> LuaScript:
    """An algorithm script (it includes ``common.lua``, the prelude every algorithm shares)."""
    return _make(name, resolve(LUA, name))


@cache
def block_script() -> LuaScript:
    return plain_script("block")


@cache
def pause_script() -> LuaScript:
    return plain_script("pause")


@cache
def plain_script(name: str) -> LuaScript:
    """A script of ``governor/lua`` (block, pause), its includes resolved."""
    return _make(name, resolve(LUA, name))


@cache
def package_script(package: str, name: str) -> LuaScript:
    """``<name>.lua`` from ``package``'s own directory: the Celery layer's scripts live beside
    the modules that run them (``package_script("governor.celery.waiting", "park")``)."""
    return _make(name, resolve(package, name))


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
    ``cap_decide.lua`` with the algorithm as ``rate()`` where it says ``-- @rate``, between the
    cap's check and its taking."""
    rate = algorithm or "cap_none"  # a cap without rules: only a block denies
    return _make(f"capped_{rate}", resolve(LUA, "cap_decide", rate))


@cache
def cap_ops_script() -> LuaScript:
    """The cap's own operations: release, renew, wait, cancel, sweep, usage."""
    return _make("cap_ops", resolve(LUA, "cap_ops"))
