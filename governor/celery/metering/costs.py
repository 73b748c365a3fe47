"""What one call costs under each of its limits, when a task's cost names meters.

A task's ``governor_cost`` is an integer (that many units of every rule, as always) or units per
meter, ``{"requests": 1, "tokens": 1800}``; a value may be :func:`learned` (see
:mod:`.learned`). Each limit of the call counts its own share of it (:func:`share`):

- a limit with meters: the units of its own meters the cost names (a meter left out: 0);
- a limit without meters: one unit (it counts calls);
- a concurrency cap: the call, as always.

A meter that no limit of the call has is an error, and so is a cost that names none of a metered
limit's meters, or more units than one of its rules can ever admit (:func:`check`): the call
can never run as asked, and says so at once, before anything is counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...costs import MAX_UNITS, Cost
from ...errors import CostError
from ...limiter import Limiter
from ..types import LimitConfig, LimitSpec

__all__ = ["Learned", "check", "fair_step", "learned", "share"]


@dataclass(frozen=True, slots=True)
class Learned:
    """A meter's units learned from what the task really used (see :mod:`.learned`)."""

    default: int
    """What a call reserves while the task has too little history; learned estimates scale it."""
    most: int | None = None
    """Never reserve more than this (say, the prompt and ``max_tokens``: the worst case)."""


def learned(default: int, *, most: int | None = None) -> Learned:
    """Units learned from use, for a meter of ``governor_cost``:

    >>> governor_cost = lambda prompt, max_tokens, **_: {
    ...     "requests": 1, "tokens": learned(len(prompt) // 4 + max_tokens)}

    The call reserves ``default`` times a high percentile (``governor_learned_percentile``,
    0.95) of use/default over the task's last 200 settled calls, at most ``most``; with fewer
    than 10 of them, ``default`` itself. See docs/token-quotas.md, "Learned estimates"."""
    for name, value in (("default", default), ("most", most)):
        if value is None and name == "most":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UNITS:
            raise CostError(
                f"learned({name}=...) must be an integer from 0 to {MAX_UNITS}, got {value!r}"
            )
    return Learned(default, most)


def share(lim: Limiter, cost: Cost) -> Cost:
    """The part of a call's cost that ``lim`` counts (see the module docstring)."""
    if type(cost) is int:
        return cost
    if not lim.meters:
        return 1
    assert isinstance(cost, Mapping)
    return {m: cost[m] for m in lim.meters if m in cost}


def check(task: str, cost: Mapping[str, Any], limiters: list[tuple[Limiter, LimitSpec]]) -> None:
    """Fail a cost per meter that no decision could ever admit (:class:`CostError`, naming the
    task and the limit), before anything is counted."""
    known: set[str] = set()
    for lim, spec in limiters:
        known.update(lim.meters)
        if not lim.meters:
            continue
        part = share(lim, cost)
        if not part:
            raise CostError(
                f"task {task!r} costs {dict(cost)!r}, which names none of the meters of limit "
                f"{spec.label} ({', '.join(lim.meters)})"
            )
        try:
            lim.check_cost(part)
        except CostError as exc:
            raise CostError(f"task {task!r}, limit {spec.label}: {exc}") from None
    unknown = sorted(set(cost) - known)
    if unknown:
        raise CostError(
            f"task {task!r} costs {dict(cost)!r}: no limit of this call has meter(s) "
            f"{', '.join(map(repr, unknown))} (its meters: {', '.join(sorted(known)) or 'none'})"
        )


def fair_step(config: LimitConfig, cost: Cost) -> float:
    """How far a call moves its tenant's tag in a fair limit's queue: its cost, or with meters
    the largest share of a meter's tightest rule it takes (in thousandths)."""
    if not config.meters:
        return float(cost) if type(cost) is int else 1.0
    step = 0.0
    for meter, rules in config.meters:
        units = cost if type(cost) is int else cost.get(meter, 0)  # type: ignore[union-attr]
        step = max(step, 1000.0 * units / min(r.limit for r in rules))
    return step if math.isfinite(step) and step > 0 else 1.0
