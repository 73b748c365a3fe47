"""governor: global, exact rate limits for Celery tasks, kept in Redis.

>>> import redis
>>> from governor import Limiter
>>> partner_api = Limiter(redis.Redis(), "1/s, 20/m, 200/h, 800/d", name="partner-api")
>>> partner_api.acquire("customer-42").allowed
True
"""

from .concurrency import Concurrency, Permit
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
from .limiter import Limiter
from .prices import Prices
from .rules import Rule, parse_meters, parse_rules

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
