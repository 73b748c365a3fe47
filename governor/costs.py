"""Costs: the units a call uses, as an integer or per meter, checked at the edge.

A limiter without meters takes an integer. A limiter with meters takes an integer (that many
units of every meter) or a mapping of meter names to units; a meter the mapping leaves out is
not used by the call (0 units), or, when settling, used as estimated.

>>> units_of({"tokens": 1800, "requests": 1}, ("requests", "tokens"))
(1, 1800)
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import CostError

__all__ = ["MAX_UNITS", "Cost", "units_of"]

Cost = int | Mapping[str, int]
MAX_UNITS = 10**12
"""The most units one call may count in one meter, and the largest limit of a meter (so that
the sums the scripts keep stay exact in Lua's doubles)."""


def _count(value: object, what: str, zero: bool) -> int:
    low = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_UNITS:
        kind = "a non-negative" if zero else "a positive"
        raise CostError(f"{what} must be {kind} integer up to {MAX_UNITS}, got {value!r}")
    return value


def units_of(
    cost: object,
    meters: tuple[str, ...],
    *,
    what: str = "cost",
    zero: bool = False,
    rest: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    """Units per meter (in ``meters``' order; one number for a limiter without meters).

    ``zero``: a call may use nothing at all (settling). ``rest``: the units of the meters a
    mapping leaves out (default: 0).
    """
    if not meters:
        if isinstance(cost, Mapping):
            raise CostError(f"{what} {dict(cost)!r} names meters, but this limiter has none")
        return (_count(cost, what, zero),)
    if not isinstance(cost, Mapping):
        return (_count(cost, what, zero),) * len(meters)
    unknown = [name for name in cost if name not in meters]
    if unknown:
        raise CostError(
            f"{what} names unknown meter(s) {', '.join(map(repr, unknown))}; "
            f"the meters are {', '.join(map(repr, meters))}"
        )
    units = tuple(
        _count(cost[name], f"{what} of meter {name!r}", True)
        if name in cost
        else (rest[m] if rest else 0)
        for m, name in enumerate(meters)
    )
    if not zero and not any(units):
        raise CostError(f"{what} {dict(cost)!r} uses no units of any meter")
    return units
