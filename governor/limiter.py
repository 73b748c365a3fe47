"""The Redis limiter (blocking redis-py client). See :mod:`governor.aio` for asyncio."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from .blocks import ScriptCall
from .caps import Left, Waited, handed, holder_text, lapsed, left, usage, waited
from .core import LimiterBase
from .costs import Cost
from .decision import CapUsage, Decision, Hold, Pause, Settled, Slot, Usage
from .direct import Lane, NotSent, lane_for
from .keys import Subject, parse_key
from .rules import MeterSpec, RuleSpec
from .scripts import LuaScript
from .text import as_text

__all__ = ["Limiter"]


class Limiter(LimiterBase):
    """Several rules over one subject space, decided atomically in Redis.

    >>> import redis
    >>> partner_api = Limiter(redis.Redis(), "1/s, 20/m, 200/h, 800/d", name="partner-api")
    >>> d = partner_api.acquire("customer-42")          # one EVALSHA checks all four rules
    >>> if not d.allowed:
    ...     print(f"denied by {d.rule}, retry in {d.retry_after:.3f}s")

    ``client`` is any redis-py client (``Redis``, ``RedisCluster``, a Sentinel master). Every
    call takes one round trip. ``now`` (Unix seconds) replaces Redis ``TIME`` for tests and replay.
    With a plain ``Redis`` client, decisions go over lean connections made with the client's
    settings (:mod:`governor.direct`); ``direct=False`` sends them through the client.

    Rules per meter count what one call uses of several things at once, decided together
    (docs/token-quotas.md): reserve an estimate, then :meth:`settle` the real use.

    >>> llm = Limiter(redis.Redis(), {"requests": "500/m", "tokens": "30000/m, 1000000/d"},
    ...               name="openai")
    >>> d = llm.acquire("org-1", cost={"requests": 1, "tokens": 1800})  # all meters or none
    >>> llm.settle("org-1", d, {"tokens": 950})    # the unused 850 go back   # doctest: +SKIP

    ``ceiling``: rules that ``rules`` are a share of (an adaptive limit's configured rules): the
    state is kept under the ceiling's name, so every share reads the same counts and none
    admits past the ceiling (see :func:`governor.algorithms.check_share`).
    """

    def __init__(
        self,
        client: Any,
        rules: RuleSpec | MeterSpec | None,
        *,
        algorithm: str = "sliding_log",
        name: str,
        prefix: str = "governor",
        precision: int | None = None,
        direct: bool = True,
        concurrency: int | None = None,
        lease: float = 30.0,
        settle_within: float = 600.0,
        ceiling: RuleSpec | None = None,
    ) -> None:
        super().__init__(
            client,
            rules,
            algorithm=algorithm,
            name=name,
            prefix=prefix,
            precision=precision,
            concurrency=concurrency,
            lease=lease,
            settle_within=settle_within,
            ceiling=ceiling,
        )
        self.direct = direct
        self._lane_of: tuple[Any, Lane | None] = (None, None)

    def _lane(self) -> Lane | None:
        client, lane = self._lane_of
        if client is not self.client:  # made once per client (the attribute may be replaced)
            lane = lane_for(self.client) if self.direct else None
            self._lane_of = (self.client, lane)
        return lane

    def _eval(self, script: LuaScript, call: ScriptCall) -> Any:
        keys, args = call
        # decisions and the caps' operations (a slot given back, renewed, a line joined) go
        # over the lean lane; manual blocks, rare, through the client
        lane = self._lane() if script is self._script or script is self._cap_ops else None
        try:
            if lane is not None and time.monotonic() >= lane.rest_until:
                try:
                    return lane.evalsha(script.sha, keys, args)
                except NoScriptError:  # the script cache was flushed
                    return self.client.eval(script.text, len(keys), *keys, *args)
                except NotSent:
                    pass  # nothing reached Redis: the client's path, with its retries
            try:
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                return self.client.eval(script.text, len(keys), *keys, *args)
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, keys) from exc

    def acquire(
        self,
        subject: Subject,
        cost: Cost = 1,
        *,
        now: float | None = None,
        holder: str | None = None,
        token: str | None = None,
        info: str = "",
        give_back: Hold | None = None,
    ) -> Decision:
        """Admit ``cost`` units for ``subject`` if every rule allows it, counting them.

        With a concurrency cap, an admission also takes a slot for ``holder`` (a new id if
        None; ``info`` says who it is, for operators): ``decision.hold``, to give back with
        :meth:`release`. A full cap denies with ``decision.capped``. ``give_back``: a slot
        this caller held (its :class:`Hold`) given back first in the same call, as
        :meth:`release` would (the oldest waiter gets it before this holder is asked).
        """
        hold = self._hold(holder, token)
        call = self._call("acquire", subject, cost, now, hold=hold, info=info, give_back=give_back)
        return self._decision(self._eval(self._script, call), cost, hold)

    def peek(
        self,
        subject: Subject,
        cost: Cost = 1,
        *,
        now: float | None = None,
        holder: str | None = None,
    ) -> Decision:
        """The answer :meth:`acquire` would give now, without counting anything."""
        hold = self._hold(holder, None)
        call = self._call("peek", subject, cost, now, hold=hold)
        return self._decision(self._eval(self._script, call), cost, hold)

    def reserve(
        self,
        subject: Subject,
        cost: Cost = 1,
        *,
        now: float | None = None,
        not_before: float | None = None,
        max_wait: float | None = None,
        tolerance: float = 0.0,
        holder: str | None = None,
        token: str | None = None,
        info: str = "",
    ) -> Decision:
        """Admit now, or book the earliest moment every rule admits (first come, first served).

        A booking is counted by every rule at once, so later callers queue behind it. It is
        returned as ``decision.slot``: the holder may start at any moment in
        ``[slot.start, slot.end]`` where ``slot.end = slot.start + tolerance``, and proves it
        with :meth:`claim`. No booking is made when the wait would exceed ``max_wait`` seconds.
        ``not_before`` (Unix seconds) books no earlier than that moment. Algorithms that cannot
        book (token_bucket, fixed_window, sliding_window) act as :meth:`acquire`. With a
        concurrency cap, only an admission now takes a slot (a booking holds none: the cap is
        asked again at :meth:`claim`).
        """
        hold = self._hold(holder, token)
        call = self._call(
            "reserve",
            subject,
            cost,
            now,
            not_before=not_before,
            max_wait=max_wait,
            tolerance=tolerance,
            hold=hold,
            info=info,
        )
        return self._decision(self._eval(self._script, call), cost, hold)

    def lease(
        self, subject: Subject, cost: Cost = 1, *, span: float, now: float | None = None
    ) -> Decision:
        """Admit ``cost`` units now that may be used at any moment up to ``span`` seconds later.

        For callers that admit work locally in batches: the units are counted as a booking
        whose slot is now (stamped at its end), so the rules hold on whenever each unit is
        actually used within the span. Units left unused stay counted unless refunded
        (``refund(subject, decision, unused)``: the sliding log gives back exactly those; gcra
        only a whole lease that is still its newest). Denied as :meth:`acquire` is. Only for
        the algorithms that book (sliding_log, gcra).
        """
        return self._decision(
            self._eval(self._script, self._call("lease", subject, cost, now, tolerance=span)),
            cost,
        )

    def claim(
        self,
        subject: Subject,
        slot: Slot,
        cost: Cost = 1,
        *,
        now: float | None = None,
        max_wait: float | None = None,
        tolerance: float | None = None,
        holder: str | None = None,
        token: str | None = None,
        info: str = "",
    ) -> Decision:
        """Start on a booked slot.

        On time (``slot.start <= now <= slot.end``): allowed, nothing more is counted. Early:
        denied with the wait until ``slot.start`` and the booking kept. Late: the call acts as
        :meth:`reserve` (admitted now if the rules allow, else a new booking behind the queue),
        so late starters never burst with punctual ones; the missed slot stays spent (a duplicate
        delivery could hold the same booking after it was used).
        ``tolerance`` for a new booking defaults to the slot's own. With a concurrency cap that
        is full, the booking is given back and the claim is denied with ``decision.capped``.
        """
        tol = (slot.end_us - slot.start_us) / 1e6 if tolerance is None else tolerance
        hold = self._hold(holder, token)
        call = self._call(
            "claim",
            subject,
            cost,
            now,
            max_wait=max_wait,
            tolerance=tol,
            slot=slot,
            hold=hold,
            info=info,
        )
        return self._decision(self._eval(self._script, call), cost, hold)

    def refund(
        self,
        subject: Subject,
        decision: Decision | Slot,
        cost: Cost | None = None,
        *,
        now: float | None = None,
    ) -> tuple[tuple[str, str], ...]:
        """Give back what an admitted or booked decision counted (e.g. another limit denied).

        Refund a decision at most once. The sliding log removes exactly that admission or
        booking; gcra gives back only the newest one (otherwise the capacity stays spent);
        token_bucket only within the shortest window; a peek holds nothing to refund. A
        concurrency slot the decision took is released too: returns the waiters it was handed
        to (see :attr:`Decision.handed`).
        """
        slot = decision.slot if isinstance(decision, Decision) else decision
        if slot is None:
            return ()
        if isinstance(decision, Decision):
            units = self._estimate(decision)
        else:
            units = self._units(1, fits=False)
        if cost is not None:
            units = self._units(cost, fits=False)
        hold = self._refund_hold(decision)
        reply = self._eval(
            self._script, self._call("refund", subject, units, now, slot=slot, hold=hold)
        )
        return handed(reply[3:]) if hold is not None else ()

    def settle(
        self,
        subject: Subject,
        reservation: Decision | Slot,
        used: Cost,
        *,
        estimate: Cost | None = None,
        id: str | None = None,
        now: float | None = None,
    ) -> Settled:
        """Settle a reservation (an admission or booking) with the units really used.

        Per rule, the estimate's units beyond the use go back to the window the reservation
        was counted in, as far as it still counts there (the sliding log exactly; the others as
        docs/token-quotas.md says); use beyond the estimate is charged now, admitted or not, so
        later calls wait for it. ``used`` is an integer or, with meters, units per meter (a
        meter left out was used as estimated). ``reservation`` is the decision that counted
        it (for a booking: the claim's), or its slot with the ``estimate`` it counted.

        A reservation is settled once: ``id`` (say, the task id; default: its slot) names it,
        and a second settle of the same id changes nothing (``status == "duplicate"``).
        Settling is a lease: after ``settle_within`` seconds from the reservation, the
        estimate stands (``status == "lapsed"``). A denied decision reserved nothing: settled
        as ``"unreserved"``.
        """
        if not self.rules:  # a concurrency cap alone counts no units
            return Settled("settled", getattr(reservation, "now", 0.0))
        call = self._settle_call(subject, reservation, used, estimate, id, now)
        if call is None:
            return Settled("unreserved", getattr(reservation, "now", 0.0))
        return self._settled(self._eval(self._rates, call))

    def sync_remaining(
        self,
        subject: Subject,
        remaining: int,
        *,
        meter: str | None = None,
        reset_in: float | None = None,
        now: float | None = None,
        as_of: float | None = None,
        transit: float = 0.0,
    ) -> int:
        """The upstream reports ``remaining`` units of ``meter`` left (its own counter, e.g.
        ``x-ratelimit-remaining-tokens``): when governor counts more room than that, charge
        the difference now, so every worker sees the upstream's view. Returns the units charged
        (0 when governor counted as much or more).

        The room compared is that of the meter's rule whose window is the shortest at least
        ``reset_in`` seconds long (the upstream's counter resets within its window; without
        ``reset_in``: the meter's rule with the least room). The charge counts in every rule
        of the meter, like the units of a call.

        ``as_of``: the moment (Unix seconds, the limiter's clock) the upstream's counter was
        read, say the admission of the call whose answer carried it (``decision.slot.end``).
        The sliding log then compares its room at that moment, leaving out what it admitted
        since, which the upstream had not seen: compared with the room now, calls in flight
        would hide that much of what another client spent. The other algorithms keep no
        history and compare their room now. ``transit``: how much longer the rules' windows
        are than the upstream's (rules lengthened for the time a call takes to arrive, the
        Celery layer's ``transit``); the room as of ``as_of`` is counted over the upstream's.

        Headroom (the sliding log): a sync that charged something also keeps, apart from the
        log, what the readings found the other client spent (their sum over about the meter's
        shortest window, fading as readings find nothing) and the latest reading's moment.
        Decisions then keep free what the other client is projected to have spent since that
        reading at that rate (a window's worth at most, never more than the limit less the
        call's units), which no reading shows yet; the next reading counts it in the log and
        starts again. A limit that never had a sync that charged anything decides as before
        (docs/token-quotas.md).
        """
        call = self._sync_call(subject, remaining, meter, reset_in, now, as_of, transit)
        return 0 if call is None else int(self._eval(self._rates, call))

    def usage(self, subject: Subject, *, now: float | None = None) -> Usage:
        """Per rule: units used, limit, seconds until one more fits and until it is all free."""
        return self._usage(subject, self._eval(self._rates, self._call("usage", subject, 1, now)))

    def reset(self, subject: Subject) -> None:
        """Forget everything counted for ``subject`` (a manual block stays)."""
        keys = self._state_keys(subject)
        try:
            self.client.delete(*keys)
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, keys) from exc

    def block(
        self, subject: Subject, seconds: float, reason: str = "", *, now: float | None = None
    ) -> float:
        """Deny ``subject`` for ``seconds`` (replacing any block); returns when it ends."""
        call = self._block_call(subject, seconds, reason, now)
        until, _ = self._eval(self._block, call)
        return float(until) / 1e6

    def pause(
        self,
        subject: Subject,
        seconds: float | None = None,
        reason: str = "",
        *,
        base: float = 1.0,
        max_pause: float = 300.0,
        now: float | None = None,
    ) -> Pause:
        """Pause ``subject`` after its upstream pushed back: deny it for ``seconds`` (a
        ``Retry-After``), or, with None, for ``base`` x 2^(n - 1) after the n-th pause in a row
        (at most ``max_pause``). Unlike :meth:`block` it never shortens a block or pause in
        place. Bookings asked for from its end on (``reserve(not_before=...)``) go through.

        >>> limiter.pause("customer-42", 30, "HTTP 429")          # doctest: +SKIP
        """
        call = self._pause_call(subject, seconds, reason, base, max_pause, now)
        return self._pause(self._eval(self._pause_script, call))

    def unblock(self, subject: Subject) -> bool:
        """Lift a manual block; True if there was one."""
        keys = self.keys(subject)
        try:
            return bool(self.client.delete(keys[1]))
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, keys) from exc

    def subjects(self, count: int = 1000) -> Iterator[str]:
        """Subjects with state or a block in Redis (SCAN, never KEYS; may repeat on rehash)."""
        seen: set[str] = set()
        try:
            for raw in self.client.scan_iter(match=self._pattern(), count=count):
                key = as_text(raw)
                parts = parse_key(key, self.prefix)
                if parts and parts[0] == self.name and parts[1] not in seen:
                    seen.add(parts[1])
                    yield parts[1]
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, [self._pattern()]) from exc

    # -- concurrency caps -----------------------------------------------------------------

    def release(
        self, subject: Subject, hold: Hold | str, *, info: str = "", now: float | None = None
    ) -> tuple[bool, tuple[tuple[str, str], ...]]:
        """Give back a concurrency slot: (released, waiters handed a slot). A :class:`Hold`
        releases only with its token (never a slot taken over by another); a holder id with
        ``info`` releases the slot that holder took with that info (for a process that died).
        False when the slot was no longer held (its lease lapsed)."""
        holder, token = self._holder_token(hold)
        call = self._cap_call("release", subject, holder, token=token, info=info, now=now)
        reply = self._eval(self._cap_ops, call)
        return int(reply[0]) == 1, handed(reply[3:])

    def renew(self, subject: Subject, hold: Hold, *, now: float | None = None) -> bool:
        """Extend a slot's lease by ``lease`` seconds from now; False if it is no longer held
        (it lapsed and was removed, or taken over)."""
        holder, token = self._holder_token(hold)
        call = self._cap_call("renew", subject, holder, token=token, now=now)
        return int(self._eval(self._cap_ops, call)[0]) == 1

    def wait(
        self, subject: Subject, holder: str, message: str = "", *, now: float | None = None
    ) -> Waited:
        """Queue ``holder`` for a slot unless one is free for it now (then decide again).
        ``message`` is what a hand-over returns for the caller to publish (a Celery task's
        message); "" queues a process that waits on its own (see :class:`Concurrency`). A
        holder whose hand-over lapsed goes back to its place; a copy of a running holder waits
        behind it (dropped when it releases, handed its slot if its lease lapses)."""
        call = self._cap_call("wait", subject, holder_text(holder), message=message, now=now)
        return waited(self._eval(self._cap_ops, call))

    def leave(self, subject: Subject, holder: str, *, now: float | None = None) -> Left:
        """``holder`` is gone and will not start (a task revoked, expired or unreadable; a
        process that stops waiting): take it out of the line, pass on a slot handed to it,
        forget its lapsed hand-over or its copy waiting behind a running holder. A running
        holder's own slot is never touched. Says where it was and the message it left there
        (to dead-letter), and which waiters a freed slot went to (publish them)."""
        call = self._cap_call("cancel", subject, holder_text(holder), now=now)
        return left(self._eval(self._cap_ops, call))

    def cancel(
        self, subject: Subject, holder: str, *, now: float | None = None
    ) -> tuple[bool, tuple[tuple[str, str], ...]]:
        """Stop waiting (see :meth:`leave`): (whether it waited or was handed a slot, the
        waiters a slot it gave up went to)."""
        gone = self.leave(subject, holder, now=now)
        return gone.gone, gone.handed

    def lapsed(
        self, subject: Subject, *, now: float | None = None
    ) -> tuple[tuple[str, float], ...]:
        """The oldest 100 hand-overs that lapsed (their holders never started on the slot, and
        their messages have not come back): (holder, when it lapsed, Unix seconds). A message
        that never comes (lost, or unreadable) stays until :meth:`leave` takes it."""
        return lapsed(self._eval(self._cap_ops, self._cap_call("lapsed", subject, now=now)))

    def sweep(
        self, subject: Subject, *, now: float | None = None, configured: bool = True
    ) -> tuple[float, tuple[tuple[str, str], ...]]:
        """Remove lapsed holders and hand their slots to waiters: (the next moment a sweep
        could matter, Unix seconds, 0 when nobody waits, in line or behind a holder; waiters
        handed a slot).
        ``configured=False``: use the limit stored by the last waiter (this limiter's may
        be a stand-in)."""
        call = self._cap_call("sweep", subject, now=now, limit=configured)
        reply = self._eval(self._cap_ops, call)
        return int(reply[0]) / 1000, handed(reply[3:])

    def holders(self, subject: Subject, *, now: float | None = None) -> CapUsage:
        """The subject's concurrency slots: who holds them, since when, and how many wait."""
        return usage(self._eval(self._cap_ops, self._cap_call("usage", subject, now=now)))
