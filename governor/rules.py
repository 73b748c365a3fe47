"""Rules: "at most N per period", parsed from Celery-style strings; meters: rules per unit.

>>> parse_rules("1/s, 20/m, 200/h, 800/d")
(Rule('1/s'), Rule('20/m'), Rule('200/h'), Rule('800/d'))
>>> Rule.parse("5/30s").period
30.0
>>> parse_meters({"requests": "500/m", "tokens": "30000/m, 1000000/d"})
(('requests', (Rule('500/m'),)), ('tokens', (Rule('30000/m'), Rule('1000000/d'))))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .errors import RuleError

__all__ = ["MeterSpec", "Rule", "RuleSpec", "parse_meters", "parse_rules"]

_UNITS: dict[str, int] = {  # microseconds per unit
    "ms": 1_000,
    "s": 1_000_000,
    "sec": 1_000_000,
    "second": 1_000_000,
    "seconds": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "minute": 60_000_000,
    "minutes": 60_000_000,
    "h": 3_600_000_000,
    "hr": 3_600_000_000,
    "hour": 3_600_000_000,
    "hours": 3_600_000_000,
    "d": 86_400_000_000,
    "day": 86_400_000_000,
    "days": 86_400_000_000,
}
_SHORT = {1_000: "ms", 1_000_000: "s", 60_000_000: "m", 3_600_000_000: "h", 86_400_000_000: "d"}
_RULE = re.compile(
    r"^\s*(?P<limit>[+-]?\d+(?:\.\d+)?)\s*(?:/\s*(?P<mult>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+))?\s*$"
)
MAX_PERIOD_US = 366 * 86_400_000_000
MAX_METERS = 16
_METER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Rule:
    """At most ``limit`` units of cost in any ``period`` seconds.

    Build one with :meth:`parse` (``Rule.parse("20/m")``) or directly with the period in seconds
    (``Rule(20, 60)``).
    """

    limit: int
    period: float
    period_us: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise RuleError(f"rule limit must be a positive integer, got {self.limit!r}")
        try:
            period_us = round(float(self.period) * 1_000_000)
        except (TypeError, ValueError):
            raise RuleError(
                f"rule period must be a number of seconds, got {self.period!r}"
            ) from None
        if not 1_000 <= period_us <= MAX_PERIOD_US:
            raise RuleError(
                f"rule period must be between 1 ms and 366 days, got {self.period!r} seconds"
            )
        if period_us % 1_000:
            raise RuleError(f"rule period must be whole milliseconds, got {self.period!r} seconds")
        object.__setattr__(self, "period", period_us / 1_000_000)
        object.__setattr__(self, "period_us", period_us)

    @classmethod
    def parse(cls, text: str) -> Rule:
        """Parse ``"N/unit"`` or ``"N/<k><unit>"``: ``"10/s"``, ``"5/30s"``, ``"100/15m"``.

        Units: ms, s, m, h, d (and their long forms). A bare number means per second, as in Celery.
        """
        if not isinstance(text, str):
            raise RuleError(f"a rule must be a string such as '10/s', got {text!r}")
        m = _RULE.match(text.lower())
        if m is None:
            raise RuleError(
                f"cannot parse rule {text!r}: expected '<count>/<period>' such as '10/s', "
                "'20/m', '5/30s', '100/15m' or '800/d'"
            )
        if "." in m["limit"]:
            raise RuleError(
                f"rule {text!r}: the count must be a whole number; write '1/2s' instead of '0.5/s'"
            )
        limit = int(m["limit"])
        if limit < 1:
            raise RuleError(f"rule {text!r}: the count must be at least 1, got {limit}")
        unit = m["unit"] or "s"
        if unit not in _UNITS:
            raise RuleError(
                f"rule {text!r}: unknown unit {unit!r}; use ms, s, m, h or d (e.g. '10/s', '800/d')"
            )
        mult = float(m["mult"]) if m["mult"] else 1.0
        if mult <= 0:
            raise RuleError(f"rule {text!r}: the period must be longer than zero")
        period_us = round(mult * _UNITS[unit])
        if not 1_000 <= period_us <= MAX_PERIOD_US:
            raise RuleError(f"rule {text!r}: the period must be between 1 ms and 366 days")
        if period_us % 1_000:
            raise RuleError(f"rule {text!r}: the period must be whole milliseconds")
        return cls(limit, period_us / 1_000_000)

    @property
    def text(self) -> str:
        """Canonical text: ``"20/m"``, ``"5/30s"``, ``"3/1500ms"``."""
        for unit_us in sorted(_SHORT, reverse=True):
            if self.period_us % unit_us == 0:
                mult = self.period_us // unit_us
                return f"{self.limit}/{'' if mult == 1 else mult}{_SHORT[unit_us]}"
        raise AssertionError("periods are whole milliseconds")  # pragma: no cover

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Rule({self.text!r})"


RuleSpec = str | Rule | Iterable[str | Rule]


def parse_rules(spec: RuleSpec) -> tuple[Rule, ...]:
    """Parse one rule, a comma-separated string of rules, or a sequence of strings and Rules."""
    items: Sequence[str | Rule]
    if isinstance(spec, Rule):
        items = [spec]
    elif isinstance(spec, str):
        if not spec.strip():
            raise RuleError("no rules given: expected something like '10/s' or '1/s, 20/m'")
        parts = spec.split(",")
        if any(not part.strip() for part in parts):
            raise RuleError(f"empty rule in {spec!r}: separate rules with single commas")
        items = parts
    else:
        try:
            items = list(spec)
        except TypeError:
            raise RuleError(
                f"rules must be a string such as '10/s, 800/d' or a list of rules, got {spec!r}"
            ) from None
    rules = tuple(item if isinstance(item, Rule) else Rule.parse(item) for item in items)
    if not rules:
        raise RuleError("no rules given: expected something like '10/s' or '1/s, 20/m'")
    return rules


MeterSpec = Mapping[str, RuleSpec]
"""Rules per meter: ``{"requests": "500/m", "tokens": "30000/m, 1000000/d"}``."""


def parse_meters(spec: MeterSpec) -> tuple[tuple[str, tuple[Rule, ...]], ...]:
    """Parse rules per meter (what one call uses several of: requests, tokens, micro-dollars).

    A meter's name is 1 to 64 letters, digits, ``_``, ``.`` or ``-``; at most 16 meters.
    """
    if not isinstance(spec, Mapping) or not spec:
        raise RuleError(
            f"meters must be a mapping such as {{'requests': '500/m', 'tokens': '30000/m'}}, "
            f"got {spec!r}"
        )
    if len(spec) > MAX_METERS:
        raise RuleError(f"at most {MAX_METERS} meters, got {len(spec)}")
    out = []
    for name, rules in spec.items():
        if not isinstance(name, str) or not _METER.match(name):
            raise RuleError(f"meter name {name!r} must be 1 to 64 letters, digits, '_', '.' or '-'")
        try:
            out.append((name, parse_rules(rules)))
        except RuleError as exc:
            raise RuleError(f"meter {name!r}: {exc}") from None
    return tuple(out)
