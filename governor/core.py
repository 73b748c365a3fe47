"""What the sync and asyncio limiters share: validation, keys, script arguments, reply parsing.

The I/O lives in :mod:`governor.limiter` and :mod:`governor.aio`; everything else is here, once.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from .algorithms import Algorithm, check_share, get_algorithm
from .blocks import ScriptCall, block_call, block_reason, parse_pause, pause_call
from .blocks import us as _us
from .caps import CAP_SUFFIXES, Cap, handed, holder_text, info_text, new_token, token_text
from .costs import MAX_UNITS, Cost, units_of
from .decision import Decision, Hold, Pause, RuleUsage, Settled, Slot, Usage, seconds
from .errors import ConfigError, CostError, RuleError
from .keys import Subject, check_name, subject_text, tag
from .rules import MeterSpec, Rule, RuleSpec, parse_meters, parse_rules
from .scripts import (
    algorithm_script,
    block_script,
    cap_ops_script,
    capped_script,
    pause_script,
)
from .storage_errors import storage_error
from .text import as_text

__all__ = ["LimiterBase"]

BLOCK = "block"
BACKOFF = "bo"
"""The key suffix of a subject's exponential backoff level (see pause.lua)."""
SETTLED = "st"
"""The key suffix of a subject's settled reservations (see common.lua, settle)."""
LEGACY_LOG = "sl"
"""The key suffix of governor's first sliding-log layout (one stamp per unit), which the
sliding log reads once into its entry log (see sliding_log.lua)."""
CAP_ONLY = "cap"
"""The state key suffix of a limiter with a cap and no rules (it keeps no rule state)."""
KEPT_SUBJECTS = 1024
"""Subjects whose cap keys a limiter keeps (per-key caps may see endless subjects)."""


def _cost(cost: object) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise CostError(f"cost must be a positive integer, got {cost!r}")
    return cost


