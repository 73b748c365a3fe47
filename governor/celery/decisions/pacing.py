"""Bookings made before an adaptive limit's rate went down are paced at its rate now.

A booking holds its moment at the rate in force when it was made, and a backlog is booked as
it arrives: at an adaptive limit's first guess, seconds or minutes ahead. When the upstream
refuses and the rate goes down (:mod:`..feedback.adaptive`), those bookings would all still
start at the old rate, meeting a 429 every window until they run out. So a call that claims a
booking made before its limit's last decrease must also pass the limit's rules as they are now,
counted apart from the bookings (starts only, under ``<prefix>:pace``: the bookings' own
counts hold the future the old rate promised). One that does not books afresh at the rate now,
its old booking left spent (a duplicate delivery may have run on it). This costs one more Redis
call per limit, only for calls booked before a decrease; only the algorithms that book
(sliding_log, gcra) have bookings to pace.
"""

from __future__ import annotations

from ...limiter import Limiter
from ..config.factors import limiter_rules
from ..config.live import LiveView
from ..config.store import Store
from ..types import Handed, LimitSpec, Outcome, WaitState, handed_by
from .rounds import acquire_all

__all__ = ["PACE", "Pacing"]

PACE = "pace"
"""The pace of an adaptive limit is counted under ``<prefix>:pace`` (the limit's own name)."""


class Pacing:
    """A process's pacing of stale bookings (see the module docstring)."""

    def __init__(self, store: Store, live: LiveView) -> None:
        self.store = store
        self.live = live
        self._pacers: dict[tuple[str, object], Limiter] = {}

    def stale(self, limiters: list[tuple[Limiter, LimitSpec]], state: WaitState) -> list[LimitSpec]:
        """The adaptive limits of a call whose bookings were made before their last decrease."""
        if state.booked is None:
            return []
        out = []
        for lim, spec in limiters:
            factor = self.live.factors.get(spec.label) if spec.config.adaptive else None
            if factor is not None and lim.books and state.booked < factor.since:
                out.append(spec)
        return out

    def pace(
        self,
        limiters: list[tuple[Limiter, LimitSpec]],
        cost: int,
        state: WaitState,
        claimed: Outcome,
        handed: Handed,
    ) -> Outcome | None:
        """``claimed`` (a claim that admitted), or None when a stale booking is over the rate
        now: the claim's concurrency slots go back and the caller books afresh."""
        stale = self.stale(limiters, state)
        if not stale:
            return claimed
        paced = acquire_all([(self.pacer(spec), spec) for spec in stale], cost, None, handed)
        if paced.allowed:
            claimed.held += paced.held
            return claimed
        for lim, spec, d in claimed.held:
            if d.hold is not None:
                handed += handed_by(lim, spec.subject, lim.release(spec.subject, d.hold)[1])
        return None

    def pacer(self, spec: LimitSpec) -> Limiter:
        """The limiter that counts the starts of ``spec``'s stale bookings at its rules now."""
        config = spec.config
        lim = self._pacers.get((spec.name, config))
        if lim is None or lim.client is not self.store.client:
            rules, ceiling = limiter_rules(
                config.rules, config.ceiling, config.algorithm, config.adaptive
            )
            lim = Limiter(
                self.store.client,
                rules,
                algorithm=config.algorithm,
                name=spec.name,
                prefix=f"{self.store.settings.prefix}:{PACE}",
                ceiling=ceiling,
            )
            if len(self._pacers) > 1000:
                self._pacers.clear()
            self._pacers[(spec.name, config)] = lim
        return lim
