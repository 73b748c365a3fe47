"""Waiting for a concurrency slot: in line, in Redis, with no worker, broker ETA or memory held.

A call whose limit's cap is full (``decision.capped == "full"``) is queued in the cap's line with
its message (:meth:`Limiter.wait`): the script that queues it checks the cap again, so a slot
freed in between is never missed. Whatever frees a slot later (a holder's release at the end
of its body, a refund, a sweep of lapsed leases) hands it to the oldest waiter and returns that
waiter's message; the process that freed it publishes it at once (:class:`Handover`), and the
task, on arrival, finds the slot already its own. No polling, no herd: one message per freed
slot, published once and never again (at most one copy of a message is out at a time:
governor/lua/cap.lua). A hand-over whose task does not start within the cap's lease (a process
that died before publishing, a message late, lost, revoked or expired) lapses, and a sweep (the
releaser thread, :mod:`.releaser`, or any call on the cap) hands the slot on; the lapsed waiter
keeps its place, and its message, if it ever arrives, takes a free slot or waits again.

Sweepers find the caps with waiters in ``<prefix>:{caps}:due`` (a sorted set of caps by the
moment a sweep could matter: the earliest lease of their holders), which every queued call
updates.
"""

from __future__ import annotations

import logging

import redis

from ...errors import GovernorError
from ...keys import escape, unescape
from ...limiter import Limiter
from ...scripts import package_script, run_script
from ...text import as_text
from .. import signals
from ..config.settings import Settings
from ..config.store import Store
from ..types import Call, Deferred, Duplicate, LimitSpec, Outcome, handed_by
from .handover import Handover
from .republish import Republisher

__all__ = ["CAPS_DUE", "CapLine", "CapSweeper", "caps_due_key", "holder_of", "parse_member"]

logger = logging.getLogger("governor.celery")
CAPS_DUE = "{caps}:due"


def caps_due_key(prefix: str) -> str:
    return f"{prefix}:{CAPS_DUE}"


def member(lim: Limiter, subject: str) -> str:
    """How a cap is named in the sweep index."""
    return f"{escape(lim.name)}:{escape(subject)}"


def parse_member(text: str) -> tuple[str, str] | None:
    name, sep, subject = text.partition(":")
    return (unescape(name), unescape(subject)) if sep else None


