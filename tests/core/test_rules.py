from __future__ import annotations

import pytest

from governor import Rule, RuleError, parse_rules


@pytest.mark.parametrize(
    ("text", "limit", "period"),
    [
        ("10/s", 10, 1.0),
        ("20/m", 20, 60.0),
        ("200/h", 200, 3600.0),
        ("800/d", 800, 86400.0),
        ("5/30s", 5, 30.0),
        ("100/15m", 100, 900.0),
        ("3/1.5s", 3, 1.5),
        ("7/250ms", 7, 0.25),
        (" 10 / second ", 10, 1.0),
        ("10/MIN", 10, 60.0),
        ("12", 12, 1.0),  # Celery: a bare number is per second
    ],
)
def test_parse(text: str, limit: int, period: float) -> None:
    rule = Rule.parse(text)
    assert (rule.limit, rule.period) == (limit, period)


def test_several_and_canonical_text() -> None:
    rules = parse_rules("1/s, 20/m, 200/h, 800/d")
    assert [r.text for r in rules] == ["1/s", "20/m", "200/h", "800/d"]
    assert parse_rules(["5/30s", Rule(3, 1.5)]) == (Rule(5, 30), Rule.parse("3/1500ms"))
    assert str(Rule(100, 900)) == "100/15m"
    assert repr(Rule(1, 86400 * 2)) == "Rule('1/2d')"


@pytest.mark.parametrize(
    ("bad", "mentions"),
    [
        ("10/x", "'x'"),
        ("0/s", "'0/s'"),
        ("-1/m", "'-1/m'"),
        ("abc", "'abc'"),
        ("", "no rules"),
        ("10/s,", "empty rule"),
        ("0.5/s", "1/2s"),
        ("1/0s", "'1/0s'"),
        ("1/400d", "366 days"),
        ("1/0.1ms", "1 ms"),
    ],
)
def test_bad_rules_name_the_value(bad: str, mentions: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_rules(bad)
    assert mentions in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_rule_objects() -> None:
    with pytest.raises(RuleError, match="positive integer"):
        Rule(0, 1)
    with pytest.raises(RuleError, match="seconds"):
        Rule(1, "soon")  # type: ignore[arg-type]
    with pytest.raises(RuleError, match="list of rules"):
        parse_rules(42)  # type: ignore[arg-type]
    with pytest.raises(RuleError, match="no rules"):
        parse_rules([])


def test_periods_are_whole_milliseconds() -> None:
    with pytest.raises(RuleError, match="whole milliseconds"):
        Rule.parse("1/1.5ms")
    with pytest.raises(RuleError, match="whole milliseconds"):
        Rule(1, 0.0012345)
    assert Rule.parse("3/1.5s").text == "3/1500ms"