def _digest(text: str) -> str:
    """A reservation id as Redis keeps it: 16 hex digits, whatever the caller's id."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


class LimiterBase:
    """Configuration and protocol of a limiter; see :class:`governor.Limiter` for the API."""

    def __init__(
        self,
        client: Any,
        rules: RuleSpec | MeterSpec | None,
        *,
        algorithm: str = "sliding_log",
        name: str,
        prefix: str = "governor",
        precision: int | None = None,
        concurrency: int | None = None,
        lease: float = 30.0,
        settle_within: float = 600.0,
        ceiling: RuleSpec | None = None,
    ) -> None:
        self.client = client
        self.name = check_name("limiter name", name)
        self.prefix = check_name("prefix", prefix)
        self.cap: Cap | None = None if concurrency is None else Cap.make(concurrency, lease)
        self.meters: tuple[str, ...] = ()
        """The meters' names, in order (empty for a limiter without meters)."""
        self._meter_of: tuple[int, ...] = ()
        """Per rule: the index of its meter."""
        if isinstance(rules, Mapping):
            metered = parse_meters(rules)
            self.meters = tuple(meter for meter, _ in metered)
            self.rules: tuple[Rule, ...] = tuple(rule for _, group in metered for rule in group)
            self._meter_of = tuple(m for m, (_, group) in enumerate(metered) for _ in group)
        elif rules is None or (self.cap is not None and (rules == "" or rules == ())):
            if self.cap is None:
                raise ConfigError("a limiter needs rules, a concurrency cap, or both")
            self.rules = ()
        else:
            self.rules = parse_rules(rules)
            self._meter_of = (0,) * len(self.rules)
        self.algorithm: Algorithm = get_algorithm(algorithm)
        if self.meters:
            # units, not calls: a sliding log keeps an entry per call (see docs/token-quotas.md)
            for rule in self.rules:
                if rule.limit > MAX_UNITS:
                    raise RuleError(f"rule {rule.text!r}: a limit of at most {MAX_UNITS} units")
            if self.algorithm.name != "sliding_log":
                self.algorithm.check(self.rules)
        else:
            self.algorithm.check(self.rules)
        if (
            isinstance(settle_within, bool)
            or not isinstance(settle_within, (int, float))
            or not 0 < settle_within <= 366 * 86_400
        ):
            raise ConfigError(
                f"settle_within must be a number of seconds up to 366 days, got {settle_within!r}"
            )
        self.settle_within = float(settle_within)
        """Seconds after a reservation is counted during which it can be settled (its lease)."""
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
        # the ceiling holds whatever the share (see algorithms.check_share). Meters add their
        # names and which rule counts which (the sliding log's entries hold a number per meter,
        # whatever the rules).
        self.ceiling: tuple[Rule, ...] = self.rules
        named = self._packed
        if ceiling is not None:
            if self.meters:
                raise ConfigError("a limit with meters takes no ceiling (adaptive limits: rules)")
            self.ceiling = parse_rules(ceiling)
            check_share(self.rules, self.ceiling, self.algorithm.name)
            top = [r.limit for r in self.ceiling] + [r.period_us for r in self.ceiling]
            named = struct.pack(f"<{len(numbers)}d", *top, *numbers[len(top) :])
        self._suffix = self.algorithm.suffix
        meters = ",".join(self.meters).encode() + bytes(self._meter_of) if self.meters else b""
        if not self.rules:
            self._suffix = CAP_ONLY
        elif self.algorithm.name != "sliding_log":
            self._suffix += hashlib.sha1(named + meters).hexdigest()[:4]
        elif self.meters:
            self._suffix += hashlib.sha1(",".join(self.meters).encode()).hexdigest()[:4]
        if self.cap is None:
            self._script = algorithm_script(self.algorithm.script)
        else:
            self._script = capped_script(self.algorithm.script if self.rules else None)
        self._rates = algorithm_script(self.algorithm.script)
        """The rules' script alone (usage of a capped limiter)."""
        self._cap_ops = cap_ops_script()
        self._cap_keys: dict[str, tuple[str, ...]] = {}
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

    def _state_keys(self, subject: Subject) -> list[str]:
        """What :meth:`reset` deletes: the state, and a sliding log's first-layout key (else
        the log would read it again)."""
        state = self.keys(subject)[0]
        if self.algorithm.name == "sliding_log" and not self.meters and self.rules:
            return [state, state[: -len(self._suffix)] + LEGACY_LOG]
        return [state]

    # -- costs ------------------------------------------------------------------------------

    def _units(self, cost: object, *, fits: bool = True) -> tuple[int, ...]:
        """A cost as units per meter (one number without meters). ``fits``: with meters, a
        cost larger than a rule can ever admit is refused at once (without meters the decision
        says so: ``retry_after`` is infinite)."""
        if not self.meters:
            return (_cost(cost),) if isinstance(cost, int) else units_of(cost, ())
        units = units_of(cost, self.meters)
        if fits:
            for rule, m in zip(self.rules, self._meter_of):
                if units[m] > rule.limit:
                    raise CostError(
                        f"{units[m]} units of meter {self.meters[m]!r} are more than rule "
                        f"{rule.text!r} of limiter {self.name!r} can ever admit"
                    )
        return units

    def check_cost(self, cost: Cost) -> tuple[int, ...]:
        """The units of ``cost`` per meter (one number without meters), checked as a decision
        checks them, without Redis: :class:`~governor.errors.CostError` for a bad cost or, with
        meters, one larger than a rule can ever admit."""
        return self._units(cost)

    def _cost_arg(self, units: tuple[int, ...]) -> int | str:
        """ARGV[4]: the units, or per rule "<units>@<meter>" (see common.lua)."""
        if not self.meters:
            return units[0]
        return " ".join(f"{units[m]}@{m + 1}" for m in self._meter_of)

    def _estimate(self, decision: Decision) -> tuple[int, ...]:
        """The units a decision counted, per meter."""
        if self.meters and decision.units:
            return units_of(dict(decision.units), self.meters, zero=True)
        return self._units(decision.cost, fits=False)

    def cap_keys(self, subject: Subject) -> list[str]:
        """The subject's keys for its concurrency cap: state and block first, then the cap's
        holders, entries, waiters and finished copies (one hash tag). Kept for the subjects
        last seen (a capped task names them twice: its decision and its release)."""
        kept = self._cap_keys.get(subject) if type(subject) is str else None
        if kept is None:
            head = f"{self.prefix}:{tag(self.name, subject_text(subject))}:"
            kept = (head + self._suffix, head + BLOCK, *(head + kind for kind in CAP_SUFFIXES))
            if type(subject) is str:
                if len(self._cap_keys) >= KEPT_SUBJECTS:
                    self._cap_keys.clear()
                self._cap_keys[subject] = kept
        return list(kept)

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
        cost: Cost | tuple[int, ...],
        now: float | None,
        *,
        not_before: float | None = None,
        max_wait: float | None = None,
        tolerance: float = 0.0,
        slot: Slot | None = None,
        hold: Hold | None = None,
        info: str = "",
        give_back: Hold | None = None,
    ) -> ScriptCall:
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
        if isinstance(cost, tuple):
            units = cost
        else:
            units = self._units(cost, fits=op not in ("refund", "usage"))
        args: list[bytes | str | int] = [
            self._packed,
            op,
            "" if now is None else _us(now, "now"),
            self._cost_arg(units),
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
        given = "" if give_back is None else f"{give_back.holder} {give_back.token}"
        args += self.cap.args(hold.holder, hold.token, info_text(info), given)
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
    ) -> ScriptCall:
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

    @staticmethod
    def _holder_token(hold: Hold | str) -> tuple[str, str]:
        """(holder, token) a release names: a Hold's (its token checked), or a holder id with
        token "" (released by its info)."""
        if isinstance(hold, Hold):
            return holder_text(hold.holder), token_text(hold.token)
        return holder_text(hold), ""

    def _hold(self, holder: str | None, token: str | None) -> Hold | None:
        """Who a capped decision is for (a new holder id when none is given)."""
        if self.cap is None:
            return None
        return Hold(
            holder_text(holder) if holder is not None else f"h-{new_token()}",
            token_text(token) if token else new_token(),
            0,
            self.cap.lease,
        )

    def _block_call(
        self, subject: Subject, seconds_: float, reason: str, now: float | None
    ) -> ScriptCall:
        return block_call(self.keys(subject)[1], seconds_, reason, now)

    def _pause_call(
        self,
        subject: Subject,
        seconds_: float | None,
        reason: str,
        base: float,
        max_pause: float,
        now: float | None,
    ) -> ScriptCall:
        """A call of ``pause.lua`` (see :func:`governor.blocks.pause_call`)."""
        block = self.keys(subject)[1]
        return pause_call(
            block, block[: -len(BLOCK)] + BACKOFF, seconds_, reason, base, max_pause, now
        )

    @staticmethod
    def _pause(reply: Sequence[Any]) -> Pause:
        return parse_pause(reply)

    def _decision(
        self, reply: Any, cost: Cost | tuple[int, ...] = 1, hold: Hold | None = None
    ) -> Decision:
        if hold is not None:  # {decision, fence, free slots, handed pairs...}
            text, fence, free = reply[0], int(reply[1]), int(reply[2])
        else:
            text, fence, free = reply, 0, -1
        parts = text.split(b" " if type(text) is bytes else " ", 8)
        allowed, retry, rule, remaining, reset, now, start, end = map(int, parts[:8])
        # (every call's cost was checked before its script ran; the usual one: units, no meters)
        if type(cost) is int and not self.meters:
            units: tuple[int, ...] = (cost,)
        else:
            units = cost if isinstance(cost, tuple) else self._units(cost, fits=False)
        if free >= 0:  # a capped limiter's: what its slots allow too, and who it handed some
            remaining = min(remaining, free) if self.rules else free
        return Decision(
            allowed == 1,
            seconds(retry) if retry else 0.0,
            remaining,
            seconds(reset),
            self.rules[rule - 1] if rule > 0 else None,
            block_reason(parts[8])[0] if rule == -1 else None,
            now / 1_000_000,
            Slot(start, end) if end else None,
            max(units),
            as_text(parts[8]) if rule == -2 and hold is not None else None,
            Hold(hold.holder, hold.token, fence, hold.lease)
            if hold is not None and fence
            else None,
            handed(reply[3:]) if hold is not None and len(reply) > 3 else (),
            tuple(zip(self.meters, units)) if self.meters else (),
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
                RuleUsage(
                    rule,
                    per[3 * i],
                    seconds(per[3 * i + 1]),
                    seconds(per[3 * i + 2]),
                    self.meters[self._meter_of[i]] if self.meters else None,
                )
                for i, rule in enumerate(self.rules)
            ),
            blocked=text,
            blocked_for=max(0.0, (until - now) / 1_000_000) if until else 0.0,
            paused=paused,
            booked=booked,
            booked_for=max(0.0, (last - now) / 1_000_000) if last else 0.0,
        )

    # -- settling ---------------------------------------------------------------------------

    def _settle_call(
        self,
        subject: Subject,
        reservation: Decision | Slot,
        used: Cost,
        estimate_cost: Cost | None,
        id: str | None,
        now: float | None,
    ) -> ScriptCall | None:
        """A call of the algorithm's script that settles a reservation: a decision, or its slot
        with the cost reserved (None: it reserved nothing)."""
        if isinstance(reservation, Slot):
            if estimate_cost is None:
                raise CostError("settling a slot needs the cost it reserved: estimate=...")
            slot: Slot | None = reservation
            estimate = self._units(estimate_cost, fits=False)
        else:
            slot = reservation.slot
            estimate = (
                self._estimate(reservation)
                if estimate_cost is None
                else self._units(estimate_cost, fits=False)
            )
        if slot is None:
            return None
        actual = units_of(used, self.meters, what="use", zero=True, rest=estimate)
        name = f"slot:{slot.start_us}:{slot.end_us}" if id is None else str(id)
        head = f"{self.prefix}:{tag(self.name, subject_text(subject))}:"
        args: list[bytes | str | int] = [
            self._packed,
            "settle",
            "" if now is None else _us(now, "now"),
            self._cost_arg(estimate),
            slot.start_us,
            slot.end_us,
            self._cost_arg(actual),
            _us(self.settle_within, "settle_within"),
            _digest(name),
        ]
        return [*self.keys(subject), head + SETTLED], args

    def _settled(self, reply: Any) -> Settled:
        parts = as_text(reply).split()
        numbers = [int(x) for x in parts[1:]]
        return Settled(
            status=parts[0],
            now=numbers[0] / 1_000_000,
            given_back=tuple(numbers[1::2]),
            charged=tuple(numbers[2::2]),
        )

    def _sync_call(
        self,
        subject: Subject,
        remaining: int,
        meter: str | None,
        reset_in: float | None,
        now: float | None,
        as_of: float | None = None,
        transit: float = 0.0,
    ) -> ScriptCall | None:
        """A call that charges what the rule's room exceeds the upstream's ``remaining`` by
        (None: the limiter has no rules)."""
        if not self.rules:
            return None
        if self.meters:
            if meter not in self.meters:
                raise ConfigError(
                    f"limiter {self.name!r}: say which meter the upstream counted, one of "
                    f"{', '.join(map(repr, self.meters))}; got {meter!r}"
                )
            m = self.meters.index(meter)
        elif meter is not None:
            raise ConfigError(f"limiter {self.name!r} has no meters; got meter={meter!r}")
        else:
            m = 0
        if isinstance(remaining, bool) or not isinstance(remaining, int) or remaining < 0:
            raise CostError(f"remaining must be a non-negative integer, got {remaining!r}")
        rule = 0
        if reset_in is not None:
            mine = [(r.period, i) for i, r in enumerate(self.rules) if self._meter_of[i] == m]
            # the upstream's counter resets within its window: compare with the shortest of
            # ours that is at least as long (else our longest)
            longer = [p for p in mine if p[0] >= _us(reset_in, "reset_in") / 1e6]
            rule = (min(longer) if longer else max(mine))[1] + 1
        args: list[bytes | str | int] = [
            self._packed,
            "sync",
            "" if now is None else _us(now, "now"),
            self._cost_arg((1,) * max(1, len(self.meters))),
            m + 1,
            rule,
            min(remaining, MAX_UNITS),
            "" if as_of is None else _us(as_of, "as_of"),
            _us(transit, "transit"),
        ]
        return list(self.keys(subject)), args

    def _error(self, exc: Exception, keys: Sequence[str]) -> Exception:
        """Translate a redis-py error into a governor error (or return it unchanged)."""
        return storage_error(exc, self.name, self.algorithm.name, keys)
