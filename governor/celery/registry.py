"""Which Celery app has which :class:`~governor.celery.Installed`.

The parts that Celery calls on its own (a task's ``before_start``, the worker's request class,
the releaser bootstep) find their app's governor here, so none of them imports the module that
defines it: :mod:`governor.celery.app` registers each ``Installed`` (and itself as the factory
for apps that only use ``base=GovernedTask``), and everything else only reads.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

from .admission.gate import Gate
from .config.settings import Settings

__all__ = ["Installed", "find", "of", "register", "set_factory"]


class Installed(Protocol):
    """What the rest of governor.celery needs of an installed governor."""

    @property
    def settings(self) -> Settings: ...

    @property
    def gate(self) -> Gate: ...

    @property
    def uses_caps(self) -> bool: ...

    @property
    def uses_fairness(self) -> bool: ...


_installed: weakref.WeakKeyDictionary[Any, Installed] = weakref.WeakKeyDictionary()
_factory: Callable[[Any], Installed] | None = None
_last: tuple[Any, Installed] | None = None
"""The app last found and its governor: every task asks (twice in the worker's main process,
once in the pool), nearly always for the same app, and a weak dictionary's lookup makes a weak
reference each time. (An installed governor holds its app anyway.)"""


def register(app: Any, governor: Installed) -> None:
    global _last
    _installed[app] = governor
    _last = None


def set_factory(factory: Callable[[Any], Installed]) -> None:
    """What :func:`of` calls for an app without a governor (``Installed`` itself)."""
    global _factory
    _factory = factory


def find(app: Any) -> Installed | None:
    """The app's governor, or None."""
    global _last
    last = _last
    if last is not None and last[0] is app:
        return last[1]
    governor = _installed.get(app)
    if governor is not None:
        _last = (app, governor)
    return governor


def of(app: Any) -> Installed:
    """The app's governor, created on first use (a ``GovernedTask`` without ``Governor(app)``)."""
    governor = find(app)
    if governor is None:
        if _factory is None:  # pragma: no cover - governor.celery always sets it
            raise RuntimeError("import governor.celery before using a governed task")
        governor = _factory(app)
    return governor
