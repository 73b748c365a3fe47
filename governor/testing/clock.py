"""A clock a test steps by hand: what governed calls under test are decided at.

The limiter takes ``now=`` (Unix seconds) in place of Redis ``TIME``; :class:`Clock` is that
``now``, moved only by the test. A fresh clock stands at the start of a UTC day, so windows
of a second, a minute, an hour and a day all begin with the test (a test that crosses a window
boundary half-way fails at random; one on this clock never does). It counts whole
microseconds, as the limiter does, so ten steps of 0.1 s make exactly one second.

>>> clock = Clock()
>>> clock.advance(0.25)
1800057600.25
"""

from __future__ import annotations

import math

__all__ = ["START", "Clock"]

START = 1_800_057_600.0
"""2027-01-16 00:00:00 UTC: a whole number of days since the epoch."""


class Clock:
    """A clock that moves only when told (:meth:`advance`, :meth:`set`); call it for the time."""

    def __init__(self, start: float = START) -> None:
        self._us = _microseconds(start, "Clock(start)")
        if self._us <= 0:
            raise ValueError(f"a clock's time is Unix seconds after 1970, got {start!r}")

    def __call__(self) -> float:
        return self._us / _US

    @property
    def now(self) -> float:
        """Unix seconds."""
        return self._us / _US

    def advance(self, seconds: float) -> float:
        """Move forward ``seconds`` (at least 0, to the microsecond); returns the new time."""
        step = _microseconds(seconds, "advance()")
        if step < 0:
            raise ValueError(f"a clock moves forward only: advance({seconds!r})")
        self._us += step
        return self.now

    def set(self, when: float) -> float:
        """Move to ``when`` (Unix seconds, not before now); returns it."""
        us = _microseconds(when, "set()")
        if us < self._us:
            raise ValueError(f"a clock moves forward only: set({when!r}) is before {self.now!r}")
        self._us = us
        return self.now

    def __repr__(self) -> str:
        return f"Clock({self.now!r})"


_US = 1_000_000


def _microseconds(seconds: float, where: str) -> int:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
    ):
        raise ValueError(f"{where}: seconds must be a finite number, got {seconds!r}")
    return round(seconds * _US)
