"""Model: limits never exceed their rules under adaptive changes.

A hypothesis state machine drives real limiters on the suite's redis-server with an explicit
clock, for each algorithm: time passes, calls are admitted or not, and the adaptive factor goes
down (as ``adapt.lua`` lowers it) and climbs back with time (``Factor.at``, with a hold below
where it was refused); each call runs under the share of the configured rules the factor gives
then (``scale_rules``), on the state named after the configured rules (``limiter_rules``, as
the workers' store runs it). After every step:

- every window holds no more than the CONFIGURED rules allow (each algorithm's own promise:
  see tests/support/windows.py), whatever the changes;
- a share that stays in force a full window holds its own rules from then on.

``GOVERNOR_HYPOTHESIS=thorough`` runs many more examples.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from governor import Limiter
from governor.celery.config.factors import Factor, limiter_rules, scale_rules
from governor.rules import Rule
from support.windows import breach

US = 1_000_000
START = 1_700_000_000 * US
DECREASE, FLOOR = 0.7, 0.05
ALGORITHMS = ["sliding_log", "gcra", "token_bucket", "fixed_window", "sliding_window"]

rules_st = st.lists(
    st.tuples(st.integers(1, 12), st.sampled_from([1, 2, 5, 60])),
    min_size=1,
    max_size=2,
    unique_by=lambda pair: pair[1],
)
dt_st = st.one_of(
    st.just(0),
    st.integers(1, 2_000),
    st.integers(1, 3 * US),
    st.integers(3 * US, 90 * US),
)


class AdaptiveLimits(RuleBasedStateMachine):
    def __init__(self, client: redis.Redis, algorithm: str) -> None:
        super().__init__()
        self.client = client
        self.algorithm = algorithm
        self.prefix = f"gm{uuid.uuid4().hex[:10]}"
        self.now = START
        self.admitted: list[tuple[int, int]] = []
        self.segments: list[dict[str, Any]] = []
        """Each share in force, in order: its rules, when it started, what it admitted."""
        self.limiters: dict[tuple[Rule, ...], Limiter] = {}

    @initialize(
        rules=rules_st,
        rise=st.sampled_from([0.0, 0.01, 0.05, 0.3]),
        hold=st.sampled_from([0.0, 2.0, 30.0]),
        start=st.sampled_from([1.0, 0.5, 0.12, FLOOR]),
        precision=st.sampled_from([1, 3, 60]),
    )
    def configure(
        self,
        rules: list[tuple[int, int]],
        rise: float,
        hold: float,
        start: float,
        precision: int,
    ) -> None:
        self.configured = tuple(Rule(n, w) for n, w in sorted(rules, key=lambda p: p[1]))
        self.rise, self.hold = rise, hold
        self.precision = precision if self.algorithm == "sliding_window" else None
        self.factor = Factor(start, self.now / US)

    def share(self) -> tuple[Rule, ...]:
        f = self.factor.at(self.now / US, self.rise, self.hold)
        return scale_rules(self.configured, f, self.algorithm)

    def limiter(self, share: tuple[Rule, ...]) -> Limiter:
        lim = self.limiters.get(share)
        if lim is None:
            rules, ceiling = limiter_rules(share, self.configured, self.algorithm, True)
            lim = Limiter(
                self.client,
                rules,
                algorithm=self.algorithm,
                name="adaptive",
                prefix=self.prefix,
                precision=self.precision,
                ceiling=ceiling,
            )
            self.limiters[share] = lim
        return lim

    @rule(dt=dt_st)
    def time_passes(self, dt: int) -> None:
        self.now += dt

    @rule(cost=st.one_of(st.just(1), st.integers(1, 3)))
    def call(self, cost: int) -> None:
        share = self.share()
        if not self.segments or self.segments[-1]["rules"] != share:
            self.segments.append({"rules": share, "start": self.now, "admitted": []})
        if self.limiter(share).acquire("s", cost, now=self.now / US).allowed:
            self.admitted.append((self.now, cost))
            self.segments[-1]["admitted"].append((self.now, cost))

    @rule()
    def upstream_refuses(self) -> None:
        """A Backoff under the limit: ``adapt.lua``'s decrease, remembering where."""
        f = self.factor.at(self.now / US, self.rise, self.hold)
        self.factor = Factor(max(FLOOR, f * DECREASE), self.now / US, f)

    @invariant()
    def never_past_the_configured_rules(self) -> None:
        if not self.segments:
            return
        spec = [(r.limit, r.period_us) for r in self.configured]
        found = breach(self.admitted, spec, self.algorithm)
        assert found is None, f"configured {self.configured}: {found}"

    @invariant()
    def a_settled_share_holds_its_own_rules(self) -> None:
        for seg in self.segments:
            spec = [(r.limit, r.period_us) for r in seg["rules"]]
            settled = seg["start"] + max(w for _, w in spec)
            found = breach(seg["admitted"], spec, self.algorithm, lo=settled)
            assert found is None, f"share {seg['rules']} from {seg['start']}: {found}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_limits_never_exceed_their_rules_under_adaptive_changes(
    r: redis.Redis, algorithm: str
) -> None:
    run_state_machine_as_test(lambda: AdaptiveLimits(r, algorithm))
