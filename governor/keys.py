"""Redis key names.

Every key of one (limiter, subject) pair shares one Redis Cluster hash tag, so a decision touches
one slot::

    <prefix>:{<name>:<subject>}:<kind>        e.g.  governor:{partner-api:customer-42}:sl

``name`` and ``subject`` are escaped (``%`` ``{`` ``}`` ``:`` become ``%25`` ``%7B`` ``%7D``
``%3A``), so the tag always ends at our own ``}`` and no two different pairs share a key.
"""

from __future__ import annotations

from functools import lru_cache

from .errors import ConfigError, SubjectError

__all__ = ["Subject", "escape", "parse_key", "subject_text", "unescape"]

Subject = str | int

_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D", ":": "%3A"})
_SPECIAL = frozenset("%{}:")


def escape(text: str) -> str:
    """Escape ``text`` for use inside a hash tag (injective, reversible with :func:`unescape`)."""
    return text.translate(_ESCAPES) if _SPECIAL.intersection(text) else text


def unescape(text: str) -> str:
    """Undo :func:`escape`."""
    if "%" not in text:
        return text
    return text.replace("%3A", ":").replace("%7D", "}").replace("%7B", "{").replace("%25", "%")


def subject_text(subject: Subject) -> str:
    """Validate a subject and return its text form (ints are written in decimal)."""
    if isinstance(subject, str):
        text = subject
    elif isinstance(subject, int) and not isinstance(subject, bool):
        text = str(subject)
    else:
        raise SubjectError(
            f"a subject must be a non-empty string or an integer, got {type(subject).__name__} "
            f"{subject!r}"
        )
    if not text:
        raise SubjectError("a subject must not be empty (use a fixed string such as 'all')")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SubjectError(f"subject {subject!r} is not valid unicode text") from None
    return text


def check_name(kind: str, value: object) -> str:
    """Validate a limiter name or key prefix."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{kind} must be a non-empty string, got {value!r}")
    if kind == "prefix" and _SPECIAL.intersection(value) - {":"}:
        raise ConfigError(f"prefix {value!r} must not contain '{{', '}}' or '%'")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{kind} {value!r} is not valid unicode text") from None
    return value


@lru_cache(maxsize=65536)
def tag(name: str, subject: str) -> str:
    """The hash tag shared by every key of (name, subject)."""
    return f"{{{escape(name)}:{escape(subject)}}}"


def parse_key(key: str, prefix: str) -> tuple[str, str, str] | None:
    """Split ``<prefix>:{<name>:<subject>}:<kind>`` into (name, subject, kind), or None."""
    head = f"{prefix}:{{"
    if not key.startswith(head):
        return None
    end = key.find("}", len(head))
    if end < 0 or key[end + 1 : end + 2] != ":":
        return None
    name, sep, subject = key[len(head) : end].partition(":")
    if not sep:
        return None
    return unescape(name), unescape(subject), key[end + 2 :]
