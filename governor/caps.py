"""What the sync and asyncio limiters share about concurrency caps: validation, arguments and
replies of ``cap_decide.lua`` and ``cap_ops.lua``.

A limiter with ``concurrency=N`` admits at most N holders of a subject at once, on top of its
rules (or alone, with no rules). Its decisions take a slot when they admit; the holder gives
it back with ``release`` and keeps it past its lease with ``renew``. See
:class:`governor.Concurrency` for the blocking primitive built on it.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .decision import CapUsage, Holder
from .errors import ConfigError, SubjectError
from .text import as_text

__all__ = [
    "CAP_SUFFIXES",
    "MAX_CONCURRENCY",
    "MAX_TEXT",
    "Cap",
    "Left",
    "Waited",
    "handed",
    "holder_text",
    "info_text",
    "lapsed",
    "left",
    "new_token",
    "token_text",
    "usage",
]

CAP_SUFFIXES = ("ch", "cx", "cw", "cd", "ck", "cl")
"""Key kinds of a cap: holders, their entries and messages, waiters, holders that ran while a
copy asked, holders with a message kept (pending hand-overs, copies behind running holders),
lapsed hand-overs (see lua/cap.lua)."""
MAX_CONCURRENCY = 1_000_000
MAX_TEXT = 256
"""Longest holder id or holder info, in characters."""
MIN_LEASE = 0.05


@dataclass(frozen=True, slots=True)
class Cap:
    """A cap: at most ``limit`` holders at once, each for ``lease`` seconds unless renewed."""

    limit: int
    lease: float

    @classmethod
    def make(cls, limit: object, lease: object) -> Cap:
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not (1 <= limit <= MAX_CONCURRENCY)
        ):
            raise ConfigError(
                f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}, got {limit!r}"
            )
        if (
            isinstance(lease, bool)
            or not isinstance(lease, (int, float))
            or not math.isfinite(lease)
            or not MIN_LEASE <= lease <= 86_400
        ):
            raise ConfigError(
                f"a concurrency lease must be {MIN_LEASE} to 86400 seconds, got {lease!r}"
            )
        return cls(limit, float(lease))

    def args(self, holder: str, token: str, info: str, message: str) -> list[str | int]:
        """The six ARGV a cap script takes after the decision's own."""
        return [self.limit, round(self.lease * 1_000_000), holder, token, info, message]


def _spaced(text: str) -> bool:
    """Whether ``text`` has a whitespace character (``str.isspace``'s), at C speed:
    checked for every slot a task takes and gives back."""
    words = text.split(maxsplit=1)
    return words != [text] and text != ""


def holder_text(holder: object, what: str = "holder") -> str:
    """Validate a holder id (or info): text without spaces, at most MAX_TEXT characters."""
    if not isinstance(holder, str) or not holder or len(holder) > MAX_TEXT:
        raise SubjectError(
            f"a {what} must be a non-empty string of at most {MAX_TEXT} characters, got "
            f"{holder!r:.80}"
        )
    if what == "holder" and _spaced(holder):
        raise SubjectError(f"a holder must not contain spaces, got {holder!r}")
    return holder


def token_text(token: object) -> str:
    """Validate a holder's token: text without spaces, at most MAX_TEXT characters, not "-"
    (the token of a slot handed over and not yet taken)."""
    if (
        not isinstance(token, str)
        or not token
        or len(token) > MAX_TEXT
        or token == "-"
        or _spaced(token)
    ):
        raise SubjectError(
            f"a holder's token must be a string of 1 to {MAX_TEXT} characters without spaces "
            f"(not '-'), got {token!r:.80}"
        )
    return token


def info_text(info: object) -> str:
    """What a holder says about itself: any text, cut to MAX_TEXT characters."""
    if not isinstance(info, str):
        raise ConfigError(f"holder info must be a string, got {info!r:.80}")
    return info[:MAX_TEXT]


def new_token() -> str:
    return secrets.token_hex(8)


def handed(items: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    """(holder, message) pairs from a script's flat list."""
    return tuple((as_text(items[i]), as_text(items[i + 1])) for i in range(0, len(items) - 1, 2))


@dataclass(frozen=True, slots=True)
class Waited:
    """What ``wait`` did: ``status`` is ``"queued"`` (``position`` in the queue, 0 first; a
    copy of a running holder waits behind it, at 0), ``"room"`` or ``"mine"`` (a slot is free
    for it now: decide again) or ``"done"`` (a copy of it ran: drop it). A copy is never told
    to come back later (``"copy"``) any more, so ``estimate`` is 0.0."""

    status: str
    position: int
    estimate: float
    now: float
    handed: tuple[tuple[str, str], ...]


def waited(reply: Sequence[Any]) -> Waited:
    status = as_text(reply[0])
    value = int(reply[1])
    return Waited(
        status=status,
        position=value if status == "queued" else -1,
        estimate=0.0,
        now=int(reply[2]) / 1000,
        handed=handed(reply[3:]),
    )


@dataclass(frozen=True, slots=True)
class Left:
    """What ``leave`` did: ``place`` is where the holder was (``"waiting"`` in line,
    ``"handed"`` a slot it never took, ``"lapsed"`` a hand-over that lapsed, ``"copy"`` a copy
    waiting behind its running holder; ``""`` nowhere), ``message`` the message it left there
    (``""`` for none: a waiting process), ``handed`` the waiters a freed slot went to."""

    place: str
    message: str
    now: float
    handed: tuple[tuple[str, str], ...]

    @property
    def gone(self) -> bool:
        return bool(self.place)


def left(reply: Sequence[Any]) -> Left:
    return Left(as_text(reply[0]), as_text(reply[1]), int(reply[2]) / 1000, handed(reply[3:]))


def lapsed(reply: Sequence[Any]) -> tuple[tuple[str, float], ...]:
    """(holder, when its hand-over lapsed, Unix seconds) pairs, the oldest first."""
    return tuple(
        (as_text(reply[i]), float(reply[i + 1]) / 1000) for i in range(1, len(reply) - 1, 2)
    )


def usage(reply: Sequence[Any]) -> CapUsage:
    now_ms, limit, waiting = int(reply[0]), int(reply[1]), int(reply[2])
    holders = []
    for i in range(3, len(reply) - 2, 3):
        parts = as_text(reply[i + 2]).split(" ", 4)
        if len(parts) < 5:
            continue
        _token, since, n, flags, info = parts
        holders.append(
            Holder(
                holder=as_text(reply[i]),
                since=int(since) / 1000,
                expires=float(reply[i + 1]) / 1000,
                fence=0 if flags == "p" else int(n),  # a pending entry keeps its place in line
                info=info,
                pending=flags == "p",
            )
        )
    return CapUsage(limit=limit, holders=tuple(holders), waiting=waiting, now=now_ms / 1000)
