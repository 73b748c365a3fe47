"""governor: global, exact rate limits for Celery tasks, kept in Redis.

>>> import redis
>>> from governor import Limiter
>>> partner_api = Limiter(redis.Redis(), "1/s, 20/m, 200/h, 800/d", name="partner-api")
>>> partner_api.acquire("customer-42").allowed
True
"""

from typing import TYPE_CHECKING, Any

from .decision import CapUsage, Decision, Hold, Holder, Pause, RuleUsage, Settled, Slot, Usage
from .errors import (
    ConfigError,
    CostError,
    GovernorError,
    GovernorTimeout,
    RuleError,
    SlotLost,
    StateError,
    StorageUnavailable,
    SubjectError,
)
from .prices import Prices
from .rules import Rule, parse_meters, parse_rules

if TYPE_CHECKING:
    from .concurrency import Concurrency, Permit
    from .limiter import Limiter

__all__ = [
    "CapUsage",
    "Concurrency",
    "ConfigError",
    "CostError",
    "Decision",
    "GovernorError",
    "GovernorTimeout",
    "Hold",
    "Holder",
    "Limiter",
    "Pause",
    "Permit",
    "Prices",
    "Rule",
    "RuleError",
    "RuleUsage",
    "Settled",
    "Slot",
    "SlotLost",
    "StateError",
    "StorageUnavailable",
    "SubjectError",
    "Usage",
    "parse_meters",
    "parse_rules",
]

__version__ = "0.1.0"

_LAZY = {"Concurrency": ".concurrency", "Permit": ".concurrency", "Limiter": ".limiter"}
"""Imported on first use: they import redis-py, which takes a tenth of a second or more, and
``import governor`` must stay cheap (pytest imports :mod:`governor.testing.plugin`, hence this
package, in every test run of a project that installs governor)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'governor' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
