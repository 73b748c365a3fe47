"""The asyncio limiter, on ``redis.asyncio`` clients.

Same scripts, same arguments, same replies: only the I/O is awaited.

>>> import redis.asyncio as aioredis
>>> limiter = Limiter(aioredis.Redis(), "10/s", name="partner-api")
>>> decision = await limiter.acquire("customer-42")
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ..blocks import ScriptCall
from ..caps import Left, Waited, handed, holder_text, lapsed, left, usage, waited
from ..core import LimiterBase
from ..costs import Cost
from ..decision import CapUsage, Decision, Hold, Pause, Settled, Slot, Usage
from ..keys import Subject, parse_key
from ..scripts import LuaScript
from ..text import as_text

__all__ = ["Limiter"]


class Limiter(LimiterBase):
    """Asyncio limiter; see :class:`governor.Limiter` for what each method does."""

    async def _eval(self, script: LuaScript, call: ScriptCall) -> Any:
        keys, args = call
        try:
            try:
                return await self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                return await self.client.eval(script.text, len(keys), *keys, *args)
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, keys) from exc

    async def acquire(
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
        hold = self._hold(holder, token)
        call = self._call("acquire", subject, cost, now, hold=hold, info=info, give_back=give_back)
        return self._decision(await self._eval(self._script, call), cost, hold)

    async def peek(
        self,
        subject: Subject,
        cost: Cost = 1,
        *,
        now: float | None = None,
        holder: str | None = None,
    ) -> Decision:
        hold = self._hold(holder, None)
        call = self._call("peek", subject, cost, now, hold=hold)
        return self._decision(await self._eval(self._script, call), cost, hold)

    async def reserve(
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
        return self._decision(await self._eval(self._script, call), cost, hold)

    async def lease(
        self, subject: Subject, cost: Cost = 1, *, span: float, now: float | None = None
    ) -> Decision:
        call = self._call("lease", subject, cost, now, tolerance=span)
        return self._decision(await self._eval(self._script, call), cost)

    async def claim(
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
        return self._decision(await self._eval(self._script, call), cost, hold)

    async def refund(
        self,
        subject: Subject,
        decision: Decision | Slot,
        cost: Cost | None = None,
        *,
        now: float | None = None,
    ) -> tuple[tuple[str, str], ...]:
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
        call = self._call("refund", subject, units, now, slot=slot, hold=hold)
        reply = await self._eval(self._script, call)
        return handed(reply[3:]) if hold is not None else ()

    async def settle(
        self,
        subject: Subject,
        reservation: Decision | Slot,
        used: Cost,
        *,
        estimate: Cost | None = None,
        id: str | None = None,
        now: float | None = None,
    ) -> Settled:
        """See :meth:`governor.Limiter.settle`."""
        if not self.rules:  # a concurrency cap alone counts no units
            return Settled("settled", getattr(reservation, "now", 0.0))
        call = self._settle_call(subject, reservation, used, estimate, id, now)
        if call is None:
            return Settled("unreserved", getattr(reservation, "now", 0.0))
        return self._settled(await self._eval(self._rates, call))

    async def sync_remaining(
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
        """See :meth:`governor.Limiter.sync_remaining`."""
        call = self._sync_call(subject, remaining, meter, reset_in, now, as_of, transit)
        return 0 if call is None else int(await self._eval(self._rates, call))

    # -- concurrency caps -----------------------------------------------------------------

    async def release(
        self, subject: Subject, hold: Hold | str, *, info: str = "", now: float | None = None
    ) -> tuple[bool, tuple[tuple[str, str], ...]]:
        holder, token = self._holder_token(hold)
        call = self._cap_call("release", subject, holder, token=token, info=info, now=now)
        reply = await self._eval(self._cap_ops, call)
        return int(reply[0]) == 1, handed(reply[3:])

    async def renew(self, subject: Subject, hold: Hold, *, now: float | None = None) -> bool:
        holder, token = self._holder_token(hold)
        call = self._cap_call("renew", subject, holder, token=token, now=now)
        return int((await self._eval(self._cap_ops, call))[0]) == 1

    async def wait(
        self, subject: Subject, holder: str, message: str = "", *, now: float | None = None
    ) -> Waited:
        call = self._cap_call("wait", subject, holder_text(holder), message=message, now=now)
        return waited(await self._eval(self._cap_ops, call))

    async def leave(self, subject: Subject, holder: str, *, now: float | None = None) -> Left:
        call = self._cap_call("cancel", subject, holder_text(holder), now=now)
        return left(await self._eval(self._cap_ops, call))

    async def cancel(
        self, subject: Subject, holder: str, *, now: float | None = None
    ) -> tuple[bool, tuple[tuple[str, str], ...]]:
        gone = await self.leave(subject, holder, now=now)
        return gone.gone, gone.handed

    async def lapsed(
        self, subject: Subject, *, now: float | None = None
    ) -> tuple[tuple[str, float], ...]:
        return lapsed(await self._eval(self._cap_ops, self._cap_call("lapsed", subject, now=now)))

    async def sweep(
        self, subject: Subject, *, now: float | None = None, configured: bool = True
    ) -> tuple[float, tuple[tuple[str, str], ...]]:
        call = self._cap_call("sweep", subject, now=now, limit=configured)
        reply = await self._eval(self._cap_ops, call)
        return int(reply[0]) / 1000, handed(reply[3:])

    async def holders(self, subject: Subject, *, now: float | None = None) -> CapUsage:
        return usage(await self._eval(self._cap_ops, self._cap_call("usage", subject, now=now)))

    async def usage(self, subject: Subject, *, now: float | None = None) -> Usage:
        reply = await self._eval(self._rates, self._call("usage", subject, 1, now))
        return self._usage(subject, reply)

    async def reset(self, subject: Subject) -> None:
        keys = self._state_keys(subject)
        try:
            await self.client.delete(*keys)
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, keys) from exc

    async def block(
        self, subject: Subject, seconds: float, reason: str = "", *, now: float | None = None
    ) -> float:
        until, _ = await self._eval(self._block, self._block_call(subject, seconds, reason, now))
        return float(until) / 1e6

    async def pause(
        self,
        subject: Subject,
        seconds: float | None = None,
        reason: str = "",
        *,
        base: float = 1.0,
        max_pause: float = 300.0,
        now: float | None = None,
    ) -> Pause:
        """See :meth:`governor.Limiter.pause`."""
        call = self._pause_call(subject, seconds, reason, base, max_pause, now)
        return self._pause(await self._eval(self._pause_script, call))

    async def unblock(self, subject: Subject) -> bool:
        keys = self.keys(subject)
        try:
            return bool(await self.client.delete(keys[1]))
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, keys) from exc

    async def subjects(self, count: int = 1000) -> AsyncIterator[str]:
        seen: set[str] = set()
        try:
            async for raw in self.client.scan_iter(match=self._pattern(), count=count):
                key = as_text(raw)
                parts = parse_key(key, self.prefix)
                if parts and parts[0] == self.name and parts[1] not in seen:
                    seen.add(parts[1])
                    yield parts[1]
        except (RedisError, RedisClusterException) as exc:
            raise self._error(exc, [self._pattern()]) from exc
