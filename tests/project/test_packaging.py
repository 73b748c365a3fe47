"""The built distributions (``python -m build``): the wheel holds governor's code, every Lua
script, template and static file under governor/ (wherever they move), and nothing outside
governor/; the sdist holds no tests, benchmarks, example workers or docs; the metadata names
``celery-governor`` with the version written in ``governor/__init__.py``.

The wheel and sdist are built here from a copy of the checkout without what earlier builds left
(setuptools adds the files an old ``*.egg-info/SOURCES.txt`` lists to a new sdist, which would hide
a package-data glob that no longer matches), without build isolation (the test extra brings build
and setuptools); or read from ``GOVERNOR_DIST`` (a folder with both, as ``.ci/package`` builds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

import governor

ROOT = Path(__file__).resolve().parents[2]
LEFT_BY_BUILDS = ("*.egg-info", "build", "dist", "__pycache__", ".ci", ".git", ".*cache", ".venv")
DATA_DIRS = {"templates", "static"}
"""Folders under governor/ whose every file is package data."""


def package_files() -> set[str]:
    """What the wheel must hold of the source tree's governor/: modules, Lua scripts, py.typed,
    and every file in a templates/ or static/ folder (paths relative to the checkout)."""
    found = set()
    for path in (ROOT / "governor").rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(ROOT)
        if path.suffix in {".py", ".lua"} or path.name == "py.typed" or DATA_DIRS & set(rel.parts):
            found.add(rel.as_posix())
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    given = os.environ.get("GOVERNOR_DIST")
    if given:
        yield Path(given)
        return
    pytest.importorskip("build", reason="the test extra (build, setuptools) is not installed")
    out = tmp_path_factory.mktemp("dist")
    tree = tmp_path_factory.mktemp("tree") / "checkout"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*LEFT_BY_BUILDS), symlinks=True)
    # sdist first, then the wheel from the unpacked sdist (build's default): what a user gets
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield out


def only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {folder}, found {found}"
    return found[0]


def test_the_wheel_holds_governor_and_its_data_and_nothing_else(dist: Path) -> None:
    wheel = only(dist, "celery_governor-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if not n.endswith("/")}
    dist_info = f"celery_governor-{governor.__version__}.dist-info/"
    outside = sorted(n for n in names if not n.startswith(("governor/", dist_info)))
    assert outside == [], f"files outside governor/ in the wheel: {outside}"
    inside = {n for n in names if n.startswith("governor/")}
    expected = package_files()
    assert sorted(expected - inside) == [], "missing from the wheel"
    assert sorted(inside - expected) == [], "in the wheel but not a module or package data"
    # what the checks above rely on: the data is there in the source tree
    assert any(n.endswith(".lua") for n in expected)
    assert any("/templates/" in n for n in expected) and any("/static/" in n for n in expected)
    assert not any(part in {"tests", "bench", "workers"} for n in names for part in n.split("/"))
    assert f"{dist_info}licenses/LICENSE" in names


def test_the_sdist_holds_the_package_and_its_papers_only(dist: Path) -> None:
    sdist = only(dist, "celery_governor-*.tar.gz")
    top = f"celery_governor-{governor.__version__}/"
    with tarfile.open(sdist) as tf:
        names = {m.name.removeprefix(top) for m in tf.getmembers() if m.isfile()}
    papers = {"README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml", "PKG-INFO"}
    assert papers <= names
    allowed = papers | {"MANIFEST.in", "setup.cfg"}
    others = sorted(
        n
        for n in names
        if n not in allowed and not n.startswith(("governor/", "celery_governor.egg-info/"))
    )
    assert others == [], f"unexpected files in the sdist: {others}"
    assert sorted(package_files() - names) == [], "missing from the sdist"


def test_the_metadata(dist: Path) -> None:
    wheel = only(dist, "celery_governor-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(f"celery_governor-{governor.__version__}.dist-info/METADATA").decode()
        entry_points = zf.read(
            f"celery_governor-{governor.__version__}.dist-info/entry_points.txt"
        ).decode()
    meta = Parser().parsestr(text)
    assert meta["Name"] == "celery-governor"
    assert meta["Version"] == governor.__version__
    assert meta["License-Expression"] == "MIT"
    assert meta["Requires-Python"] == ">=3.10"
    requires = meta.get_all("Requires-Dist") or []
    assert any(r.startswith("redis") and "<9" in r for r in requires), requires
    assert any(r.startswith("celery[redis]") and "<5.8" in r for r in requires), requires
    urls = meta.get_all("Project-URL") or []
    assert any("github.com/governor-dev/celery-governor" in u for u in urls), urls
    assert "governor = governor.cli:main" in entry_points
    assert "governor = governor.cli:celery_command" in entry_points
