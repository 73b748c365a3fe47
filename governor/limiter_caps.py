"""The concurrency-cap operations of the blocking limiter (release, renew, wait, cancel,
sweep, holders): one ``cap_ops.lua`` call each. :class:`governor.Limiter` has them all."""

from __future__ import annotations

from typing import Any

from .caps import Waited, handed, holder_text, usage, waited
from .core import Call, LimiterBase
from .decision import CapUsage, Hold
from .keys import Subject
from .scripts import LuaScript

__all__ = ["CapOps"]


class CapOps(LimiterBase):
    """What a :class:`governor.Limiter` with ``concurrency=`` can do with its slots."""

    def _eval(self, script: LuaScript, call: Call) -> Any:
        raise NotImplementedError

    def release(
        self, subject: Subject, hold: Hold | str, *, info: str = "", now: float | None = None
    ) -> tuple[bool, tuple[tuple[str, str], ...]]:
        """Give back a concurrency slot: (released, waiters handed a slot). A :class:`Hold`
        releases only with its token (never a slot taken over by another); a holder id with
        ``info`` releases the slot that holder took with that info (for a process that died).
        False when the slot was no longer held (its lease lapsed)."""
        holder, token = (hold.holder, hold.token) if isinstance(hold, Hold) else (hold, "")
        call = self._cap_call(
            "release", subject, holder_text(holder), token=token, info=info, now=now
        )
        reply = self._eval(self._cap_ops, call)
        return int(reply[0]) == 1, handed(reply[3:])

    def renew(self, subject: Subject, hold: Hold, *, now: float | None = None) -> bool:
        """Extend a slot's lease by ``lease`` seconds from now; False if it is no longer held
        (it lapsed and was removed, or taken over)."""
        call = self._cap_call("renew", subject, hold.holder, token=hold.token, now=now)
        return int(self._eval(self._cap_ops, call)[0]) == 1

    def wait(
        self, subject: Subject, holder: str, message: str = "", *, now: float | None = None
    ) -> Waited:
        """Queue ``holder`` for a slot unless one is free for it now (then decide again).
        ``message`` is what a hand-over returns for the caller to publish (a Celery task's
        message); "" queues a process that waits on its own (see :class:`Concurrency`)."""
        call = self._cap_call("wait", subject, holder_text(holder), message=message, now=now)
        return waited(self._eval(self._cap_ops, call))

    def cancel(
        self, subject: Subject, holder: str, *, now: float | None = None
    ) -> tuple[bool, tuple[tuple[str, str], ...]]:
        """Leave the queue (a slot handed to ``holder`` meanwhile is passed on)."""
        call = self._cap_call("cancel", subject, holder_text(holder), now=now)
        reply = self._eval(self._cap_ops, call)
        return int(reply[0]) == 1, handed(reply[3:])

    def sweep(
        self, subject: Subject, *, now: float | None = None, configured: bool = True
    ) -> tuple[float, tuple[tuple[str, str], ...]]:
        """Remove lapsed holders and hand their slots to waiters: (the next moment a sweep
        could matter, Unix seconds, 0 when nobody waits; waiters handed a slot).
        ``configured=False``: use the limit stored by the last waiter (this limiter's may
        be a stand-in)."""
        call = self._cap_call("sweep", subject, now=now, limit=configured)
        reply = self._eval(self._cap_ops, call)
        return int(reply[0]) / 1000, handed(reply[3:])

    def holders(self, subject: Subject, *, now: float | None = None) -> CapUsage:
        """The subject's concurrency slots: who holds them, since when, and how many wait."""
        return usage(self._eval(self._cap_ops, self._cap_call("usage", subject, now=now)))
