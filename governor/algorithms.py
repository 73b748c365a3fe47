"""The algorithms a limiter can run, and what each accepts.

==================  =========================================================  ==========
name                what it guarantees                                         bookings
==================  =========================================================  ==========
``sliding_log``     exact: at most N in *any* window of W (a log of entries)   yes
``gcra``            smooth spacing W/N with a burst of N; O(1) memory          yes
``token_bucket``    N tokens refilled evenly over W; O(1) memory               no
``fixed_window``    at most N per calendar window (up to 2N across a boundary)  no
``sliding_window``  at most N in any window, counted in buckets; for huge N    no
==================  =========================================================  ==========

``leaky_bucket`` is another name for ``gcra``.

A limiter may run a *share* of a ceiling's rules under the ceiling's state (an adaptive limit:
``Limiter(..., ceiling=...)``); :func:`check_share` says which shares keep each algorithm's
state right, so the ceiling holds through any change of share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .errors import ConfigError, RuleError
from .rules import Rule

__all__ = ["ALGORITHMS", "MAX_LOG", "STRETCH", "Algorithm", "check_share", "get_algorithm"]

MAX_LOG = 20_000
"""The most entries a sliding log keeps per subject (one per ms in which calls were counted),
and so the largest limit of a limiter without meters (whose calls may each count one unit).
A limiter with meters takes larger limits: its log stays exact while its longest window holds
at most this many entries (calls of at least limit / MAX_LOG units on average), and past that
counts the oldest as a full window (stricter, never looser); see docs/token-quotas.md."""


def _check_log(rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        if rule.limit > MAX_LOG:
            raise RuleError(
                f"rule {rule.text!r} would keep {rule.limit} entries per subject; the sliding "
                f"log allows at most {MAX_LOG}. Use algorithm='sliding_window' for large limits, "
                "or meters (Limiter(r, {'tokens': '1000000/d'}, ...)) when each call counts many "
                "units"
            )


def _check_gcra(rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        if rule.limit > rule.period_us:
            raise RuleError(
                f"rule {rule.text!r} is faster than one per microsecond, which gcra cannot space"
            )


def _check_bucket(rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        if rule.limit * rule.period_us > 2**53:
            raise RuleError(
                f"rule {rule.text!r} is too large for token_bucket (limit x period must stay below "
                "2**53 microseconds); use algorithm='sliding_window'"
            )


def _no_check(rules: tuple[Rule, ...]) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Algorithm:
    name: str
    script: str
    """Lua file name (without .lua)."""
    suffix: str
    """Key suffix of the subject's state."""
    books: bool
    """Whether reserve() can book a future slot (otherwise it acts as acquire)."""
    check: Callable[[tuple[Rule, ...]], None]


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("sliding_log", "sliding_log", "lg", True, _check_log),
        Algorithm("gcra", "gcra", "gc", True, _check_gcra),
        Algorithm("token_bucket", "token_bucket", "tb", False, _check_bucket),
        Algorithm("fixed_window", "fixed_window", "fw", False, _no_check),
        Algorithm("sliding_window", "sliding_window", "sw", False, _no_check),
    )
}
ALGORITHMS["leaky_bucket"] = ALGORITHMS["gcra"]


STRETCH = ("sliding_log", "gcra")
"""Algorithms whose state stays right under a longer period: the log's stamps, gcra's arrival
times (the others count per period, or per bucket of it)."""


def check_share(rules: tuple[Rule, ...], ceiling: tuple[Rule, ...], algorithm: str) -> None:
    """Refuse ``rules`` that are not a share of ``ceiling`` the algorithm's state can follow:
    rule by rule, at most the ceiling's limit over the same period, or (the sliding log and
    gcra) one unit over a longer period. Then the state kept under the ceiling's name stays
    right when the share changes, and no share ever admits past the ceiling: the counts of
    fixed and sliding windows and the tokens of a bucket are compared to a lower limit over the
    same period; gcra's arrival times only space calls wider (a longer interval, a burst no
    larger); the sliding log's stamps mean the same under any rules."""
    if len(rules) != len(ceiling):
        raise ConfigError(
            f"rules {_texts(rules)} are not a share of ceiling {_texts(ceiling)}: they need as "
            "many rules"
        )
    for rule, top in zip(rules, ceiling):
        same = rule.period_us == top.period_us and rule.limit <= top.limit
        longer = algorithm in STRETCH and rule.limit == 1 and rule.period_us >= top.period_us
        if not (same or longer):
            allowed = "a lower limit over the same period"
            if algorithm in STRETCH:
                allowed += ", or one unit over a longer one"
            raise ConfigError(
                f"rule {rule.text!r} is not a share of ceiling rule {top.text!r} under "
                f"{algorithm}: {allowed}"
            )


def _texts(rules: tuple[Rule, ...]) -> str:
    return repr(", ".join(r.text for r in rules))


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown algorithm {name!r}; choose one of {', '.join(sorted(ALGORITHMS))}"
        ) from None
