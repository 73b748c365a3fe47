"""Forks of a worker's main process while governor's threads work in it.

The prefork pool forks its pool processes from the worker's main process, where the releaser
and the fair dispatcher run as threads: they start before the pool, and run on when it replaces
a pool process. A fork taken while one of them holds a lock (the module lock of an import in
progress, a client's) copies that lock into the child, held by a thread the child does not
have: the child's first use of it hangs for ever. (Seen with kombu's SQS transport, where the
pool starts later: a pool process stuck importing ``importlib.readers`` to read a Lua script,
imported at that moment by the releaser's first round; the task it had been given never ran.)

So each such thread does its rounds holding a lock of its own, which it hands to :func:`guard`
when it starts, and every fork of the process takes all of them first: pool processes are
forked between rounds, never during one.

The hooks are registered at the first :func:`guard`, when the worker starts (after
``worker_init``, where :mod:`.metrics` registers its own): a fork takes these locks before the
metrics' lock, which a round may take to count what it did.
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["forget", "guard"]

_guarded: list[threading.Lock] = []
_held: list[threading.Lock] = []
_registered = False


def guard(lock: threading.Lock) -> None:
    """Every fork of this process waits until ``lock`` is free, and holds it while it forks."""
    global _registered
    _guarded.append(lock)
    if not _registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before, after_in_parent=_after, after_in_child=_after)
        _registered = True


def forget(lock: threading.Lock) -> None:
    """Forks no longer wait for ``lock`` (its thread stopped)."""
    with contextlib.suppress(ValueError):
        _guarded.remove(lock)


def _before() -> None:
    _held[:] = list(_guarded)
    for lock in _held:
        lock.acquire()


def _after() -> None:
    for lock in reversed(_held):
        lock.release()
    _held.clear()
