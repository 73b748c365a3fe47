"""The metrics server of a worker: :func:`install` serves the metrics of :mod:`.definitions`,
updated from governor's signals by the receivers of :mod:`.updates` (see the package's
docstring for how to use it)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client import values as prometheus_values
    from prometheus_client.metrics_core import Metric
    from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
except ImportError as exc:  # pragma: no cover
    raise ImportError(
        "governor metrics need prometheus-client (the prometheus extra): "
        "pip install prometheus-client"
    ) from exc

from celery import signals as celery_signals

from .definitions import DELAY_BUCKETS, HANDOVER_BUCKETS, LATENESS_BUCKETS, Metrics
from .processes import (
    MULTIPROC_ENV,
    fork_lock,
    prepare_directory,
    register_fork_hooks,
    remove_directory,
    wants_multiprocess,
)
from .server import Protection, serve
from .updates import UPDATES

__all__ = [
    "DELAY_BUCKETS",
    "HANDOVER_BUCKETS",
    "LATENESS_BUCKETS",
    "install",
    "installed",
    "registry",
    "set_parked",
    "uninstall",
    "watch_parked",
]

logger = logging.getLogger("governor.celery.metrics")


@dataclass
class _State:
    app_name: str
    multiprocess: bool
    served: Any
    """The registry (or collector) the port serves."""
    refresher: _ParkedRefresher
    directory: str | None = None
    owns_directory: bool = False
    previous_value_class: Any = None
    server: Any = None
    thread: threading.Thread | None = None
    port: int | None = None
    addr: str = "0.0.0.0"
    pid: int = field(default_factory=os.getpid)


_metrics: Metrics | None = None
_state: _State | None = None
_parked_source: Callable[[], float] | None = None
_dead_source: Callable[[], float] | None = None
_install_lock = threading.Lock()


class _ParkedRefresher:
    """Collects nothing; asks the ``parked`` and ``dead_letters`` callables for their gauges'
    values at each scrape. Registered ahead of the metrics, so the scrape sees fresh values."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        source = _parked_source
        if source is not None:
            try:
                value = float(source())
            except Exception:
                logger.debug("governor: the parked-tasks callable failed", exc_info=True)
            else:
                set_parked(value)
        dead = _dead_source
        metrics = _metrics
        if dead is not None and metrics is not None:
            try:
                count = float(dead())
                with fork_lock:
                    metrics.dead_letters.set(count)
            except Exception:
                logger.debug("governor: the dead-letters callable failed", exc_info=True)
        return []


# -- public API -------------------------------------------------------------------------------


def install(
    app: Any,
    port: int | None,
    addr: str = "0.0.0.0",
    *,
    worker: Any = None,
    multiprocess: bool | None = None,
    parked: Callable[[], float] | None = None,
    tenants: int = 0,
    protection: Protection | None = None,
    dead_letters: Callable[[], float] | None = None,
) -> None:
    """Count governor's signals and serve them on ``addr:port`` (``port`` None: count only, for
    an exporter of your own). Call it once, in the worker's main process, before the pool forks
    (``worker_init``); later calls in the same process change nothing (but start the server if
    the first call had no port).

    ``worker`` (the ``worker_init`` sender) tells the pool: a single-process pool needs no
    multiprocess mode. ``multiprocess`` forces the choice; unknown defaults to multiprocess,
    which is right for every pool. ``PROMETHEUS_MULTIPROC_DIR`` set in the environment always
    means multiprocess. ``parked``: called at each scrape for ``governor_parked_tasks``.
    ``tenants``: also ``governor_tenant_wait_seconds`` for at most this many tenants of fair
    limits per process (the rest count as ``tenant="other"``; 0: no tenant series; True: 100).
    ``protection``: TLS and basic authentication for the port (:mod:`.server`).
    ``dead_letters``: called at each scrape for ``governor_dead_letters`` (by default, the dead
    letters of the app's governor in Redis).

    A port that cannot be bound is logged as an error: tasks run on, without metrics.
    """
    global _metrics, _state, _dead_source
    with _install_lock:
        if parked is not None:
            watch_parked(parked)
        _dead_source = dead_letters or _dead_letters_of(app)
        if _state is not None:
            if port is not None and _state.server is None and _state.port is None:
                _serve(_state, port, addr, protection)
            elif port is not None and (port, addr) != (_state.port, _state.addr):
                logger.warning(
                    "governor: metrics already served on %s:%s, not on %s:%s",
                    _state.addr,
                    _state.port,
                    addr,
                    port,
                )
            return
        use_mp = wants_multiprocess(worker, multiprocess)
        refresher = _ParkedRefresher()
        state = _State(
            app_name=str(getattr(app, "main", app)),
            multiprocess=use_mp,
            served=None,
            refresher=refresher,
        )
        if use_mp:
            state.directory, state.owns_directory = prepare_directory()
            if not getattr(prometheus_values.ValueClass, "_multiprocess", False):
                state.previous_value_class = prometheus_values.ValueClass
                prometheus_values.ValueClass = prometheus_values.MultiProcessValue()  # type: ignore[no-untyped-call]
            register_fork_hooks()
            served = CollectorRegistry()
            served.register(refresher)
            MultiProcessCollector(served, path=state.directory)  # type: ignore[no-untyped-call]
            state.served = served
            celery_signals.worker_process_shutdown.connect(
                _on_process_shutdown, weak=False, dispatch_uid="governor.metrics.process_shutdown"
            )
            if state.owns_directory:
                atexit.register(remove_directory, state.directory, state.pid)
        else:
            REGISTRY.register(refresher)
            state.served = REGISTRY
        try:
            _metrics = Metrics(tenants=tenants)
        except Exception:
            _undo(state)
            raise
        _state = state
        set_parked(0)  # a series from the start (multiprocess mode shows a gauge once it is set)
        for signal, receiver in _RECEIVERS:
            signal.connect(receiver, weak=False, dispatch_uid=f"governor.metrics.{signal.name}")
        if port is not None:
            _serve(state, port, addr, protection)
        logger.info(
            "governor: metrics for %s%s (%s)",
            state.app_name,
            f" on {(protection or Protection()).scheme}://{addr}:{port}/metrics"
            if state.server is not None
            else "",
            f"multiprocess, {state.directory}" if use_mp else "single process",
        )


