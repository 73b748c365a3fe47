"""Testing code that uses governor: an app's governed tasks, run eagerly in tests, with its
limits applied on a clock the test steps (or switched off), and assertions on what they deny.

>>> from governor.testing import Clock, governed
>>> clock = Clock()
>>> with governed(app, "apply", clock=clock) as gov:
...     for _ in range(5):
...         call_partner.delay("acme", {})
...     call_partner.delay("acme", {})          # the sixth in a second: denied, not run
...     assert gov.denials[0].rule == "5/s"
...     gov.assert_denied(call_partner.s("acme", {}), rule="5/s", retry_after=1.0)
...     clock.advance(1.0)
...     gov.assert_admitted(call_partner.s("acme", {}))

The pytest plugin (:mod:`.plugin`, registered as ``governor``) gives the same as fixtures:
``governor_limits``, ``governor_limits_off``, ``governor_clock``, ``governor_redis_url``.
Guide: docs/testing.md. Production code never imports this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .clock import Clock

if TYPE_CHECKING:
    from .records import Denied, GovernedCall
    from .session import Governed, governed

__all__ = ["Clock", "Denied", "Governed", "GovernedCall", "governed"]

_LAZY = {
    "Denied": ".records",
    "GovernedCall": ".records",
    "Governed": ".session",
    "governed": ".session",
}
"""Imported on first use: they import Celery and redis-py, and pytest imports this package
(for :mod:`.plugin`) in every test run of a project that installs governor."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'governor.testing' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
