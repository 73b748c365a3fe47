"""Exceptions raised by governor.

Every error a caller can cause names the bad value in its message. All of them derive from
:class:`GovernorError`; the ones caused by bad input also derive from :class:`ValueError`.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CostError",
    "GovernorError",
    "GovernorTimeout",
    "RuleError",
    "ScriptError",
    "SlotLost",
    "StateError",
    "StorageUnavailable",
    "SubjectError",
]


class GovernorError(Exception):
    """Base class of every governor exception."""


class ConfigError(GovernorError, ValueError):
    """A setting, limiter option or name is invalid."""


class RuleError(ConfigError):
    """A rule string such as ``"10/x"`` cannot be parsed or is out of range."""


class CostError(GovernorError, ValueError):
    """A cost is not a positive integer."""


class SubjectError(GovernorError, ValueError):
    """A subject (the thing being limited: a customer id, a queue name...) is unusable."""


class ScriptError(GovernorError):
    """A Lua script's ``-- @include`` or ``-- @rate`` directive names nothing that exists
    (governor's own files are broken: raised when the script is loaded)."""


class StateError(GovernorError):
    """A key in Redis does not hold what governor expects (wrong type or corrupt value)."""


class StorageUnavailable(GovernorError):
    """Redis could not be reached or did not answer in time."""


class GovernorTimeout(GovernorError):
    """A governed task waited longer in total than its ``governor_max_wait`` allows."""


class SlotLost(GovernorError):
    """A concurrency slot's lease ended without renewal: another holder may have it now."""
