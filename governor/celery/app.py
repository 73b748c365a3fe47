"""``Governor(app)``: installs governor into a Celery app.

>>> app = Celery("proj", broker="redis://localhost:6379/0")
>>> app.conf.governor_queues = {"emails": "10/s, 800/d"}
>>> app.conf.governor_tasks = {"proj.tasks.sync_account": "1/s, 20/m"}
>>> governor = Governor(app)
>>> @governor.task("5/s, 200/h", key=lambda customer_id, **_: customer_id)
... def call_partner(customer_id, payload): ...

What it does:

- when the app finalizes (in producers and workers alike), validates every ``governor_*``
  setting and every task's ``governor_*`` attributes, so a bad rule fails at start-up, naming
  the queue or task (``app.finalize`` is wrapped for this: Celery's ``on_after_finalize`` is a
  signal, and signal receivers cannot make it fail);
- when a worker starts (``worker_init``), gives every task the gate (tasks that do not derive
  from :class:`GovernedTask` get it mixed into their class), and a request class that holds
  the early acknowledgement of governed messages until their fate is known.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import signals as celery_signals

from ..connect import close_client
from ..deployment import Check, too_old_servers, volatile_servers
from ..errors import ConfigError
from . import registry
from .admission.gate import Gate
from .bootstep import ReleaserStep
from .config.settings import Settings, load_settings
from .config.task_limits import validate_task
from .hub_tick import HubTickStep
from .patches import hide_deferral_logs, mix_into_task, wrap_finalize
from .request import governed_request_class
from .task import GovernedMixin, GovernedTask, watch_backoff

__all__ = ["Governor"]

logger = logging.getLogger("governor.celery")


class Governor:
    """governor for one Celery app. Create it once, where the app is defined."""

    def __init__(self, app: Any) -> None:
        if registry.find(app) is not None:
            raise ConfigError(f"Governor is already installed on app {app.main!r}")
        self.app = app
        self._settings: Settings | None = None
        self._gate: Gate | None = None
        registry.register(app, self)
        wrap_finalize(app, self._validate)
        # a dispatch_uid per instance: Celery < 5.7 keys a bound method by its function alone,
        # so a second Governor in the process (another app) was never connected
        celery_signals.worker_init.connect(
            self._on_worker_init, weak=False, dispatch_uid=self._uid("worker_init")
        )
        app.steps["worker"].add(ReleaserStep)
        app.steps["worker"].add(HubTickStep)  # kombu < 5.7, threads pool: see .hub_tick
        if app.finalized:
            self._validate()

    @classmethod
    def find(cls, app: Any) -> Governor | None:
        found = registry.find(app)
        return found if isinstance(found, Governor) else None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.app.conf, getattr(self.app, "namespace", None))
        return self._settings

    @property
    def gate(self) -> Gate:
        if self._gate is None:
            self._gate = Gate(self.app, self.settings)
        return self._gate

    # -- configuration ----------------------------------------------------------------------

    def task(
        self,
        rules: Any = None,
        *,
        key: Callable[..., Any] | None = None,
        limit_name: str | None = None,
        algorithm: str | None = None,
        cost: Any = 1,
        max_wait: float | None = None,
        concurrency: int | None = None,
        **options: Any,
    ) -> Callable[[Callable[..., Any]], Any]:
        """``@app.task`` with limits: ``@governor.task("5/s", key=lambda customer, **_: customer)``.

        ``concurrency`` caps how many calls run at once (per key with ``key``; rules are then
        optional: ``@governor.task(concurrency=1, key=...)``). ``limit_name`` names a per-key
        limit (tasks that share it share the limit); other options (``name``, ``bind``,
        ``max_retries``...) go to ``app.task``.
        """
        return self.app.task(  # type: ignore[no-any-return]
            base=options.pop("base", GovernedTask),
            governor_limit=rules,
            governor_concurrency=concurrency,
            governor_key=key,
            governor_name=limit_name,
            governor_algorithm=algorithm,
            governor_cost=cost,
            governor_max_wait=max_wait,
            **options,
        )

    def _validate(self, **_: Any) -> None:
        self._settings = None
        settings = self.settings
        for task in list(self.app.tasks.values()):
            validate_task(task, settings)
        if (settings.queues or settings.tasks or self._has_task_limits()) and not (
            settings.redis_url
        ):
            settings.require_redis()

    @property
    def uses_caps(self) -> bool:
        """Whether any limit of the app has a concurrency cap (its workers then sweep caps)."""
        return self._any_limit("concurrency", "governor_concurrency")

    @property
    def uses_fairness(self) -> bool:
        """Whether any limit of the app is fair (its workers then run a fair dispatcher)."""
        return self._any_limit("fair_by", "governor_fair_by")

    def _any_limit(self, config_field: str, task_attribute: str) -> bool:
        """Whether a configured limit sets ``config_field`` or a task ``task_attribute``."""
        settings = self.settings
        configured = list(settings.queues.values()) + list(settings.tasks.values())
        return any(getattr(c, config_field) is not None for c in configured) or any(
            getattr(t, task_attribute, None) is not None for t in self.app.tasks.values()
        )

    def _has_task_limits(self) -> bool:
        return any(
            getattr(t, "governor_limit", None) is not None
            or getattr(t, "governor_concurrency", None) is not None
            for t in self.app.tasks.values()
        )

    # -- worker -----------------------------------------------------------------------------

    def _on_worker_init(self, sender: Any = None, **_: Any) -> None:
        if not self._is_mine(sender):
            return
        try:
            self.app.finalize(auto=True)
            self._validate()
        except ConfigError as exc:
            # worker_init receivers cannot stop the worker with an exception (Celery logs and
            # swallows it); a worker with a bad limit must not start.
            logger.critical("governor: %s", exc)
            raise SystemExit(f"governor: {exc}") from exc
        installed = [task.name for task in self.app.tasks.values() if self.install(task)]
        for signal in (celery_signals.worker_process_shutdown, celery_signals.worker_shutdown):
            signal.connect(self._release_leases, weak=False, dispatch_uid=self._uid(signal.name))
        hide_deferral_logs()
        settings = self.settings
        if settings.metrics_port is not None:
            try:
                from . import metrics
            except ImportError as exc:
                logger.critical("governor: %s", exc)
                raise SystemExit(f"governor: governor_metrics_port is set, but {exc}") from exc
            metrics.install(
                self.app,
                settings.metrics_port,
                settings.metrics_addr,
                worker=sender,
                tenants=settings.metrics_tenants,
                protection=metrics.Protection(
                    certfile=settings.metrics_certfile,
                    keyfile=settings.metrics_keyfile,
                    client_cafile=settings.metrics_client_cafile,
                    basic_auth=settings.metrics_basic_auth,
                ),
            )
        self._refuse_old_redis()
        self._warn_if_volatile()
        unknown = sorted(set(self.settings.tasks) - set(self.app.tasks))
        if unknown:
            logger.warning(
                "governor_tasks names tasks this worker does not know: %s", ", ".join(unknown)
            )
        logger.info(
            "governor: gate installed on %d tasks; queues %s",
            len(installed),
            ", ".join(f"{q}={c.text}" for q, c in self.settings.queues.items()) or "-",
        )

    def _refuse_old_redis(self) -> None:
        """A Redis too old for governor's scripts stops the worker at start-up with a clear
        error (every decision would fail). One that is away for now fails nothing."""
        old = self._ask_redis(too_old_servers)
        if old:
            raise SystemExit("governor: " + "; ".join(f"{c.server}: {c.detail}" for c in old))

    def _warn_if_volatile(self) -> None:
        """One WARNING when governor's Redis keeps nothing on disk and has no replica: a restart
        would lose the parked tasks. Never fails start-up (Redis may be away for now)."""
        volatile = self._ask_redis(volatile_servers)
        if volatile:
            logger.warning(
                "governor: Redis %s keeps nothing on disk (no AOF, no RDB save points) and has no "
                "replica: parked tasks and the waiters of concurrency caps are lost if it "
                "restarts; see `governor doctor`",
                ", ".join(check.server for check in volatile),
            )

    def _ask_redis(self, check: Callable[[Any], list[Check]]) -> list[Check]:
        """The failed checks of governor's Redis at start-up; none when it cannot be asked."""
        settings = self.settings
        if settings.redis is None:
            return []
        try:
            client = settings.redis.client(
                socket_timeout=settings.socket_timeout,
                socket_connect_timeout=settings.socket_timeout,
            )
            try:
                return check(client)
            finally:
                close_client(client)
        except Exception as exc:
            logger.debug("governor: could not check Redis: %s", exc)
            return []

    def _release_leases(self, **_: Any) -> None:
        """Give back the admissions this process leased and did not use, and the concurrency
        slots its tasks still hold."""
        if self._gate is not None:
            try:
                self._gate.leases.release()
                self._gate.holding.release_all()
            except Exception as exc:  # shutting down: what stays counted only makes it stricter
                logger.warning("governor: could not give back leased admissions: %s", exc)

    def _uid(self, signal_name: str) -> str:
        """This instance's ``dispatch_uid`` for a Celery signal (see ``__init__``)."""
        return f"governor.{id(self)}.{signal_name}"

    def _is_mine(self, sender: Any) -> bool:
        return getattr(sender, "app", None) is self.app

    def install(self, task: Any) -> bool:
        """Give ``task`` the gate and the governed request class. False for Celery's own."""
        if task.name.startswith("celery."):
            return False
        mix_into_task(task, GovernedMixin)
        task.Request = governed_request_class(task.Request)
        watch_backoff(task)
        return True


def _adopt_governed_tasks(sender: Any = None, **_: Any) -> None:
    """A worker whose app has GovernedTask tasks but no ``Governor(app)`` gets one: without it
    the worker would run the gate but neither hold acknowledgements nor release parked tasks.

    ``worker_init`` is sent before the worker builds its blueprint from ``app.steps``, so the
    releaser step added here still starts."""
    app = getattr(sender, "app", None)
    if app is None or Governor.find(app) is not None:
        return
    if any(isinstance(task, GovernedMixin) for task in list(app.tasks.values())):
        Governor(app)._on_worker_init(sender=sender)


registry.set_factory(Governor)
celery_signals.worker_init.connect(_adopt_governed_tasks, weak=False)