class CapLine:
    """Puts calls denied by a full cap in the cap's line (one per gate)."""

    def __init__(self, settings: Settings, store: Store, republisher: Republisher) -> None:
        self.settings = settings
        self.store = store
        self.republisher = republisher

    def wait(self, call: Call, outcome: Outcome, label: str) -> Deferred | None:
        """The call was denied by a cap (``outcome.decision.capped``): queue it (a copy of a
        running task waits behind it, in Redis), or drop a copy of one that ran. None: a slot
        is free for it now (decide again)."""
        decision, spec = outcome.decision, outcome.spec
        assert decision is not None and spec is not None
        if decision.capped == "done":
            logger.info("governor: %s dropped: a copy of it already ran", call.name)
            return Duplicate(f"governor: {call.name} already ran (a copy of it held the slot)")
        lim = self.store.limiter(spec.name, spec.config)
        message, state = self.republisher.message(call, label)
        waited = lim.wait(spec.subject, holder_of(call), message)
        if waited.handed:
            self.republisher.handover.publish(handed_by(lim, spec.subject, waited.handed))
        if waited.status in ("room", "mine"):
            return None
        if waited.status != "queued":  # copy or done, seen only now
            capped = Outcome(
                False,
                delay=waited.estimate,
                now=waited.now,
                spec=spec,
                decision=decision,
            )
            if waited.status == "done":
                return Duplicate(f"governor: {call.name} already ran (a copy of it held the slot)")
            return self.republisher.republish(call, capped, label)
        call.state = state
        self._index(lim, spec.subject, waited.now + max(decision.retry_after, 0.0))
        signals.task_deferred.send(
            sender=call.task,
            request=call.request,
            limit=label,
            rule=None,
            delay=None,
            booked=False,
            blocked=None,
            capped="full",
        )
        self.republisher.note(call, label, "concurrency", 0.0)
        return Deferred(
            f"governor: waits for a slot of {label} ({waited.position} ahead, "
            f"wait {call.state.waits})"
        )

    def leave(self, spec: LimitSpec, holder: str) -> None:
        """``holder`` will not start (Celery dropped its message: revoked, expired): out of the
        cap's line, a slot handed to it passes on, a copy of it waiting behind a running holder
        is dropped (:meth:`~governor.Limiter.leave`). Never raises: what fails lapses after one
        lease instead."""
        lim = self.store.limiter(spec.name, spec.config)
        try:
            left = lim.leave(spec.subject, holder)
        except (GovernorError, redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            logger.warning(
                "governor: %s left %s's line only by lapsing: %r", holder, spec.label, exc
            )
            return
        if left.place:
            logger.info("governor: %s left the line of %s (%s)", holder, spec.label, left.place)
        self.republisher.handover.publish(handed_by(lim, spec.subject, left.handed))

    def _index(self, lim: Limiter, subject: str, due: float) -> None:
        """Have the sweepers look at this cap when its earliest lease could lapse."""
        try:
            self.store.client.zadd(
                caps_due_key(self.settings.prefix),
                {member(lim, subject): round(due * 1000)},
                lt=True,
            )
        except (
            redis.RedisError,
            redis.exceptions.RedisClusterException,
        ) as exc:  # the next queued call or a release tries again
            logger.warning("governor: could not note %s:%s for sweeps: %r", lim.name, subject, exc)


def holder_of(call: Call) -> str:
    """A call's holder id: its task id and retry count (a retry is a new holder, a redelivered
    copy the same one)."""
    return f"{call.request.id}:{call.request.retries or 0}"


class CapSweeper:
    """Finds caps whose holders may have died with tasks waiting, and hands their slots over
    (run by the releaser thread of every worker; each cap is claimed by one at a time)."""

    def __init__(
        self, store: Store, handover: Handover, prefix: str, batch: int = 100, claim: float = 5.0
    ) -> None:
        self.store = store
        self.handover = handover
        self.prefix = prefix
        self.batch = batch
        self.claim = claim
        self._limiters: dict[str, Limiter] = {}

    def sweep_once(self) -> int:
        """Sweep the caps that are due; returns how many waiting tasks were handed a slot."""
        client = self.store.client
        key = caps_due_key(self.prefix)
        reply = run_script(
            client,
            package_script("governor.celery.waiting", "caps_due"),
            [key],
            [self.batch, round(self.claim * 1000)],
        )
        now_ms, handed = int(reply[0]), 0
        for raw in reply[1:]:
            name = as_text(raw)
            parsed = parse_member(name)
            if parsed is None:
                client.zrem(key, name)
                continue
            lim = self._limiter(parsed[0])
            nxt, pairs = lim.sweep(parsed[1], configured=False)
            handed += self.handover.publish(handed_by(lim, parsed[1], pairs))
            if nxt:
                client.zadd(key, {name: round(nxt * 1000)}, xx=True)
                continue
            # nobody waits: forget it; one queued meanwhile is noted again (it wrote first, or
            # its note comes after this)
            client.zrem(key, name)
            if lim.holders(parsed[1]).waiting:
                client.zadd(key, {name: now_ms})
        return handed

    def _limiter(self, name: str) -> Limiter:
        """A stand-in limiter for the cap's keys: the sweep reads the cap's limit from Redis."""
        lim = self._limiters.get(name)
        if lim is None or lim.client is not self.store.client:
            if len(self._limiters) > 10_000:
                self._limiters.clear()
            lim = Limiter(self.store.client, None, concurrency=1, name=name, prefix=self.prefix)
            self._limiters[name] = lim
        return lim
