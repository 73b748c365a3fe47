"""The dead-letter place: waiting tasks that cannot be read or published, kept for an operator.

A task waits in Redis as its serialized message (an envelope, :mod:`.envelope`): parked, in a
fair queue or in a cap's line. When its mover (the releaser, the fair dispatcher, the process
that hands it a slot) cannot read it (a serializer or ``accept_content`` changed, the text is
damaged) or the broker refuses it for good (a serializer nobody installed), the mover puts it
here and then removes it from where it waited. It is never retried in a loop (one unreadable
entry would take its mover's time, or room, again and again) and never dropped silently:

- kept in Redis, one record per entry (:func:`put`; putting the same entry again counts it);
- counted: the ``governor.message_dead_lettered`` signal (metrics:
  ``governor_dead_lettered_total``, ``governor_dead_letters``) and ``governor status``;
- inspectable (:func:`entries`, :func:`get`; ``governor dead-letters list|show``);
- re-drivable (:func:`redrive`: parked again, due now; the releaser publishes it and the first
  copy to arrive claims it, so a re-drive done twice still runs once) or droppable
  (:func:`drop`); ``governor dead-letters redrive|drop``.

Keys (one hash tag)::

    <prefix>:{dead}:msgs   HASH  dead id -> record (JSON: source, entry, reason, text, where)
    <prefix>:{dead}:index  ZSET  dead id -> when it was first put here (Unix ms)
    <prefix>:{dead}:times  HASH  dead id -> how many times it was put here

A dead id is a digest of the source and the entry's id there, so the same entry is one letter.
Sources: ``parked`` (the entry is a parking id), ``fair:<limit label>`` (a fair queue's member),
``cap:<limit>:<subject>`` (a holder in a cap's line; :func:`put` is what the cap line calls).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from ...errors import StorageUnavailable
from ...scripts import package_script, run_script
from ...text import as_text
from .. import signals
from . import parking

__all__ = ["DeadLetter", "count", "dead_id", "drop", "entries", "get", "keys", "put", "redrive"]

logger = logging.getLogger("governor.celery")
MAX_REASON = 1000
"""A reason is cut to this many characters (it quotes an exception)."""
REDRIVEN = "r~"
"""Parking ids of re-driven letters that were not parked before: ``r~<dead id>``."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry in the dead-letter place."""

    id: str
    source: str
    """Where it waited: ``parked``, ``fair:<limit>``, ``cap:<limit>:<subject>``."""
    entry: str
    """Its id there: a parking id, a fair queue's member, a cap's holder."""
    reason: str
    text: str | bytes
    """The message as it waited (an envelope; bytes when it is not UTF-8)."""
    where: Mapping[str, Any] = field(default_factory=dict)
    """What else its source knew (a fair queue's limit, the tenant and tag)."""
    at: float = 0.0
    """When it was first put here (Unix seconds, Redis's clock)."""
    times: int = 1
    """How many times it was put here (a mover that died between the two steps puts it again)."""

    @property
    def kind(self) -> str:
        """``parked``, ``fair`` or ``cap``."""
        return self.source.partition(":")[0]

    @property
    def task(self) -> str | None:
        """The task's name, when the envelope says it (envelopes name their task in clear)."""
        try:
            name = json.loads(self.text).get("task")
        except (ValueError, TypeError, AttributeError):
            return None
        return str(name) if name else None


def keys(prefix: str) -> tuple[str, str, str]:
    head = f"{prefix}:{{dead}}:"
    return head + "msgs", head + "index", head + "times"


def dead_id(source: str, entry: str) -> str:
    """The id of an entry's letter: the same entry from the same source is one letter."""
    return hashlib.sha256(f"{source}\n{entry}".encode("utf-8", "surrogatepass")).hexdigest()[:20]


