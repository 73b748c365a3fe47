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


def register(app: Any, governor: Installed) -> None:
    _installed[app] = governor


def set_factory(factory: Callable[[Any], Installed]) -> None:
    """What :func:`of` calls for an app without a governor (``Installed`` itself)."""
    global _factory
    _factory = factory


def find(app: Any) -> Installed | None:
    """The app's governor, or None."""
    return _installed.get(app)


def of(app: Any) -> Installed:
    """The app's governor, created on first use (a ``GovernedTask`` without ``Governor(app)``)."""
    governor = _installed.get(app)
    if governor is None:
        if _factory is None:  # pragma: no cover - governor.celery always sets it
            raise RuntimeError("import governor.celery before using a governed task")
        governor = _factory(app)
    return governor
