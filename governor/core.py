"""What the sync and asyncio limiters share: validation, keys, script arguments, reply parsing.

The I/O lives in :mod:`governor.limiter` and :mod:`governor.aio`; everything else is here, once.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from typing import Any

from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .algorithms import Algorithm, get_algorithm
from .decision import Decision, RuleUsage, Slot, Usage, seconds
from .errors import ConfigError, CostError, StateError, StorageUnavailable
from .keys import Subject, check_name, subject_text, tag
from .rules import Rule, RuleSpec, parse_rules
from .scripts import algorithm_script, block_script

__all__ = ["LimiterBase"]

Call = tuple[list[str], list[bytes | str | int]]
BLOCK = "block"


def _us(value: float, what: str) -> int:
    """Seconds (a finite, non-negative number) to integer microseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ConfigError(f"{what} must not be negative, got {value!r}")
    return round(value * 1_000_000)


def _cost(cost: object) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise CostError(f"cost must be a positive integer, got {cost!r}")
    return cost


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


UNAVAILABLE = (
    RedisConnectionError,  # also BusyLoadingError: a replica or restart still loading
    RedisTimeoutError,
    ClusterDownError,  # also MasterDownError
    TryAgainError,
    RedisClusterException,
    ReadOnlyError,  # a replica after failover, before the client follows the new master
    OutOfMemoryError,  # maxmemory reached under noeviction
)
"""Redis errors that mean "not now": the decision could not be made, nothing was changed."""
REFUSING = ("MISCONF", "BUSY", "NOREPLICAS", "LOADING", "MASTERDOWN", "READONLY", "OOM")
"""Error replies of a server that refuses writes for a while (prefixes)."""


