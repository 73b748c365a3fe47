"""The Redis limiter (blocking redis-py client). See :mod:`governor.aio` for asyncio."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from .caps import handed
from .core import Call
from .decision import Decision, Pause, Slot, Usage
from .direct import Lane, NotSent, lane_for
from .keys import Subject, parse_key
from .limiter_caps import CapOps
from .rules import RuleSpec
from .scripts import LuaScript

__all__ = ["Limiter"]


class Limiter(CapOps):
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
    ``ceiling``: rules that ``rules`` are a share of (an adaptive limit's configured rules): the
    state is kept under the ceiling's name, so every share reads the same counts and none
    admits past the ceiling (see :func:`governor.algorithms.check_share`).
    """

    def __init__(
        self,
        client: Any,
        rules: RuleSpec | None,
        *,
        algorithm: str = "sliding_log",
        name: str,
        prefix: str = "governor",
        precision: int | None = None,
        direct: bool = True,
        concurrency: int | None = None,
        lease: float = 30.0,
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

    def _eval(self, script: LuaScript, call: Call) -> Any:
        keys, args = call
        lane = self._lane() if script is self._script else None  # decisions, not blocks
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
        cost: int = 1,
        *,
        now: float | None = None,
        holder: str | None = None,
        token: str | None = None,
        info: str = "",
    ) -> Decision:
        """Admit ``cost`` units for ``subject`` if every rule allows it, counting them.

        With a concurrency cap, an admission also takes a slot for ``holder`` (a new id if
        None; ``info`` says who it is, for operators): ``decision.hold``, to give back with
        :meth:`release`. A full cap denies with ``decision.capped``.
        """
        hold = self._hold(holder, token)
        call = self._call("acquire", subject, cost, now, hold=hold, info=info)
        return self._decision(self._eval(self._script, call), cost, hold)

    def peek(
        self,
        subject: Subject,
        cost: int = 1,
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
        cost: int = 1,
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
        self, subject: Subject, cost: int = 1, *, span: float, now: float | None = None
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
        cost: int = 1,
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
        cost: int | None = None,
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
        if cost is None:
            cost = decision.cost if isinstance(decision, Decision) else 1
        if slot is None:
            return ()
        hold = self._refund_hold(decision)
        reply = self._eval(
            self._script, self._call("refund", subject, cost, now, slot=slot, hold=hold)
        )
        return handed(reply[3:]) if hold is not None else ()

    def usage(self, subject: Subject, *, now: float | None = None) -> Usage:
        """Per rule: units used, limit, seconds until one more fits and until it is all free."""
        return self._usage(subject, self._eval(self._rates, self._call("usage", subject, 1, now)))

    def reset(self, subject: Subject) -> None:
        """Forget everything counted for ``subject`` (a manual block stays)."""
        keys = self.keys(subject)
        try:
            self.client.delete(keys[0])
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
                key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
                parts = parse_key(key, self.prefix)
                if parts and parts[0] == self.name and parts[1] not in seen:
                    seen.add(parts[1])
                    yield parts[1]
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, [self._pattern()]) from exc
