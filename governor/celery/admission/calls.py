"""What governs one call of a task: its limits (queue, task, key), its cost, its wait state.

:class:`Calls` works that out for the gate and for early deferral, caching what does not
depend on the arguments (a task's options, the limits of each task and route, with the live
limits applied until they change). A :class:`Call` is the result: everything the admission
steps need about one call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ...costs import Cost
from ...errors import ConfigError, CostError
from ..config.live import LiveView
from ..config.settings import Settings
from ..config.task_limits import (
    call_with_arguments,
    consumed_queue,
    key_config,
    key_spec,
    option,
    task_limit_config,
)
from ..fair.tenants import tenant_of
from ..metering.costs import Learned
from ..metering.learned import Learning
from ..types import Call, LimitSpec, TaskOptions, WaitState

__all__ = ["MAX_COST", "Calls", "Route", "units"]

ROUTES = 10_000
"""Routes (task, routing key, exchange, queue) whose limits a process remembers; routing keys
are open-ended (topic exchanges), so past that it starts afresh."""
MAX_COST = 2**53
"""The largest cost a callable may give (units stay exact integers in Redis's numbers)."""


def units(task: Any, value: Any) -> int:
    """A cost callable's answer as units: a fraction rounds up (a call is never counted as
    less than it costs); 0 counts under no limit (the call runs at once, holding no slot: an
    empty batch costs nothing). Anything else (negative, not a number, too large) is a
    ConfigError naming the task, which fails the call."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"task {task.name!r}: governor_cost returned {value!r}; it must give a number of "
            "units, 0 or more"
        )
    if not (0 <= value <= MAX_COST):  # also NaN
        raise ConfigError(
            f"task {task.name!r}: governor_cost returned {value!r}; it must give a number of "
            f"units from 0 to {MAX_COST}"
        )
    return math.ceil(value)


class Route:
    """What governs the calls of one task from one route (routing key, exchange, queue) under
    one view of the live limits, before the arguments: worked out again when they change."""

    __slots__ = ("clear_until", "configs", "factors", "fair", "lane", "shadows", "specs")

    def __init__(
        self,
        specs: tuple[LimitSpec, ...],
        shadows: tuple[LimitSpec, ...],
        configs: object,
        factors: object,
    ) -> None:
        self.specs = specs
        """The enforced limits, queue first."""
        self.shadows = shadows
        self.fair = any(s.config.fair_by is not None for s in specs + shadows)
        self.configs = configs
        """The live view's configs and factors these were worked out from (compared by
        identity: a change of the live limits replaces them)."""
        self.factors = factors
        self.lane: Any = None
        """For the gate: how these limits admit from leases in this process (see
        ``Gate._lane``)."""
        self.clear_until = 0.0
        """For the worker's main process: until when (monotonic) its early deferral knows every
        limit here to have room, and nothing else of the call to matter (see
        ``EarlyDeferral.defer``)."""


class Calls:
    """Works out what governs each call; one per gate (per process)."""

    def __init__(self, app: Any, settings: Settings, live: LiveView | None = None) -> None:
        self.app = app
        self.settings = settings
        self.live = live
        """Live limits (:mod:`..config.live`) replace the configured ones they name."""
        self.learning: Learning | None = None
        """Learned estimates (``learned(...)`` in a cost per meter; see :mod:`..metering`)."""
        self._options: dict[str, TaskOptions] = {}
        self._fixed: dict[tuple[Any, ...], tuple[LimitSpec, ...]] = {}
        self._routes: dict[tuple[Any, ...], Route] = {}

    def options(self, task: Any) -> TaskOptions:
        """A task's governor options, read once per task (they are fixed after start-up)."""
        opts = self._options.get(task.name)
        if opts is None:
            wait = getattr(task, "governor_max_wait", None) or self.settings.max_wait
            task_config = task_limit_config(task, self.settings)
            keyed = key_config(task, self.settings)
            opts = TaskOptions(
                task_spec=None
                if task_config is None
                else LimitSpec("task", "task", task_config, task.name),
                key_config=keyed,
                cost=option(task, "governor_cost", 1),
                max_wait=None if wait is None else float(wait),
                key=None if keyed is None else option(task, "governor_key"),
            )
            self._options[task.name] = opts
        return opts

    def fixed_specs(self, task: Any, delivery_info: Mapping[str, Any] | None) -> list[LimitSpec]:
        """The enforced limits that do not depend on the arguments: the queue's, then the
        task's (shadow limits left out)."""
        return list(self.route(task, delivery_info).specs)

    def route(self, task: Any, delivery_info: Mapping[str, Any] | None) -> Route:
        """The limits of ``task``'s calls from this route, live limits applied: worked out
        again only when the live limits change (every call asks, in both processes)."""
        live = self.live
        configs, factors = live.current() if live is not None else (None, None)
        key = _route_of(task, delivery_info)
        route = self._routes.get(key)
        if route is not None and route.configs is configs and route.factors is factors:
            return route
        configured = self._configured(task, delivery_info, key)
        specs = list(configured) if live is None else live.apply(list(configured))
        route = Route(
            tuple(s for s in specs if not s.config.shadow),
            tuple(s for s in specs if s.config.shadow),
            configs,
            factors,
        )
        if not (factors and any(s.config.adaptive and s.label in factors for s in specs)):
            # (an adaptive limit with a factor climbs back with time: worked out every call)
            if len(self._routes) > ROUTES:
                self._routes.clear()
            self._routes[key] = route
        return route

    def _configured(
        self, task: Any, delivery_info: Mapping[str, Any] | None, route: tuple[Any, ...]
    ) -> tuple[LimitSpec, ...]:
        """The queue's and the task's limits as configured (once per task and route)."""
        specs = self._fixed.get(route)
        if specs is None:
            out = []
            queue = consumed_queue(self.app, delivery_info)
            if queue is not None and queue in self.settings.queues:
                out.append(LimitSpec("queue", "queue", self.settings.queues[queue], queue))
            opts = self.options(task)
            if opts.task_spec is not None:
                out.append(opts.task_spec)
            specs = tuple(out)
            if len(self._fixed) > ROUTES:
                self._fixed.clear()
            self._fixed[route] = specs
        return specs

    def specs(
        self, task: Any, request: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> list[LimitSpec]:
        """Every limit that governs this call, queue first."""
        info = getattr(request, "delivery_info", None)
        out = list(self._configured(task, info, _route_of(task, info)))
        config = self.options(task).key_config
        if config is not None:
            out.append(key_spec(task, config, args, kwargs))
        return self.live.apply(out) if self.live is not None else out

    def governs(self, task: Any, route: Route) -> bool:
        """Whether a message of ``task`` from ``route`` may be governed (checked in the worker's
        main process)."""
        return bool(route.specs or route.shadows) or self.options(task).key_config is not None

    def cost(self, task: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Cost:
        return self._cost(task, args, kwargs)[0]

    def _cost(
        self, task: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Cost, dict[str, int] | None]:
        """The call's cost, and the defaults of the meters it learned (None: none)."""
        cost = self.options(task).cost
        if not callable(cost):
            return (cost, None) if not isinstance(cost, Mapping) else self._per_meter(task, cost)
        value = call_with_arguments(task, cost, args, kwargs)
        if not isinstance(value, Mapping):
            return units(task, value), None
        return self._per_meter(task, value)

    def _per_meter(
        self, task: Any, value: Mapping[Any, Any]
    ) -> tuple[dict[str, int], dict[str, int] | None]:
        """A cost per meter with its learned estimates worked out."""
        out: dict[str, int] = {}
        learned: dict[str, int] = {}
        for meter, units in value.items():
            if isinstance(units, Learned):
                learned[str(meter)] = units.default
                units = (
                    units.default
                    if self.learning is None
                    else self.learning.estimate(task.name, str(meter), units)
                )
            if isinstance(units, bool) or not isinstance(units, int) or not isinstance(meter, str):
                raise CostError(
                    f"task {task.name!r}: governor_cost gave {dict(value)!r}; units per meter "
                    "must be integers (or learned(...)) under meter names"
                )
            out[meter] = units
        return out, learned or None

    def call(
        self, task: Any, request: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Call:
        """The call ``request`` makes of ``task`` (its cost is 0 when nothing governs it, and
        nothing governs a call that costs nothing)."""
        route = self.route(task, getattr(request, "delivery_info", None))
        specs, shadows = list(route.specs), list(route.shadows)
        fair = route.fair
        opts = self.options(task)
        config = opts.key_config
        if config is not None:
            key = key_spec(task, config, args, kwargs, opts.key)
            if self.live is not None:
                [key] = self.live.apply([key])
            (shadows if key.config.shadow else specs).append(key)
            fair = fair or key.config.fair_by is not None
        if fair:
            header = self.settings.tenant_header
            specs = _with_tenants(specs, task, request, args, kwargs, header)
            shadows = _with_tenants(shadows, task, request, args, kwargs, header)
        cost, learned = self._cost(task, args, kwargs) if specs or shadows else (0, None)
        if cost == 0:  # it costs nothing: no limit counts it, it runs at once
            specs = shadows = []
        state = WaitState.from_request(request)
        return Call(task, request, args, kwargs, specs, cost, state, shadows, learned)

    def max_wait(self, task: Any) -> float | None:
        wait: float | None = self.options(task).max_wait
        return wait


def _with_tenants(
    specs: list[LimitSpec],
    task: Any,
    request: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    header: str,
) -> list[LimitSpec]:
    """``specs`` with the call's tenant on its fair limits (``header``: what the producer's
    ``governor_tenant`` header may say, ``governor_tenant_header``)."""
    return [
        s
        if s.config.fair_by is None
        else replace(s, tenant=tenant_of(task, request, s, args, kwargs, header))
        for s in specs
    ]


def _route_of(task: Any, delivery_info: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What a task's configured limits depend on: its name and where its message came from."""
    info = delivery_info or {}
    return (task.name, info.get("routing_key"), info.get("exchange"), info.get("queue"))
