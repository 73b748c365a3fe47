"""A price table turns usage into micro-dollars: exact, rounded up, validated at the edge."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor import ConfigError, CostError, Prices
from governor.costs import MAX_UNITS


def test_dollars_per_million_tokens() -> None:
    prices = Prices({"input_tokens": "3", "output_tokens": 15, "cached_input_tokens": "0.30"})
    assert prices.micro_dollars({"input_tokens": 1_000_000}) == 3_000_000  # $3
    assert prices.micro_dollars({"input_tokens": 1200, "output_tokens": 350}) == 8850
    assert prices.micro_dollars({"cached_input_tokens": 1}) == 1  # 0.3 rounded up
    assert prices.micro_dollars({"cached_input_tokens": 10}) == 3
    assert prices.micro_dollars({}) == 0
    # fields without a price are ignored, unless strict
    assert prices.micro_dollars({"input_tokens": 1, "total_tokens": 9}) == 3
    with pytest.raises(CostError, match="unpriced"):
        Prices({"input_tokens": 3}, strict=True).micro_dollars({"total_tokens": 9})


def test_other_units() -> None:
    per_call = Prices({"calls": "0.002", "seconds": Decimal("0.0001")}, per=1)
    assert per_call.micro_dollars({"calls": 3, "seconds": 12}) == 6_000 + 1_200
    assert "0.002" in repr(per_call)


def test_bad_tables_and_usage() -> None:
    for table in ({}, {"x": -1}, {"x": "abc"}, {"x": float("nan")}, {"x": True}, {"": 1}, [1]):
        with pytest.raises(ConfigError):
            Prices(table)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="per"):
        Prices({"x": 1}, per=0)
    prices = Prices({"input_tokens": 3})
    for usage in (
        {"input_tokens": -1},
        {"input_tokens": 1.5},
        {"input_tokens": "9"},
        {"input_tokens": True},
        {"input_tokens": MAX_UNITS + 1},
        [("input_tokens", 1)],
    ):
        with pytest.raises(CostError):
            prices.micro_dollars(usage)  # type: ignore[arg-type]


@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.decimals(min_value=0, max_value=1000, places=4, allow_nan=False),
        min_size=1,
    ),
    st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 10**12)),
)
def test_exact_and_never_under(table: dict[str, Decimal], usage: dict[str, int]) -> None:
    exact = sum(
        (Fraction(price) * usage.get(name, 0) for name, price in table.items()), Fraction(0)
    )
    got = Prices(table).micro_dollars(usage)
    assert got - 1 < exact <= got  # micro-dollars per unit = dollars per million units
