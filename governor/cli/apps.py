"""The Celery app behind ``-A`` and its governor settings."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .common import CliError

if TYPE_CHECKING:
    from ..celery.config.settings import Settings

__all__ = ["load_app", "settings_of"]


def load_app(spec: str) -> Any:
    """A Celery app from ``-A``: ``proj``, ``proj.celery`` or ``proj.celery:app`` (as celery)."""
    try:
        from celery.app.utils import find_app
    except ImportError:
        raise CliError(
            "-A needs Celery: install governor's celery extra "
            "(pip install 'celery-governor[celery]')"
        ) from None
    module, colon, attr = spec.partition(":")
    try:
        if colon:  # module:attr: say which of the two is missing
            found = importlib.import_module(module)
            if not hasattr(found, attr):
                raise CliError(
                    f"cannot load Celery app {spec!r}: module {module!r} has no attribute {attr!r}"
                )
        return find_app(spec)
    except CliError:
        raise
    except ModuleNotFoundError as exc:
        raise CliError(
            f"cannot load Celery app {spec!r}: no module named {exc.name!r}. Run from the "
            "project's directory or fix -A (module, module.attr or module:attr)"
        ) from None
    except AttributeError as exc:
        raise CliError(f"cannot load Celery app {spec!r}: {exc}") from None
    except Exception as exc:
        raise CliError(
            f"cannot load Celery app {spec!r}: importing it raised {type(exc).__name__}: {exc}"
        ) from None


def settings_of(app: Any) -> Settings:
    """The app's governor settings (``Governor.find(app).settings`` when installed)."""
    from ..celery.app import Governor
    from ..celery.config.settings import load_settings

    governor = Governor.find(app)
    return governor.settings if governor is not None else load_settings(app.conf)
