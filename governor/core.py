"""What the sync and asyncio limiters share: validation, keys, script arguments, reply parsing.

The I/O lives in :mod:`governor.limiter` and :mod:`governor.aio`; everything else is here, once.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from typing import Any

from .algorithms import Algorithm, check_share, get_algorithm
from .blocks import block_call, block_reason, parse_pause, pause_call
from .blocks import us as _us
from .caps import CAP_SUFFIXES, Cap, handed, holder_text, info_text, new_token
from .decision import Decision, Hold, Pause, RuleUsage, Slot, Usage, seconds
from .errors import ConfigError, CostError
from .keys import Subject, check_name, subject_text, tag
from .rules import Rule, RuleSpec, parse_rules
from .scripts import (
    algorithm_script,
    block_script,
    cap_ops_script,
    capped_script,
    pause_script,
)
from .storage_errors import storage_error

__all__ = ["LimiterBase"]

Call = tuple[list[str], list[bytes | str | int]]
BLOCK = "block"
BACKOFF = "bo"
"""The key suffix of a subject's exponential backoff level (see pause.lua)."""
CAP_ONLY = "cap"
"""The state key suffix of a limiter with a cap and no rules (it keeps no rule state)."""


def _cost(cost: object) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise CostError(f"cost must be a positive integer, got {cost!r}")
    return cost


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class LimiterBase:
    """Configuration and protocol of a limiter; see :class:`governor.Limiter` for the API."""

    def __init__(
        self,
        client: Any,
        rules: RuleSpec | None,
        *,
        algorithm: str = "sliding_log",
        name: str,
        prefix: str = "governor",
        precision: int | None = None,
        concurrency: int | None = None,
        lease: float = 30.0,
        ceiling: RuleSpec | None = None,
    ) -> None:
        self.client = client
        self.name = check_name("limiter name", name)
        self.prefix = check_name("prefix", prefix)
        self.cap: Cap | None = None if concurrency is None else Cap.make(concurrency, lease)
        if rules is None or (self.cap is not None and (rules == "" or rules == ())):
            if self.cap is None:
                raise ConfigError("a limiter needs rules, a concurrency cap, or both")
            self.rules: tuple[Rule, ...] = ()
        else:
            self.rules = parse_rules(rules)
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
        # log's stamps mean the same under any rules.) Rules that are a share of a ceiling (an
        # adaptive limit's) are named after the ceiling: every share reads the same state, so
        # the ceiling holds whatever the share (see algorithms.check_share).
        self.ceiling: tuple[Rule, ...] = self.rules
        named = self._packed
        if ceiling is not None:
            self.ceiling = parse_rules(ceiling)
            check_share(self.rules, self.ceiling, self.algorithm.name)
            top = [r.limit for r in self.ceiling] + [r.period_us for r in self.ceiling]
            named = struct.pack(f"<{len(numbers)}d", *top, *numbers[len(top) :])
        self._suffix = self.algorithm.suffix
        if not self.rules:
            self._suffix = CAP_ONLY
        elif self.algorithm.name != "sliding_log":
            self._suffix += hashlib.sha1(named).hexdigest()[:4]
        if self.cap is None:
            self._script = algorithm_script(self.algorithm.script)
        else:
            self._script = capped_script(self.algorithm.script if self.rules else None)
        self._rates = algorithm_script(self.algorithm.script)
        """The rules' script alone (usage of a capped limiter)."""
        self._cap_ops = cap_ops_script()
        self._block = block_script()
        self._pause_script = pause_script()

    def __repr__(self) -> str:
        rules = ", ".join(r.text for r in self.rules)
        cap = f" concurrency {self.cap.limit}" if self.cap is not None else ""
        return f"<{type(self).__name__} {self.name!r} {rules!r} {self.algorithm.name}{cap}>"

    @property
    def books(self) -> bool:
        """Whether :meth:`reserve` can book a future moment (a cap without rules books a moment
        that holds nothing: its slot is taken only when the holder starts)."""
        return self.algorithm.books or not self.rules

    # -- keys -------------------------------------------------------------------------------

    def keys(self, subject: Subject) -> tuple[str, str]:
        """The (state, block) keys of a subject; both share one hash tag."""
        head = f"{self.prefix}:{tag(self.name, subject_text(subject))}:"
        return head + self._suffix, head + BLOCK

    def cap_keys(self, subject: Subject) -> list[str]:
        """The subject's keys for its concurrency cap: state and block first, then the cap's
        holders, entries, waiters and finished copies (one hash tag)."""
        head = f"{self.prefix}:{tag(self.name, subject_text(subject))}:"
        return [head + self._suffix, head + BLOCK, *(head + kind for kind in CAP_SUFFIXES)]

    def wake_key(self, subject: Subject, holder: str) -> str:
        """The list a process waiting for a slot blocks on (cap.lua pushes to it)."""
        return self.cap_keys(subject)[2][:-2] + "cq:" + holder

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
        hold: Hold | None = None,
        info: str = "",
    ) -> Call:
        if op == "lease" and self.cap is not None:
            raise ConfigError("a limiter with a concurrency cap cannot lease")
        if op == "lease" and not self.algorithm.books:
            raise ConfigError(
                f"lease needs an algorithm that books (sliding_log, gcra), not "
                f"{self.algorithm.name}"
            )
        if op in ("reserve", "claim") and not self.books:
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
        if self.cap is None or op == "usage":
            return list(self.keys(subject)), args
        if hold is None:
            raise ConfigError(f"limiter {self.name!r} has a concurrency cap: say who holds")
        args += self.cap.args(hold.holder, hold.token, info_text(info), "")
        return self.cap_keys(subject), args

    def _cap_call(
        self,
        op: str,
        subject: Subject,
        holder: str = "",
        *,
        token: str = "",
        info: str = "",
        message: str = "",
        now: float | None = None,
        limit: bool = True,
    ) -> Call:
        """A call of ``cap_ops.lua``; ``limit=False`` lets the script read the cap from Redis
        (a sweep by a process that does not know the configuration)."""
        if self.cap is None:
            raise ConfigError(f"limiter {self.name!r} has no concurrency cap")
        args: list[bytes | str | int] = [b"", op, "" if now is None else _us(now, "now"), 1]
        cap_args = self.cap.args(holder, token, info_text(info), message)
        if not limit:
            cap_args[0] = ""
        return self.cap_keys(subject), args + cap_args

    def _refund_hold(self, decision: Decision | Slot) -> Hold | None:
        """Which slot a refund releases: the decision's, or none (for a capped limiter)."""
        if self.cap is None:
            return None
        if isinstance(decision, Decision) and decision.hold is not None:
            return decision.hold
        return Hold("-", "-", 0, self.cap.lease)

    def _hold(self, holder: str | None, token: str | None) -> Hold | None:
        """Who a capped decision is for (a new holder id when none is given)."""
        if self.cap is None:
            return None
        return Hold(
            holder_text(holder) if holder is not None else f"h-{new_token()}",
            token or new_token(),
            0,
            self.cap.lease,
        )

    def _block_call(
        self, subject: Subject, seconds_: float, reason: str, now: float | None
    ) -> Call:
        return block_call(self.keys(subject)[1], seconds_, reason, now)

    def _pause_call(
        self,
        subject: Subject,
        seconds_: float | None,
        reason: str,
        base: float,
        max_pause: float,
        now: float | None,
    ) -> Call:
        """A call of ``pause.lua`` (see :func:`governor.blocks.pause_call`)."""
        block = self.keys(subject)[1]
        return pause_call(
            block, block[: -len(BLOCK)] + BACKOFF, seconds_, reason, base, max_pause, now
        )

    @staticmethod
    def _pause(reply: Sequence[Any]) -> Pause:
        return parse_pause(reply)

    def _decision(self, reply: Any, cost: int = 1, hold: Hold | None = None) -> Decision:
        if hold is not None:
            return self._capped(reply, cost, hold)
        parts = reply.split(b" " if isinstance(reply, bytes) else " ", 8)
        allowed, retry, rule, remaining, reset, now, start, end = map(int, parts[:8])
        return Decision(
            allowed=allowed == 1,
            retry_after=seconds(retry),
            remaining=remaining,
            reset_after=seconds(reset),
            rule=self.rules[rule - 1] if rule > 0 else None,
            blocked=block_reason(parts[8])[0] if rule == -1 else None,
            now=now / 1_000_000,
            slot=Slot(start, end) if end else None,
            cost=cost,
        )

    def _capped(self, reply: Sequence[Any], cost: int, hold: Hold) -> Decision:
        """A decision of a capped limiter: {decision, fence, free slots, handed pairs...}."""
        text = reply[0]
        d = self._decision(text, cost)
        parts = text.split(b" " if isinstance(text, bytes) else " ", 8)
        fence, free = int(reply[1]), int(reply[2])
        return Decision(
            allowed=d.allowed,
            retry_after=d.retry_after,
            remaining=min(d.remaining, free) if self.rules else free,
            reset_after=d.reset_after,
            rule=d.rule,
            blocked=d.blocked,
            now=d.now,
            slot=d.slot,
            cost=cost,
            capped=_text(parts[8]) if int(parts[2]) == -2 else None,
            hold=Hold(hold.holder, hold.token, fence, hold.lease) if fence else None,
            handed=handed(reply[3:]),
        )

    def _usage(self, subject: Subject, reply: Sequence[Any]) -> Usage:
        now, until, reason, booked, last = reply[0], reply[1], reply[2], reply[3], reply[4]
        per = reply[5:]
        text, paused = block_reason(reason) if until else (None, False)
        return Usage(
            name=self.name,
            subject=subject_text(subject),
            now=now / 1_000_000,
            rules=tuple(
                RuleUsage(rule, per[3 * i], seconds(per[3 * i + 1]), seconds(per[3 * i + 2]))
                for i, rule in enumerate(self.rules)
            ),
            blocked=text,
            blocked_for=max(0.0, (until - now) / 1_000_000) if until else 0.0,
            paused=paused,
            booked=booked,
            booked_for=max(0.0, (last - now) / 1_000_000) if last else 0.0,
        )

    def _error(self, exc: Exception, keys: Sequence[str]) -> Exception:
        """Translate a redis-py error into a governor error (or return it unchanged)."""
        return storage_error(exc, self.name, self.algorithm.name, keys)
