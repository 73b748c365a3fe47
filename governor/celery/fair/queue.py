"""One fair limit's queue in Redis: calls waiting by virtual start tag, put, taken and claimed by
one script each (``fair_put.lua``, ``fair_take.lua``, ``fair_claim.lua``, beside this module;
``fair_drop.lua`` forgets a call that went to the dead letters).

Keys, all in the limit's own hash slot (``<prefix>:{<name>:<subject>}:``): ``fq`` the queue
(ZSET by tag), ``fm`` the messages, ``ft`` tenants' last tags (only tenants ahead of V), ``fv``
V, ``fn`` calls waiting per tenant, ``fl`` calls in transit (sent on, not yet arrived), ``fc``
copies sent of each, ``fs``/``fx`` claims. ``<prefix>:{fair}:due`` lists the fair limits with
calls waiting. The cost of a put, a take or a claim grows with the logarithm of the calls and
tenants waiting; idle tenants leave nothing behind.

Copies. A call sent on is in transit until a copy of it arrives and claims it. One still in
transit after :data:`TRANSIT_MS` is sent again (its sender may have died, or the message been
lost), and each further copy waits twice as long (up to :data:`TRANSIT_MAX_MS`), so a broker
backlog of B seconds makes about log2(B / 10 s) + 1 copies of a waiting call (4 for 100 s, 7
for 20 minutes, 11 for an hour), not one per 10 s. The first copy to arrive claims the call
and runs; any other copy is dropped: one that arrives while the claim is remembered (an hour;
a day for a call sent more than once) by its token, one that arrives later by its age (see
``fair_claim.lua``). So no copy runs twice, however late it comes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...limiter import Limiter
from ...scripts import LuaScript, package_script, run_script
from ...text import as_text

__all__ = [
    "CLAIMS_LONG_MS",
    "CLAIMS_MS",
    "KEEP_MS",
    "TRANSIT_MAX_MS",
    "TRANSIT_MS",
    "FairQueue",
    "Sent",
    "Taken",
    "copy_marks",
    "fair_due_key",
]

KEEP_MS = 86_400_000
"""How long a fair queue's keys live after the last call was put in or taken out."""
TRANSIT_MS = 10_000
"""A call sent on is in transit until it arrives (claims its entry); one still in transit after
this long is sent again, and each further copy waits twice as long as the one before."""
TRANSIT_MAX_MS = 600_000
"""The longest a copy waits in transit before the next is sent (ten minutes)."""
CLAIMS_MS = 3_600_000
"""How long an arrival's claim is remembered (a redelivered copy within this long still runs)."""
CLAIMS_LONG_MS = 86_400_000
"""How long the claim of a call sent more than once is remembered: a copy older than this is
dropped without one (see ``fair_claim.lua``)."""


def fair_due_key(prefix: str) -> str:
    return f"{prefix}:{{fair}}:due"


def _script(name: str) -> LuaScript:
    return package_script("governor.celery.fair", name)


class Sent(NamedTuple):
    """A call taken from a fair queue to send on."""

    member: str
    text: str
    """``tenant\\ntag\\nenvelope``."""
    tag: str
    """Its tag ('' for a copy sent again)."""
    copy: int
    """Which copy of the call this is (1: the first)."""


class Taken(NamedTuple):
    """What a take found: calls still waiting, calls in transit, Redis's clock, the calls."""

    waiting: int
    flying: int
    now: float
    calls: list[Sent]


