"""One way to read a Redis reply (or a key name) as text."""

from __future__ import annotations

__all__ = ["as_text"]


def as_text(value: object) -> str:
    """``value`` as text: bytes decoded as UTF-8 (what cannot be decoded replaced, never an
    error: replies may hold what clients wrote), anything else through ``str``."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
