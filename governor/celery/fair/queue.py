"""One fair limit's queue in Redis: calls waiting by virtual start tag, put, taken and claimed by
one script each (``fair_put.lua``, ``fair_take.lua``, ``fair_claim.lua``, beside this module).

Keys, all in the limit's own hash slot (``<prefix>:{<name>:<subject>}:``): ``fq`` the queue
(ZSET by tag), ``fm`` the messages, ``ft`` tenants' last tags (only tenants ahead of V), ``fv``
V, ``fn`` calls waiting per tenant, ``fl`` calls in transit (sent on, not yet arrived),
``fs``/``fx`` claims. ``<prefix>:{fair}:due`` lists the fair limits with calls waiting. The cost
of a put, a take or a claim grows with the logarithm of the calls and tenants waiting; idle
tenants leave nothing behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...limiter import Limiter
from ...scripts import LuaScript, package_script, run_script

__all__ = ["CLAIMS_MS", "KEEP_MS", "TRANSIT_MS", "FairQueue", "fair_due_key"]

KEEP_MS = 86_400_000
"""How long a fair queue's keys live after the last call was put in (refreshed by each)."""
TRANSIT_MS = 10_000
"""A call sent on is in transit until it arrives (claims its entry); one still in transit after
this long is sent again (the copy that arrives second is dropped)."""
CLAIMS_MS = 3_600_000
"""How long an arrival's claim is remembered (a redelivered copy within this long still runs)."""


def fair_due_key(prefix: str) -> str:
    return f"{prefix}:{{fair}}:due"


def _script(name: str) -> LuaScript:
    return package_script("governor.celery.fair", name)


@dataclass(frozen=True, slots=True)
class FairQueue:
    """One fair limit's queue in Redis (a limiter and a subject)."""

    limiter: Limiter
    subject: str

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
    ) -> tuple[int, int, list[tuple[str, str, str]]]:
        """(calls still waiting, calls sent on and not arrived, [(member, "tenant\\ntag\\nenvelope",
        tag or "")]). ``booked``: the caller booked a moment for each, so calls sent on and not
        arrived yet take no room from ``room``. ``now``: Unix seconds for tests (None: Redis's
        clock)."""
        keys = self.key_names("fq", "fm", "ft", "fv", "fn", "fl")
        args = [room, TRANSIT_MS, most, int(booked), _ms(now)]
        reply = run_script(client, _script("fair_take"), keys, args)
        out = []
        for i in range(2, len(reply), 3):
            out.append((_text(reply[i]), _text(reply[i + 1]), _text(reply[i + 2])))
        return int(reply[0]), int(reply[1]), out

    def claim(self, client: Any, member: str, token: str, now: float | None = None) -> bool:
        keys = self.key_names("fq", "fm", "ft", "fv", "fn", "fl", "fs", "fx")
        args = [member, token, CLAIMS_MS, _ms(now)]
        return bool(run_script(client, _script("fair_claim"), keys, args))

    def waiting(self, client: Any) -> dict[str, int]:
        """Calls waiting per tenant."""
        raw = client.hgetall(self.key_names("fn")[0])
        return {_text(k): int(v) for k, v in raw.items() if int(v) > 0}

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


def _ms(now: float | None) -> int | str:
    """A script's clock argument: Unix ms, or '' for Redis's own."""
    return "" if now is None else round(now * 1000)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
