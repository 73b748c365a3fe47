"""Every Lua script says what it takes and what it includes, and every include resolves.

Scripts are `.lua` files whose header (the comment lines they open with) gives KEYS, ARGV and
the return value; `-- @include <name>` and `-- @rate` are resolved by governor/scripts.py.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import governor
from governor.algorithms import ALGORITHMS
from governor.errors import ScriptError
from governor.scripts import (
    DIRECTIVE,
    algorithm_script,
    cap_ops_script,
    capped_script,
    package_script,
    resolve,
)

ROOT = Path(governor.__file__).resolve().parent
SCRIPTS = sorted(ROOT.rglob("*.lua"))
RATES = {"cap_none"} | {a.script for a in ALGORITHMS.values()}
"""Scripts run as `rate()` in cap_decide.lua (never loaded on their own: cap_none)."""


def header(path: Path) -> str:
    lines = []
    for line in path.read_text("utf-8").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def package_of(path: Path) -> str:
    return ".".join(("governor", *path.parent.relative_to(ROOT).parts))


def test_scripts_found() -> None:
    names = {p.stem for p in SCRIPTS}
    assert {"common", "cap", "cap_decide", "cap_ops", "block", "pause", "take_due"} <= names
    assert names >= RATES


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_header_names_keys_argv_and_return(path: Path) -> None:
    head = header(path)
    assert head.startswith(f"-- {path.name}:"), f"{path.name} opens with its name"
    for word in ("KEYS", "ARGV"):
        assert word in head, f"{path.relative_to(ROOT)}'s header does not say {word}"
    # what it returns (common.lua: the replies its helpers build, for the scripts it opens)
    assert re.search(r"\breturns?\b|\breply\b", head, re.IGNORECASE), path.name


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_include_resolves(path: Path) -> None:
    text = path.read_text("utf-8")
    for kind, name in DIRECTIVE.findall(text):
        if kind == "include":
            found = [d / f"{name}.lua" for d in (path.parent, ROOT / "lua")]
            assert any(f.is_file() for f in found), f"{path.name} includes {name!r}: not found"
    if "-- @rate" in text:
        for rate in sorted(RATES):
            assert "local function rate()" in resolve(package_of(path), path.stem, rate)
    elif path.stem not in RATES:
        resolved = resolve(package_of(path), path.stem)
        assert not any(
            k == "include" and n not in {p.stem for p in SCRIPTS}
            for k, n in DIRECTIVE.findall(resolved)
        )


def test_each_file_is_included_once() -> None:
    for script in [
        *(algorithm_script(a.script) for a in ALGORITHMS.values()),
        *(capped_script(a.script) for a in ALGORITHMS.values()),
        capped_script(None),
        cap_ops_script(),
    ]:
        text = script.text
        assert text.count("-- common.lua:") == 1, script.name
        assert text.count("local min, max, ceil = ") == 1, script.name
        if script.name.startswith("cap"):
            assert text.count("-- cap.lua:") == 1 and text.count("local cap_at =") == 1
    capped = capped_script("gcra").text
    assert capped.index("-- common.lua:") < capped.index("-- cap.lua:")
    assert capped.index("-- cap.lua:") < capped.index("local function rate()\n-- gcra.lua:")


def test_every_script_compiles_in_redis(r: redis.Redis) -> None:
    """SCRIPT LOAD compiles each resolved script (a bad include would show here too)."""
    scripts = [
        *(algorithm_script(a.script) for a in ALGORITHMS.values()),
        *(capped_script(a.script) for a in ALGORITHMS.values()),
        capped_script(None),
        cap_ops_script(),
        *(package_script(package_of(p), p.stem) for p in SCRIPTS if p.parent != ROOT / "lua"),
    ]
    for script in scripts:
        assert r.script_load(script.text) == script.sha, script.name


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An importable package of scripts made up by a test."""
    folder = tmp_path / "scratch_lua"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        yield "scratch_lua", folder
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("scratch_lua", None)


def test_includes_nest_in_place_at_most_once(scratch: tuple[str, Path]) -> None:
    package, folder = scratch
    (folder / "a.lua").write_text("-- a.lua\n-- @include b\n-- @include common\nlocal a = 1\n")
    (folder / "b.lua").write_text("-- b.lua\n-- @include common\nlocal b = 2\n")
    (folder / "top.lua").write_text("-- top.lua\n-- @include a\n-- @include b\nreturn a + b\n")
    text = resolve(package, "top")
    assert text.count("-- common.lua:") == 1  # b's, first; a's second include is left a comment
    assert text.index("-- b.lua") < text.index("-- common.lua:") < text.index("local b = 2")
    assert text.index("local b = 2") < text.index("local a = 1") < text.index("return a + b")
    assert text.count("-- b.lua") == 1


def test_a_missing_include_is_a_clear_error(scratch: tuple[str, Path]) -> None:
    package, folder = scratch
    (folder / "top.lua").write_text("-- top.lua\n-- @include nowhere\nreturn 1\n")
    with pytest.raises(ScriptError, match=r"scratch_lua/top.lua includes 'nowhere'"):
        package_script(package, "top")
    (folder / "bad.lua").write_text("-- bad.lua\n-- @include\nreturn 1\n")
    with pytest.raises(ScriptError, match="needs a script name"):
        resolve(package, "bad")


def test_rate_needs_its_place_and_a_script(scratch: tuple[str, Path]) -> None:
    package, folder = scratch
    (folder / "decide.lua").write_text("-- decide.lua\n-- @rate\nreturn rate()\n")
    with pytest.raises(ScriptError, match="needs one rules script"):
        resolve(package, "decide")
    assert "local function rate()\n-- gcra.lua:" in resolve(package, "decide", "gcra")
    with pytest.raises(ScriptError, match="has no '-- @rate'"):
        resolve("governor.lua", "cap_ops", "gcra")