class LimiterBase:
    """Configuration and protocol of a limiter; see :class:`governor.Limiter` for the API."""

    def __init__(
        self,
        client: Any,
        rules: RuleSpec,
        *,
        algorithm: str = "sliding_log",
        name: str,
        prefix: str = "governor",
        precision: int | None = None,
    ) -> None:
        self.client = client
        self.name = check_name("limiter name", name)
        self.prefix = check_name("prefix", prefix)
        self.rules: tuple[Rule, ...] = parse_rules(rules)
        self.algorithm: Algorithm = get_algorithm(algorithm)
        self.algorithm.check(self.rules)
        numbers = [rule.limit for rule in self.rules] + [rule.period_us for rule in self.rules]
        if self.algorithm.name == "sliding_window":
            precision = 60 if precision is None else precision
            if (
                isinstance(precision, bool)
                or not isinstance(precision, int)
                or not (1 <= precision <= 1000)
            ):
                raise ConfigError(f"precision must be an integer from 1 to 1000, got {precision!r}")
            numbers.append(precision)
        elif precision is not None:
            raise ConfigError("precision only applies to algorithm='sliding_window'")
        self.precision = precision
        # ARGV[1]: the limits, then the windows, then any extra, as little-endian doubles (exact:
        # every value is below 2**53)
        self._packed = struct.pack(f"<{len(numbers)}d", *numbers)
        # State that only makes sense under these rules lives under a key named after them, so
        # a changed rule set starts afresh instead of misreading old counters. (The sliding
        # log's stamps mean the same under any rules.)
        self._suffix = self.algorithm.suffix
        if self.algorithm.name != "sliding_log":
            self._suffix += hashlib.sha1(self._packed).hexdigest()[:4]
        self._script = algorithm_script(self.algorithm.script)
        self._block = block_script()

    def __repr__(self) -> str:
        rules = ", ".join(r.text for r in self.rules)
        return f"<{type(self).__name__} {self.name!r} {rules!r} {self.algorithm.name}>"

    # -- keys -------------------------------------------------------------------------------

    def keys(self, subject: Subject) -> tuple[str, str]:
        """The (state, block) keys of a subject; both share one hash tag."""
        head = f"{self.prefix}:{tag(self.name, subject_text(subject))}:"
        return head + self._suffix, head + BLOCK

    def _pattern(self) -> str:
        """SCAN pattern for this limiter's keys (glob characters in names matched literally)."""
        literal = f"{self.prefix}:{tag(self.name, '*')[:-2]}"
        return "".join("\\" + c if c in "*?[]\\" else c for c in literal) + "*"

    # -- calls ------------------------------------------------------------------------------

    def _call(
        self,
        op: str,
        subject: Subject,
        cost: int,
        now: float | None,
        *,
        not_before: float | None = None,
        max_wait: float | None = None,
        tolerance: float = 0.0,
        slot: Slot | None = None,
    ) -> Call:
        if op == "lease" and not self.algorithm.books:
            raise ConfigError(
                f"lease needs an algorithm that books (sliding_log, gcra), not "
                f"{self.algorithm.name}"
            )
        if op in ("reserve", "claim") and not self.algorithm.books:
            if not_before is not None:
                raise ConfigError(
                    f"not_before needs an algorithm that books (sliding_log, gcra), not "
                    f"{self.algorithm.name}"
                )
            op = "acquire"
        args: list[bytes | str | int] = [
            self._packed,
            op,
            "" if now is None else _us(now, "now"),
            _cost(cost),
        ]
        wait = -1 if max_wait is None or max_wait == math.inf else _us(max_wait, "max_wait")
        if op == "reserve":
            start = 0 if not_before is None else _us(not_before, "not_before")
            args += [start, wait, _us(tolerance, "tolerance")]
        elif op == "claim" and slot:
            args += [slot.start_us, slot.end_us, wait, _us(tolerance, "tolerance")]
        elif op == "refund" and slot:
            args += [slot.start_us, slot.end_us]
        elif op == "lease":
            args.append(_us(tolerance, "span"))
        return list(self.keys(subject)), args

    def _block_call(
        self, subject: Subject, seconds_: float, reason: str, now: float | None
    ) -> Call:
        duration = _us(seconds_, "block duration")
        if duration < 1:
            raise ConfigError(f"block duration must be positive, got {seconds_!r}")
        if not isinstance(reason, str):
            raise ConfigError(f"block reason must be a string, got {reason!r}")
        return [self.keys(subject)[1]], ["" if now is None else _us(now, "now"), duration, reason]

    def _decision(self, reply: bytes | str, cost: int = 1) -> Decision:
        parts = reply.split(b" " if isinstance(reply, bytes) else " ", 8)  # type: ignore[arg-type]
        allowed, retry, rule, remaining, reset, now, start, end = map(int, parts[:8])
        return Decision(
            allowed=allowed == 1,
            retry_after=seconds(retry),
            remaining=remaining,
            reset_after=seconds(reset),
            rule=self.rules[rule - 1] if rule > 0 else None,
            blocked=_text(parts[8]) if rule == -1 else None,
            now=now / 1_000_000,
            slot=Slot(start, end) if end else None,
            cost=cost,
        )

    def _usage(self, subject: Subject, reply: Sequence[Any]) -> Usage:
        now, until, reason, booked, last = reply[0], reply[1], reply[2], reply[3], reply[4]
        per = reply[5:]
        return Usage(
            name=self.name,
            subject=subject_text(subject),
            now=now / 1_000_000,
            rules=tuple(
                RuleUsage(rule, per[3 * i], seconds(per[3 * i + 1]), seconds(per[3 * i + 2]))
                for i, rule in enumerate(self.rules)
            ),
            blocked=_text(reason) if until else None,
            blocked_for=max(0.0, (until - now) / 1_000_000) if until else 0.0,
            booked=booked,
            booked_for=max(0.0, (last - now) / 1_000_000) if last else 0.0,
        )

    def _error(self, exc: Exception, keys: Sequence[str]) -> Exception:
        """Translate a redis-py error into a governor error (or return it unchanged)."""
        if isinstance(exc, UNAVAILABLE) or (
            isinstance(exc, ResponseError) and str(exc).startswith(REFUSING)
        ):
            return StorageUnavailable(f"Redis did not answer for limiter {self.name!r}: {exc}")
        if isinstance(exc, ResponseError):
            text = str(exc)
            if "WRONGTYPE" in text:
                return StateError(
                    f"Redis key {keys[0]!r} or {keys[-1]!r} holds a value of another type than "
                    f"governor's {self.algorithm.name} state: is limiter name {self.name!r} used "
                    "by another program, or by a limiter with another algorithm and prefix?"
                )
            if "governor: corrupt" in text:
                return StateError(text[text.index("governor: ") :])
        return exc
