"""Budgets in money: a price table turns a call's usage into micro-dollars, for a meter to count.

Prices are dollars per ``per`` units (per million tokens by default, as providers list them),
so a price of ``3`` for input tokens is 3 micro-dollars a token::

    >>> prices = Prices({"input_tokens": "3", "output_tokens": "15"})
    >>> prices.micro_dollars({"input_tokens": 1200, "output_tokens": 350})
    8850
    >>> budget = Limiter(r, {"usd_micro": "5000000/d"}, name="spend")   # $5 a day # doctest: +SKIP
    >>> budget.settle(tenant, d, {"usd_micro": prices.micro_dollars(usage)})  # doctest: +SKIP

The cost is exact (decimal arithmetic) and rounded up to a whole micro-dollar, so a budget is
never undercounted. Usage comes from outside: only the priced names are read, each must be a
non-negative integer (at most :data:`~governor.costs.MAX_UNITS`); other names are ignored, or
refused with ``strict=True``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from .costs import MAX_UNITS
from .errors import ConfigError, CostError

__all__ = ["Prices"]

MAX_PRICE = Decimal(10**6)
"""The highest price accepted, in dollars per ``per`` units."""


def _price(name: object, value: object) -> Fraction:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a price table names usage fields (strings), got {name!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise ConfigError(f"price of {name!r} must be a number of dollars, got {value!r}")
    try:
        amount = Decimal(str(value).strip()) if not isinstance(value, Decimal) else value
    except InvalidOperation:
        raise ConfigError(f"price of {name!r} must be a number of dollars, got {value!r}") from None
    if not amount.is_finite() or not 0 <= amount <= MAX_PRICE:
        raise ConfigError(f"price of {name!r} must be from 0 to {MAX_PRICE} dollars, got {value!r}")
    return Fraction(amount)


class Prices:
    """A price table: dollars per ``per`` units of each usage field.

    ``prices`` maps usage names (``input_tokens``, ``output_tokens``, ``cached_input_tokens``,
    ...) to dollars as numbers or decimal strings (strings and Decimals are exact; a float is
    read as its shortest decimal text). ``strict``: usage naming anything unpriced is refused.
    """

    def __init__(
        self,
        prices: Mapping[str, float | int | str | Decimal],
        *,
        per: int = 1_000_000,
        strict: bool = False,
    ) -> None:
        if not isinstance(prices, Mapping) or not prices:
            raise ConfigError(
                f"prices must map usage names to dollars, such as {{'input_tokens': 3}}, "
                f"got {prices!r}"
            )
        if isinstance(per, bool) or not isinstance(per, int) or not 1 <= per <= 10**12:
            raise ConfigError(f"per must be a positive integer of units, got {per!r}")
        # micro-dollars per unit, exact
        self._rates = {
            name: _price(name, value) * 1_000_000 / per for name, value in prices.items()
        }
        self.per = per
        self.strict = strict

    def __repr__(self) -> str:
        rates = ", ".join(
            f"{name}: {float(rate * self.per / 1_000_000):g}" for name, rate in self._rates.items()
        )
        return f"<Prices $ per {self.per:,} units: {rates}>"

    def micro_dollars(self, usage: Mapping[str, object]) -> int:
        """What ``usage`` (units per name) costs, in micro-dollars, rounded up."""
        if not isinstance(usage, Mapping):
            raise CostError(f"usage must map names to units, got {usage!r}")
        if self.strict:
            unpriced = [name for name in usage if name not in self._rates]
            if unpriced:
                raise CostError(f"usage names unpriced field(s) {', '.join(map(repr, unpriced))}")
        total = Fraction(0)
        for name, rate in self._rates.items():
            units = usage.get(name, 0)
            if isinstance(units, bool) or not isinstance(units, int) or not 0 <= units <= MAX_UNITS:
                raise CostError(
                    f"usage of {name!r} must be a non-negative integer up to {MAX_UNITS}, "
                    f"got {units!r}"
                )
            total += rate * units
        return math.ceil(total)
