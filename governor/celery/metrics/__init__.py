"""Prometheus metrics for governed Celery workers (the ``prometheus`` extra).

Turn them on with ``app.conf.governor_metrics_port = 9808`` (and ``governor_metrics_addr``,
default ``"0.0.0.0"``): every worker then serves ``http://<host>:9808/metrics`` from its main
process, with what all of its pool processes counted. Or call :func:`install` yourself when the
worker starts::

    from celery.signals import worker_init
    from governor.celery import metrics

    @worker_init.connect
    def serve_metrics(sender, **_):
        metrics.install(sender.app, 9808, worker=sender)

The metrics and their labels: :mod:`.definitions`; which signal updates which:
:mod:`.updates`; where the processes' counts meet: :mod:`.processes`; the server and its
receivers: :mod:`.exporter`.

A deferral is not a failure: the gate raises :class:`~governor.celery.Deferred`, an ``Ignore``,
so Celery's own failure counts (``task_failure``, events, Flower) do not see it, and these
counters are the only place denials show up. A call that gives up (``GovernorTimeout``) is a
real task failure and is left to Celery's metrics.

Processes
---------

The gate admits in the process that runs the task: with the prefork pool, a child process (a
call known to be denied may be deferred earlier, in the worker's main process). So in a
prefork worker the counters live in prometheus_client's multiprocess mode: at
:func:`install` (in the main process, before the pool forks) ``PROMETHEUS_MULTIPROC_DIR`` is
set to a fresh private directory (removed when the worker exits), or the one you set yourself
is used as it is (created if missing, never emptied or removed: empty it before the worker
starts, as prometheus_client asks). Each process writes its own files there; the port, served by
a thread of the main process, adds them all up (``MultiProcessCollector``), so the counts
survive pool processes that exit (``worker_max_tasks_per_child``). When a pool process exits,
Celery's ``worker_process_shutdown`` marks it dead for prometheus_client.

Your own metrics join the port in a prefork worker only if they are multiprocess-safe: set
``PROMETHEUS_MULTIPROC_DIR`` before anything imports ``prometheus_client``. In a single-process
worker (``-P solo``, ``threads``, ``gevent``, ``eventlet``; pass ``worker=`` so :func:`install`
can tell) the port serves the default registry, yours included.

Scraping
--------

Point Prometheus at every worker; one port per worker process (two workers on one host need two
ports: the second cannot bind and logs an error, its tasks run unaffected)::

    scrape_configs:
      - job_name: celery-governor
        static_configs:
          - targets: ["worker-1:9808", "worker-2:9808"]

Then, for example::

    sum by (limit) (rate(governor_deferred_total[5m]))          # denials per second
    histogram_quantile(0.9, sum by (le, limit) (rate(governor_delay_seconds_bucket[5m])))
"""

from .exporter import install, installed, registry, set_parked, uninstall, watch_parked
from .server import Protection

__all__ = [
    "Protection",
    "install",
    "installed",
    "registry",
    "set_parked",
    "uninstall",
    "watch_parked",
]
