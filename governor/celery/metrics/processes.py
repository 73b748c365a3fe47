"""Where the metrics of a worker's processes meet: prometheus_client's multiprocess directory,
which pools need it, and the fork lock that keeps a pool process from inheriting a held lock.

Used by :mod:`governor.celery.metrics`; nothing here is public.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any

from celery.concurrency import ALIASES

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_SINGLE_PROCESS_POOLS = {
    ALIASES[k] for k in ("solo", "threads", "eventlet", "gevent") if k in ALIASES
}

fork_lock = threading.Lock()
"""Held by every metric update and by a fork: a pool process can then never inherit one of
prometheus_client's locks held by another thread of the main process (the scrape thread, the
releaser), which would hang its first update."""
_fork_hooks_registered = False


def wants_multiprocess(worker: Any, multiprocess: bool | None) -> bool:
    """Whether the worker's metrics must be counted in files (any pool that forks)."""
    if os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()):
        return True  # prometheus_client may already count in files: the port must read them
    if multiprocess is not None:
        return multiprocess
    if worker is None:
        return True
    return not single_process_pool(getattr(worker, "pool_cls", None))


def single_process_pool(pool_cls: Any) -> bool:
    """Whether a worker's pool (a name like "threads", or a class) runs tasks in the worker's
    own process. Unknown pools count as multiprocess (always correct, only less convenient)."""
    if isinstance(pool_cls, str):
        path = ALIASES.get(pool_cls, pool_cls)
    elif isinstance(pool_cls, type):
        path = f"{pool_cls.__module__}:{pool_cls.__qualname__}"
    else:
        return False
    return path in _SINGLE_PROCESS_POOLS


def prepare_directory() -> tuple[str, bool]:
    """The multiprocess directory, and whether governor made it (and removes it at exit)."""
    path = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    if path:
        os.environ[MULTIPROC_ENV] = path  # the old lower-case name: prometheus_client warns
        os.makedirs(path, exist_ok=True)
        return path, False
    path = tempfile.mkdtemp(prefix=f"governor-metrics-{os.getpid()}-")
    os.environ[MULTIPROC_ENV] = path  # inherited by the pool processes
    return path, True


def remove_directory(path: str | None, pid: int) -> None:
    if path and os.getpid() == pid:  # never from a forked pool process
        shutil.rmtree(path, ignore_errors=True)


def register_fork_hooks() -> None:
    global _fork_hooks_registered
    if _fork_hooks_registered or not hasattr(os, "register_at_fork"):
        return
    os.register_at_fork(
        before=fork_lock.acquire,
        after_in_parent=fork_lock.release,
        after_in_child=fork_lock.release,
    )
    _fork_hooks_registered = True
