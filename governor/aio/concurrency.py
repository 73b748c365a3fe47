"""The asyncio twin of :class:`governor.Concurrency` (see there for what a cap promises).

>>> warehouse = Concurrency(redis.asyncio.Redis(), 5, name="warehouse")
>>> async with warehouse.hold("export") as permit:
...     await run_export(fence=permit.fence)

Each permit is renewed by a task of its own, every third of its lease, until released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..caps import holder_text, new_token
from ..concurrency import LAPSE_MARGIN, WAIT_CHUNK, Handed, _socket_timeout
from ..decision import CapUsage, Hold
from ..errors import GovernorError, GovernorTimeout, SlotLost, StorageUnavailable
from ..keys import Subject, subject_text
from .limiter import Limiter

__all__ = ["Concurrency", "Permit"]

logger = logging.getLogger("governor")


class Permit:
    """A concurrency slot held (asyncio): ``await permit.release()``."""

    def __init__(
        self,
        limiter: Limiter,
        subject: Subject,
        hold: Hold,
        *,
        on_lost: Callable[[Permit], None] | None = None,
    ) -> None:
        self.limiter = limiter
        self.subject = subject_text(subject)
        self.hold = hold
        self.on_lost = on_lost
        self.lost = False
        self.released = False
        self.renewed_at = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    @property
    def holder(self) -> str:
        return self.hold.holder

    @property
    def fence(self) -> int:
        return self.hold.fence

    def check(self) -> None:
        if self.lost:
            raise SlotLost(
                f"concurrency slot of {self.holder!r} on {self.limiter.name}:{self.subject} "
                "was lost (its lease lapsed without renewal)"
            )

    def _mark_lost(self, why: str) -> None:
        if self.lost or self.released:
            return
        self.lost = True
        logger.error(
            "governor: concurrency slot of %s on %s:%s lost: %s; another holder may run",
            self.holder,
            self.limiter.name,
            self.subject,
            why,
        )
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                logger.exception("governor: on_lost callback failed")

    async def renew(self) -> bool:
        sent = time.monotonic()
        if await self.limiter.renew(self.subject, self.hold):
            self.renewed_at = sent
            return True
        self._mark_lost("it is no longer held in Redis")
        return False

    async def release(self) -> tuple[bool, Handed]:
        if self.released:
            return False, ()
        self.released = True
        if self._task is not None:
            self._task.cancel()
        released, handed = await self.limiter.release(self.subject, self.hold)
        return bool(released), handed

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renewals())

    async def _renewals(self) -> None:
        lease = self.hold.lease
        wait = lease / 3
        while not self.released:
            await asyncio.sleep(wait)
            try:
                if not await self.renew():
                    return
                wait = lease / 3
            except (GovernorError, RedisError) as exc:
                if time.monotonic() >= self.renewed_at + lease:
                    self._mark_lost(f"its lease ran out while Redis was unreachable ({exc})")
                wait = min(1.0, lease / 10)

    async def __aenter__(self) -> Permit:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class Concurrency:
    """At most ``limit`` holders of each subject at once (asyncio)."""

    def __init__(
        self,
        client: Any,
        limit: int,
        *,
        name: str,
        prefix: str = "governor",
        lease: float = 30.0,
        on_lost: Callable[[Permit], None] | None = None,
    ) -> None:
        self.limiter = Limiter(
            client, None, concurrency=limit, lease=lease, name=name, prefix=prefix
        )
        self.on_lost = on_lost

    @property
    def name(self) -> str:
        return self.limiter.name

    async def acquire(
        self,
        subject: Subject,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        holder: str | None = None,
        info: str = "",
    ) -> Permit | None:
        holder = holder_text(holder) if holder is not None else f"p-{new_token()}"
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        queued = False
        try:
            while True:
                d = await self.limiter.acquire(subject, holder=holder, info=info)
                if d.allowed and d.hold is not None:
                    queued = False
                    permit = Permit(self.limiter, subject, d.hold, on_lost=self.on_lost)
                    permit._start()
                    return permit
                if not blocking or d.capped == "done":
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                if d.capped is None:  # a manual block: it ends at a known moment
                    await asyncio.sleep(
                        min(d.retry_after, left if left is not None else d.retry_after)
                    )
                    continue
                w = await self.limiter.wait(subject, holder)  # (again, see the sync twin)
                queued = w.status == "queued"
                if w.status == "done":
                    return None
                if queued:  # a holder that died frees its slot when its lease ends: look then
                    await self._block(subject, holder, left, d.retry_after)
        finally:
            if queued:
                with contextlib.suppress(GovernorError, RedisError):
                    await self.limiter.cancel(subject, holder)

    @contextlib.asynccontextmanager
    async def hold(
        self,
        subject: Subject,
        *,
        timeout: float | None = None,
        holder: str | None = None,
        info: str = "",
    ) -> AsyncIterator[Permit]:
        permit = await self.acquire(subject, timeout=timeout, holder=holder, info=info)
        if permit is None:
            raise GovernorTimeout(
                f"no concurrency slot of {self.name}:{subject_text(subject)} within {timeout}s"
            )
        try:
            yield permit
        finally:
            await permit.release()

    async def holders(self, subject: Subject) -> CapUsage:
        return await self.limiter.holders(subject)

    async def _block(self, subject: Subject, holder: str, left: float | None, lapse: float) -> None:
        chunk = min(WAIT_CHUNK, lapse + LAPSE_MARGIN, WAIT_CHUNK if left is None else left)
        chunk = max(0.01, chunk)
        timeout = _socket_timeout(self.limiter.client)
        if timeout is not None:
            chunk = min(chunk, max(0.05, timeout - 0.25))
        try:
            await self.limiter.client.blpop([self.limiter.wake_key(subject, holder)], timeout=chunk)
        except RedisTimeoutError:
            pass
        except RedisError as exc:
            raise StorageUnavailable(
                f"Redis did not answer a waiter on {self.name}: {exc}"
            ) from exc
