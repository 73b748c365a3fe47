"""How a call governed by several limits gets one answer, one Redis call per limit.

``acquire_all`` admits when every limit does and gives back what was taken when one denies;
``reserve_all`` books one moment every limit admits; ``claim_all`` starts on the bookings a task
carries. They work on limiters only (no Celery), and return an :class:`Outcome`.

A limit with a concurrency cap decides its cap in the same call: an admission takes a slot for
the :class:`Who` given (given back with the rest when another limit denies); a full cap denies
like a block (``decision.capped``: the call then waits in the cap's line, see
:mod:`governor.celery.waiting.cap_line`). Slots freed on the way may be handed to waiting
tasks: their messages go into the ``handed`` list the caller passes, with the cap whose slot
each got, for it to publish.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

from ...costs import Cost
from ...decision import Decision, Slot
from ...limiter import Limiter
from ..metering.costs import share
from ..types import Handed, Held, LimitSpec, Outcome, Who, handed_by
from .carried import Carried

__all__ = ["acquire_all", "claim_all", "refund", "reserve_all"]

logger = logging.getLogger("governor.celery")
STEP = 0.01
"""The last ``CLOSE`` seconds before a slot are slept in steps this long (seconds)."""
CLOSE = 0.05


def _ids(who: Who | None) -> tuple[str | None, str | None, str]:
    """(holder, token, info) for a decision (limiters without a cap ignore them)."""
    return (None, None, "") if who is None else (who.holder, who.token, who.info)


def refund(held: Held, cost: Cost) -> Handed:
    """Give back what ``held`` took (slots too); returns the waiters handed a freed slot."""
    handed: Handed = []
    for lim, spec, d in held:
        if d.slot is not None:
            handed += handed_by(lim, spec.subject, lim.refund(spec.subject, d, share(lim, cost)))
    return handed


def acquire_all(
    limiters: list[tuple[Limiter, LimitSpec]],
    cost: Cost,
    who: Who | None = None,
    handed: Handed | None = None,
    carried: Carried | None = None,
) -> Outcome:
    """``carried``: slots of this process's previous tasks, each given back in the decision
    that takes the next slot of its cap and subject (see :mod:`.carried`)."""
    held: Held = []
    handed = [] if handed is None else handed
    for i, (lim, spec) in enumerate(limiters):
        holder, token, info = _ids(who)
        given = None
        if carried is not None and lim.cap is not None:
            given = carried.take(lim, spec.subject)
        try:
            d = lim.acquire(
                spec.subject,
                share(lim, cost),
                holder=holder,
                token=token,
                info=info,
                give_back=None if given is None else given.hold,
            )
        except BaseException:
            if given is not None and carried is not None:
                carried.failed(given)
            raise
        handed += handed_by(lim, spec.subject, d.handed)
        if d.allowed:
            held.append((lim, spec, d))
            continue
        handed += refund(held, cost)
        worst, worst_spec = d, spec
        for other, other_spec in limiters[i + 1 :] if d.capped is None else ():
            p = other.peek(
                other_spec.subject, share(other, cost), holder=who.holder if who else None
            )
            if not p.allowed and p.retry_after > worst.retry_after:
                worst, worst_spec = p, other_spec  # the rest may need longer
        return Outcome(False, delay=worst.retry_after, now=d.now, spec=worst_spec, decision=worst)
    return Outcome(True, held=held)


def claim_all(
    limiters: list[tuple[Limiter, LimitSpec]],
    cost: Cost,
    slots: Mapping[str, list[int]],
    tolerance: float,
    early_sleep: float,
    who: Who | None = None,
    handed: Handed | None = None,
) -> Outcome | None:
    """Start on the bookings a task carries. None: they are gone (a fresh reserve follows).
    A full concurrency cap denies: every booking goes back (the capped limit's own in its
    call, those of the limits after it unclaimed), and the call waits for a slot."""
    keys = [lim.keys(spec.subject)[0] for lim, spec in limiters]
    if set(keys) != set(slots):
        logger.debug("governor: bookings for %s, but limits %s", sorted(slots), keys)
        return None  # the limits changed since the booking
    tol = tolerance
    slept = 0.0
    handed = [] if handed is None else handed
    for _attempt in range(4):
        held: Held = []
        for i, ((lim, spec), key) in enumerate(zip(limiters, keys)):
            slot = Slot(*slots[key])
            holder, token, info = _ids(who)
            d = lim.claim(
                spec.subject,
                slot,
                share(lim, cost),
                tolerance=tol,
                holder=holder,
                token=token,
                info=info,
            )
            handed += handed_by(lim, spec.subject, d.handed)
            held.append((lim, spec, d))
            if d.capped is not None:
                handed += refund(held[:-1], cost)
                for later, later_spec in limiters[i + 1 :]:  # not claimed: still booked
                    slot = Slot(*slots[later.keys(later_spec.subject)[0]])
                    given = later.refund(later_spec.subject, slot, cost)
                    handed += handed_by(later, later_spec.subject, given)
                return Outcome(False, delay=d.retry_after, now=d.now, spec=spec, decision=d)
        if all(d.allowed for _, _, d in held):
            return Outcome(True, held=held)
        early = [
            d for (_, _, d), key in zip(held, keys) if d.booked and d.slot == Slot(*slots[key])
        ]
        if len(early) == len(held):
            wait = max(d.retry_after for d in early)
            if slept + wait <= early_sleep:
                # early (on purpose: Settings.lead): wait here, so the claim that counts
                # reaches Redis just after the slot opens
                _sleep_until(time.monotonic() + wait)
                slept += wait
                continue
            worst = max(held, key=lambda h: h[2].retry_after)
            return Outcome(
                False,
                delay=wait,
                now=early[0].now,
                slots=dict(slots),
                spec=worst[1],
                decision=worst[2],
            )
        break
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "governor: missed booking(s): %s",
            ", ".join(
                f"{spec.label} {1000 * (d.now - slots[key][1] / 1e6):+.0f}ms"
                for (_, spec, d), key in zip(held, keys)
            ),
        )
    # Late somewhere (or early and late at once): start afresh. What the late claims just
    # took (an admission or a new booking) is given back; the original bookings stay spent,
    # since a duplicate delivery of this message may already have run on them.
    for (lim, spec, d), key in zip(held, keys):
        if d.slot is not None and d.slot != Slot(*slots[key]):
            # a late claim's admission or booking, taken
            handed += handed_by(lim, spec.subject, lim.refund(spec.subject, d, share(lim, cost)))
        elif d.hold is not None:  # on time, with a slot: only the slot goes back
            handed += handed_by(lim, spec.subject, lim.release(spec.subject, d.hold)[1])
    return None


def _sleep_until(deadline: float) -> None:
    """Sleep most of the way in one go, then close in with short sleeps, whose wake-ups are
    quick even on a busy machine (a long sleep can wake tens of milliseconds late)."""
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left - CLOSE if left > CLOSE + STEP else min(left, STEP))


def _worst(held: Held) -> tuple[LimitSpec, Decision]:
    """The limit to name for a booking: the one whose rule denies now, latest slot first.

    A limit that would admit now is only booked for the common slot (``not_before``) and has
    no rule to show, so it is never named while another limit denies."""
    _, spec, d = max(held, key=lambda h: (h[2].rule is not None, h[2].now + h[2].retry_after))
    return spec, d


def reserve_all(
    limiters: list[tuple[Limiter, LimitSpec]],
    cost: Cost,
    tolerance: float,
    not_before: float | None = None,
    who: Who | None = None,
    handed: Handed | None = None,
) -> Outcome:
    """Admit now, or book one moment at which every limit admits the call (no earlier than
    ``not_before``, Unix seconds, which forces a booking). Only an admission now takes
    concurrency slots; a full cap denies at once."""
    handed = [] if handed is None else handed
    holder, token, info = _ids(who)
    tol = tolerance
    target: int | None = None if not_before is None else round(not_before * 1e6)
    mover: tuple[LimitSpec, Decision] | None = None
    # Each round only moves the target later, and only as far as bookings others made in the
    # meantime: it settles within a few rounds even with several workers booking at once.
    for _round in range(3 * len(limiters) + 6):
        held: Held = []
        moved: int | None = None
        for lim, spec in limiters:
            d = lim.reserve(
                spec.subject,
                share(lim, cost),
                tolerance=tol,
                not_before=None if target is None else target / 1e6,
                holder=holder,
                token=token,
                info=info,
            )
            handed += handed_by(lim, spec.subject, d.handed)
            if d.blocked is not None or d.retry_after == math.inf or d.capped is not None:
                handed += refund(held, cost)
                return Outcome(False, delay=d.retry_after, now=d.now, spec=spec, decision=d)
            held.append((lim, spec, d))
            if d.allowed:
                continue
            assert d.slot is not None
            if target is None and len(held) == 1:
                target = d.slot.start_us
            elif d.slot.start_us != target:
                moved, mover = d.slot.start_us, (spec, d)
                break
        if moved is None:
            if all(d.allowed for _, _, d in held):
                return Outcome(True, now=held[-1][2].now, held=held)
            assert target is not None
            last = held[-1][2]
            spec, decision = _worst(held)
            return Outcome(
                False,
                delay=max(0.0, target / 1e6 - last.now),
                now=last.now,
                slots={
                    lim.keys(spec.subject)[0]: [d.slot.start_us, d.slot.end_us]
                    for lim, spec, d in held
                    if d.slot is not None
                },
                spec=spec,
                decision=decision,
                held=held,
            )
        handed += refund(held, cost)
        target = moved
    # Others kept booking ahead of us: wait for the last target without a booking (named after
    # the limit that kept moving it).
    now = time.time()
    return Outcome(
        False,
        delay=max(0.0, (target or 0) / 1e6 - now),
        now=now,
        spec=mover[0] if mover is not None else None,
        decision=mover[1] if mover is not None else None,
    )