def installed() -> bool:
    """Whether :func:`install` ran in this process (or in the parent it forked from)."""
    return _state is not None


def registry() -> Any:
    """What the metrics port serves (a ``CollectorRegistry``): for tests and custom exporters
    (``prometheus_client.generate_latest(metrics.registry())``). Before :func:`install`, the
    default registry."""
    return _state.served if _state is not None else REGISTRY


def set_parked(count: float) -> None:
    """Set ``governor_parked_tasks`` (call it where the count is known: the releaser, in the
    worker's main process). Does nothing before :func:`install`."""
    metrics = _metrics
    if metrics is None:
        return
    try:
        with fork_lock:
            metrics.parked_now.set(count)
    except Exception:
        logger.debug("governor: set_parked failed", exc_info=True)


def watch_parked(source: Callable[[], float] | None) -> None:
    """Have each scrape set ``governor_parked_tasks`` from ``source()`` (None: stop)."""
    global _parked_source
    _parked_source = source


def uninstall() -> None:
    """Undo :func:`install` in this process: stop the server, disconnect the receivers, drop the
    metrics, and leave multiprocess mode if install entered it. For tests."""
    global _metrics, _state, _dead_source
    with _install_lock:
        state = _state
        if state is None:
            return
        for signal, receiver in _RECEIVERS:
            signal.disconnect(receiver, dispatch_uid=f"governor.metrics.{signal.name}")
        if state.server is not None:
            state.server.shutdown()
            state.server.server_close()
        if state.thread is not None:
            state.thread.join(5)
        metrics, _metrics, _state, _dead_source = _metrics, None, None, None
        for metric in metrics.all() if metrics is not None else []:
            with contextlib.suppress(KeyError):
                REGISTRY.unregister(metric)
        _undo(state)
        watch_parked(None)


# -- plumbing ---------------------------------------------------------------------------------


def _dead_letters_of(app: Any) -> Callable[[], float] | None:
    """How many dead letters the app's governor holds in Redis (one ZCARD a scrape)."""
    from .. import registry
    from ..waiting import dead_letters

    try:
        governor = registry.find(app)
    except TypeError:  # not an app at all
        return None
    if governor is None:
        return None
    gate, prefix = governor.gate, governor.settings.prefix
    return lambda: dead_letters.count(gate.client, prefix)


def _undo(state: _State) -> None:
    with contextlib.suppress(KeyError):
        state.served.unregister(state.refresher)
    if not state.multiprocess:
        return
    celery_signals.worker_process_shutdown.disconnect(
        _on_process_shutdown, dispatch_uid="governor.metrics.process_shutdown"
    )
    if state.previous_value_class is not None:
        close = getattr(prometheus_values.ValueClass, "close_all_files", None)
        if close is not None:
            close()
        prometheus_values.ValueClass = state.previous_value_class
    if state.owns_directory:
        if os.environ.get(MULTIPROC_ENV) == state.directory:
            del os.environ[MULTIPROC_ENV]
        remove_directory(state.directory, state.pid)


def _serve(state: _State, port: int, addr: str, protection: Protection | None) -> None:
    state.port, state.addr = port, addr
    try:
        state.server, state.thread = serve(state.served, port, addr, protection)
    except (OSError, ssl.SSLError) as exc:
        logger.error("governor: cannot serve metrics on %s:%s: %s", addr, port, exc)


# -- receivers --------------------------------------------------------------------------------


def _receiver(
    update: Callable[[Metrics, Any, dict[str, Any]], None],
) -> Callable[..., None]:
    """A signal receiver that updates the metrics and never raises (metrics must not break a
    task: errors are logged at debug)."""

    def receive(sender: Any = None, **kwargs: Any) -> None:
        metrics = _metrics
        if metrics is None:
            return
        try:
            with fork_lock:
                update(metrics, sender, kwargs)
        except Exception:
            logger.debug("governor: metrics receiver %s failed", update.__name__, exc_info=True)

    receive.__name__ = receive.__qualname__ = f"receive_{update.__name__.lstrip('_')}"
    return receive


_RECEIVERS = [(signal, _receiver(update)) for signal, update in UPDATES]


def _on_process_shutdown(pid: int | None = None, **_: Any) -> None:
    """A pool process exits (sent in that process): drop its live gauges from the sum."""
    state = _state
    if state is None or not state.multiprocess or state.directory is None:
        return
    try:
        mark_process_dead(pid if pid is not None else os.getpid(), state.directory)  # type: ignore[no-untyped-call]
    except Exception:
        logger.debug("governor: mark_process_dead failed", exc_info=True)