@dataclass(frozen=True, slots=True)
class FairQueue:
    """One fair limit's queue in Redis (a limiter and a subject)."""

    limiter: Limiter
    subject: str

    @classmethod
    def described(cls, client: Any, prefix: str, text: str | bytes) -> FairQueue:
        """The queue an index entry (:meth:`describe`) names: only its keys matter here."""
        desc = json.loads(text)
        lim = Limiter(client, None, concurrency=1, name=str(desc["name"]), prefix=prefix)
        return cls(lim, str(desc["subject"]))

    @property
    def label(self) -> str:
        """How dead letters and logs name it: ``<limiter name>:<subject>``."""
        return f"{self.limiter.name}:{self.subject}"

    def key_names(self, *kinds: str) -> list[str]:
        head = self.limiter.keys(self.subject)[1][: -len("block")]
        return [head + kind for kind in kinds]

    def put(
        self, client: Any, member_id: str, tenant: str, step: float, tag: float | None, text: str
    ) -> tuple[float, int]:
        keys = self.key_names("fq", "fm", "ft", "fv", "fn")
        args = [member_id, tenant, repr(step), "" if tag is None else repr(tag), text, KEEP_MS]
        new_tag, waiting = run_script(client, _script("fair_put"), keys, args)
        return float(new_tag), int(waiting)

    def take(
        self, client: Any, room: int, most: int, booked: bool = False, now: float | None = None
    ) -> Taken:
        """Take what the limit has room for: first calls whose copy ran out of transit, then
        the lowest tags. ``booked``: the caller booked a moment for each, so calls in transit
        take no room from ``room``. ``now``: Unix seconds for tests (None: Redis's clock)."""
        keys = self.key_names("fq", "fm", "ft", "fv", "fn", "fl", "fc")
        args = [room, TRANSIT_MS, most, int(booked), _ms(now), TRANSIT_MAX_MS, KEEP_MS]
        reply = run_script(client, _script("fair_take"), keys, args)
        calls = [
            Sent(as_text(reply[i]), as_text(reply[i + 1]), as_text(reply[i + 2]), int(reply[i + 3]))
            for i in range(3, len(reply), 4)
        ]
        return Taken(int(reply[0]), int(reply[1]), int(reply[2]) / 1000, calls)

    def claim(
        self,
        client: Any,
        member: str,
        token: str,
        now: float | None = None,
        sent: float | None = None,
        copy: int = 1,
    ) -> bool:
        """A copy arrived: True if it may run (the first copy to claim the call, or the same
        copy again). ``sent``: when this copy was sent (Unix seconds; None for messages that
        do not say); ``copy``: which copy it is."""
        keys = self.key_names("fq", "fm", "ft", "fv", "fn", "fl", "fs", "fx", "fc")
        args = [member, token, CLAIMS_MS, _ms(now), _ms(sent), int(copy), CLAIMS_LONG_MS]
        return bool(run_script(client, _script("fair_claim"), keys, args))

    def drop(self, client: Any, member: str) -> bool:
        """Forget a taken call that cannot be sent on (it went to the dead letters)."""
        keys = self.key_names("fm", "fl", "fc")
        return bool(run_script(client, _script("fair_drop"), keys, [member]))

    def waiting(self, client: Any) -> dict[str, int]:
        """Calls waiting per tenant."""
        raw = client.hgetall(self.key_names("fn")[0])
        return {as_text(k): int(v) for k, v in raw.items() if int(v) > 0}

    def describe(self) -> str:
        """The index entry: what a dispatcher needs to build the limiter."""
        lim = self.limiter
        return json.dumps(
            {
                "name": lim.name,
                "subject": self.subject,
                "rules": ", ".join(r.text for r in lim.rules),
                "algorithm": lim.algorithm.name,
            },
            sort_keys=True,
        )


def copy_marks(carried: Any) -> tuple[float | None, int]:
    """When a copy was sent (Unix seconds) and which copy it is, from its ``governor`` header
    (untrusted: a missing or odd value counts as unknown, and as the first copy)."""
    if not isinstance(carried, Mapping):
        return None, 1
    sent, copy = carried.get("sent"), carried.get("copy")
    when = None
    if isinstance(sent, (int, float)) and not isinstance(sent, bool) and math.isfinite(sent):
        when = float(sent)
    which = 1
    if isinstance(copy, int) and not isinstance(copy, bool) and 1 <= copy <= 1_000_000:
        which = copy
    return when, which


def _ms(now: float | None) -> int | str:
    """A script's clock argument: Unix ms, or '' for Redis's own."""
    return "" if now is None else round(now * 1000)
