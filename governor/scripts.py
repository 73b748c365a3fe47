"""The Lua scripts, loaded from ``governor/lua`` and shared by the sync and asyncio limiters."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources

__all__ = ["LuaScript", "algorithm_script", "block_script"]


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
def plain_script(name: str) -> LuaScript:
    """A standalone script (no prelude): block, park, release."""
    return _make(name, _read(name))
