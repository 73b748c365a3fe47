from __future__ import annotations

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.cluster import key_slot

from governor import ConfigError, Limiter, SubjectError
from governor.keys import escape, parse_key, unescape

text = st.text(min_size=1, max_size=300)


@given(text, text, text, text)
def test_distinct_pairs_never_share_a_key(n1: str, s1: str, n2: str, s2: str) -> None:
    k1 = Limiter(None, "1/s", name=n1).keys(s1)
    k2 = Limiter(None, "1/s", name=n2).keys(s2)
    assert (k1 == k2) == ((n1, s1) == (n2, s2))


@given(text, text)
def test_all_keys_of_a_subject_share_one_slot(name: str, subject: str) -> None:
    for algorithm in ("sliding_log", "gcra", "sliding_window"):
        state, block = Limiter(None, "1/s", name=name, algorithm=algorithm).keys(subject)
        assert key_slot(state.encode()) == key_slot(block.encode())
        assert parse_key(state, "governor") == (name, subject, state.rsplit(":", 1)[1])


@given(text)
def test_escape_round_trips(value: str) -> None:
    assert unescape(escape(value)) == value
    assert not set("{}:") & set(escape(value))


def test_examples() -> None:
    limiter = Limiter(None, "1/s", name="partner-api")
    assert limiter.keys("customer-42") == (
        "governor:{partner-api:customer-42}:lg",
        "governor:{partner-api:customer-42}:block",
    )
    assert limiter.keys(42) == limiter.keys("42")
    assert Limiter(None, "1/s", name="a:b").keys("c")[0] == "governor:{a%3Ab:c}:lg"
    assert Limiter(None, "1/s", name="a").keys("b:c")[0] == "governor:{a:b%3Ac}:lg"
    assert Limiter(None, "1/s", name="x").keys("{}")[0] == "governor:{x:%7B%7D}:lg"


@pytest.mark.parametrize("bad", ["", None, 1.5, b"bytes", True, ["x"]])
def test_bad_subjects(bad: object) -> None:
    with pytest.raises(SubjectError, match="subject"):
        Limiter(None, "1/s", name="x").keys(bad)  # type: ignore[arg-type]


def test_bad_names_and_prefixes() -> None:
    with pytest.raises(ConfigError, match="limiter name"):
        Limiter(None, "1/s", name="")
    with pytest.raises(ConfigError, match="prefix"):
        Limiter(None, "1/s", name="x", prefix="a{b")
    with pytest.raises(SubjectError, match="unicode"):
        Limiter(None, "1/s", name="x").keys("\ud800")


def test_unicode_and_long_subjects_work(r: redis.Redis, prefix: str) -> None:
    limiter = Limiter(r, "1/s", name="ünï:cödé", prefix=prefix)
    long = "é{}:%" * 2000
    assert limiter.acquire(long, now=100).allowed
    assert not limiter.acquire(long, now=100.5).allowed
    assert limiter.acquire("顧客", now=100).allowed
    assert sorted(limiter.subjects()) == sorted([long, "顧客"])
