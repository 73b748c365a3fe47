"""The short way of a call admitted from leases: the limiters a route's calls lease from.

``Gate._leased`` admits the usual call (first delivery, no governor header, a fixed cost) from
the admission leases of its pool process without building a :class:`~..types.Call`. A
:class:`LeaseLane` is what that needs, worked out once per route, view of the live limits and
Redis client: the route's limiters; the task's per-key limit, whose subject comes from each
call's arguments (a limiter, and the limit's spec for each subject seen lately); the fair
limits' queues, which the process must not have seen in use (a call of a fair queue in use
waits in it, behind those queued: the long way).

A route's concurrency caps without rules of their own go with it (``caps``): a slot is the
task's own, taken in Redis, so such a call takes the short way only while this process carries a
slot of each of its caps from its previous task (:mod:`..decisions.carried`: the caps have room,
and the one script that takes the slot gives that one back).

A route has no lane (the long way for every call) when a limit cannot lease: one that does not
book, a cap with rules of its own, a cost per meter, a shadow limit, a per-key limit that is
shadow, fair or capped, or an adaptive per-key limit under a factor.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...limiter import Limiter
from ..types import LimitSpec

__all__ = ["SUBJECTS", "LeaseLane", "leasable", "slot_only"]

SUBJECTS = 1024
"""Subjects of a per-key limit whose specs a lane keeps; past that it starts afresh (per-key
limits may see endless subjects)."""

Pair = tuple[Limiter, LimitSpec]


def leasable(lim: Limiter) -> bool:
    """Whether calls may take this limiter's units from leases (see :mod:`..decisions.leases`)."""
    return lim.books and lim.cap is None and not lim.meters


def slot_only(lim: Limiter) -> bool:
    """Whether ``lim`` is a concurrency cap with no rules of its own."""
    return lim.cap is not None and not lim.rules


class LeaseLane:
    """How one route's calls are admitted from leases in this process."""

    __slots__ = ("_subjects", "caps", "client", "fair", "key", "limiters")

    def __init__(
        self,
        client: Any,
        limiters: list[Pair],
        key: Pair | None = None,
        fair: tuple[tuple[str, str], ...] = (),
        caps: list[Pair] | None = None,
    ) -> None:
        self.client = client
        """The Redis client the limiters use (a forked process makes a lane of its own)."""
        self.limiters = limiters
        """The route's limits (queue, task), without the per-key limit."""
        self.key = key
        """The per-key limit's limiter and spec (its subject left empty), or None."""
        self.fair = fair
        """The fair limits' (name, subject): the process must not have seen them in use."""
        self.caps = caps or []
        """The route's concurrency caps without rules (their slots taken in Redis)."""
        self._subjects: dict[str, list[Pair]] = {}

    def with_key(self, subject: str) -> list[Pair]:
        """Every limit of a call whose key is ``subject``: the route's, then the key's."""
        pairs = self._subjects.get(subject)
        if pairs is None:
            assert self.key is not None
            lim, spec = self.key
            if len(self._subjects) >= SUBJECTS:
                self._subjects.clear()
            pairs = [*self.limiters, (lim, replace(spec, subject=subject))]
            self._subjects[subject] = pairs
        return pairs