def put(
    client: Any,
    prefix: str,
    source: str,
    entry_id: str,
    text: str | bytes,
    reason: str,
    *,
    where: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> DeadLetter:
    """Keep an entry its mover cannot read or publish; the caller then removes it from where it
    waited (in that order: a mover that dies in between finds it again and puts it again, which
    counts it, nothing more). Raises :class:`StorageUnavailable` when Redis does not answer:
    the entry then stays where it was, for the next try."""
    reason = reason[:MAX_REASON]
    record: dict[str, Any] = {
        "source": source,
        "entry": entry_id,
        "reason": reason,
        "where": dict(where or {}),
    }
    record.update(_text_fields(text))
    letter_id = dead_id(source, entry_id)
    held, times, first = run_script(
        client,
        package_script("governor.celery.waiting", "dead_put"),
        list(keys(prefix)),
        [letter_id, json.dumps(record), "" if now is None else round(now * 1000)],
    )
    letter = _letter(letter_id, record, float(first) / 1000, int(times))
    logger.error(
        "governor: %s %s moved to the dead letters (%s): %s; see `governor dead-letters show %s`",
        source,
        entry_id,
        letter.task or "task unknown",
        reason,
        letter_id,
    )
    signals.message_dead_lettered.send(
        sender=None,
        kind=letter.kind,
        source=source,
        reason=reason,
        count=int(held),
        again=letter.times > 1,
    )
    return letter


def count(client: Any, prefix: str) -> int:
    """Letters held now."""
    return int(_read(lambda: client.zcard(keys(prefix)[1])))


def entries(client: Any, prefix: str, limit: int | None = None) -> list[DeadLetter]:
    """The letters, oldest first (at most ``limit``)."""
    msgs, index, times = keys(prefix)
    end = -1 if limit is None else max(0, limit - 1)
    if limit == 0:
        return []
    listed = _read(lambda: client.zrange(index, 0, end, withscores=True))
    ids = [as_text(raw) for raw, _ in listed]
    if not ids:
        return []
    records, counts = _read(lambda: (client.hmget(msgs, ids), client.hmget(times, ids)))
    out = []
    for (_, first), letter_id, raw, n in zip(listed, ids, records, counts, strict=True):
        if raw is None:  # dropped meanwhile
            continue
        out.append(_parse(letter_id, raw, float(first) / 1000, int(n or 1)))
    return out


def get(client: Any, prefix: str, letter_id: str) -> DeadLetter | None:
    msgs, index, times = keys(prefix)
    raw, first, n = _read(
        lambda: (
            client.hget(msgs, letter_id),
            client.zscore(index, letter_id),
            client.hget(times, letter_id),
        )
    )
    if raw is None:
        return None
    return _parse(letter_id, raw, float(first or 0) / 1000, int(n or 1))


def drop(client: Any, prefix: str, ids: Iterable[str]) -> int:
    """Forget these letters; returns how many there were."""
    ids = list(ids)
    if not ids:
        return 0
    msgs, index, times = keys(prefix)

    def remove() -> int:
        pipe = client.pipeline(transaction=True)
        pipe.zrem(index, *ids)
        pipe.hdel(msgs, *ids)
        pipe.hdel(times, *ids)
        return int(pipe.execute()[0])

    return int(_read(remove))


def redrive(client: Any, prefix: str, letter: DeadLetter) -> str:
    """Send a letter back to wait: parked again, due now, then forgotten here; returns its
    parking id. A releaser publishes it (it must be readable by then: fix the app first) and
    the gate decides it like any call: a fair call waits in its fair queue again, a capped one
    in its cap's line. The parking id is the letter's own (a parked entry keeps its id), and
    the first copy to arrive claims it, so a re-drive repeated (say, it failed half-way) still
    runs once."""
    parking_id = letter.entry if letter.kind == "parked" else REDRIVEN + letter.id
    parking.park(client, prefix, parking_id, 0.0, letter.text)
    drop(client, prefix, [letter.id])
    return parking_id


# -- plumbing -----------------------------------------------------------------------------


def _text_fields(text: str | bytes) -> dict[str, Any]:
    if isinstance(text, bytes):
        try:
            return {"text": text.decode("utf-8")}
        except UnicodeDecodeError:
            return {"text": base64.b64encode(text).decode("ascii"), "b64": True}
    return {"text": text}


def _parse(letter_id: str, raw: Any, first: float, times: int) -> DeadLetter:
    try:
        record = json.loads(raw)
        if not isinstance(record, dict):
            raise ValueError("not an object")
    except ValueError:  # not ours: show it as it is
        record = {"source": "?", "entry": "?", "reason": "unreadable record", "text": as_text(raw)}
    return _letter(letter_id, record, first, times)


def _letter(letter_id: str, record: Mapping[str, Any], first: float, times: int) -> DeadLetter:
    text: str | bytes = str(record.get("text", ""))
    if record.get("b64"):
        text = base64.b64decode(text)
    where = record.get("where")
    return DeadLetter(
        id=letter_id,
        source=str(record.get("source", "?")),
        entry=str(record.get("entry", "?")),
        reason=str(record.get("reason", "")),
        text=text,
        where=dict(where) if isinstance(where, Mapping) else {},
        at=first,
        times=times,
    )


def _read(fn: Any) -> Any:
    try:
        return fn()
    except (RedisError, RedisClusterException) as exc:
        raise StorageUnavailable(f"Redis did not answer for the dead letters: {exc}") from exc
