"""governor's pytest plugin, as a project that installs governor gets it: registered by its entry
point, run in a separate pytest process on a small project of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.servers import ServerHandle

APP = """
from celery import Celery
from governor.celery import Governor

app = Celery("proj", broker="memory://")
app.conf.governor_redis_url = "redis://127.0.0.1:1/0"  # production's: never used by the tests
governor = Governor(app)
seen = []

@governor.task("2/s", key=lambda customer, **_: customer, name="proj.call_partner")
def call_partner(customer):
    seen.append(customer)
"""

TESTS = """
import pytest
from proj import call_partner, seen

def test_limits_applied(governor_limits, governor_clock):
    for _ in range(3):
        call_partner.delay("acme")
    assert seen == ["acme", "acme"]
    [denied] = governor_limits.denials
    assert (denied.rule, denied.retry_after) == ("2/s", 1.0)
    governor_limits.assert_denied(call_partner.s("acme"), rule="2/s", retry_after=1.0)
    governor_clock.advance(1)
    governor_limits.assert_admitted(call_partner.s("acme"))

def test_limits_off(governor_limits_off):
    for _ in range(3):
        call_partner.delay("acme")
    assert len(governor_limits_off.calls) == 3 and governor_limits_off.denials == []
"""


def run_pytest(folder: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(folder), **(env or {})},
    )
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


def project(folder: Path, tests: str, ini: str = "governor_app = proj:app") -> Path:
    (folder / "proj.py").write_text(textwrap.dedent(APP))
    (folder / "test_proj.py").write_text(textwrap.dedent(tests))
    (folder / "pytest.ini").write_text(f"[pytest]\n{ini}\n")
    return folder


def test_a_project_tests_its_governed_task_with_the_fixtures(tmp_path: Path) -> None:
    out = run_pytest(project(tmp_path, TESTS))  # its own private redis-server
    assert out.startswith("exit 0") and "2 passed" in out, out


def test_a_redis_named_by_the_environment(tmp_path: Path, redis_server: ServerHandle) -> None:
    env = {"GOVERNOR_TEST_REDIS_URL": redis_server.url(4)}
    out = run_pytest(project(tmp_path, TESTS), env=env)
    assert out.startswith("exit 0") and "2 passed" in out, out


def test_without_governor_app_the_error_says_what_to_set(tmp_path: Path) -> None:
    out = run_pytest(project(tmp_path, TESTS, ini=""))
    assert "set governor_app = 'package.module:attribute'" in out, out


def test_suites_that_do_not_use_it_import_nothing_of_it(tmp_path: Path) -> None:
    tests = """
    import sys

    def test_nothing_heavy_was_imported():
        assert not {"celery", "redis", "governor.testing.session"} & set(sys.modules)
    """
    (tmp_path / "test_plain.py").write_text(textwrap.dedent(tests))
    out = run_pytest(tmp_path)
    assert out.startswith("exit 0") and "1 passed" in out, out
    listed = run_pytest(tmp_path, "--fixtures")
    for name in ("governor_limits", "governor_limits_off", "governor_clock", "governor_redis_url"):
        assert name in listed, listed


def test_the_plugin_is_registered_as_governor(tmp_path: Path) -> None:
    out = run_pytest(project(tmp_path, TESTS), "-p", "no:governor")
    assert "fixture 'governor_limits' not found" in out, out
