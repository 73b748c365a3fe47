"""``governed(app, ...)``: eager calls of an app's tasks, with its limits applied on a test's clock.

Production never governs an eager call (the gate lets ``is_eager`` calls through). Inside
``with governed(app, "apply", clock=clock) as gov:`` every eager call of the app's tasks
(``delay()`` / ``apply_async()`` under ``task_always_eager``, and ``apply()``) asks the app's
limits, as a worker would: the same settings and task attributes, the same
:class:`~governor.celery.admission.calls.Calls` working out the queue, task and key limits of
the call, the same Lua scripts, on Redis, at the clock's time instead of Redis ``TIME``.

- Admitted: the body runs (a concurrency slot it took is given back when it ends).
- Denied: a :class:`~governor.testing.Denied` naming the limit, the rule and the wait is
  recorded; the call does not run, counts nothing, never sleeps and is never re-published.
  By default ``delay()`` returns as usual (an ``IGNORED`` eager result, as production returns
  before the call waits); ``on_denied="raise"`` raises the Denied from ``delay()``.
- A call that could never run (its cost above a rule), or that would wait longer than its
  ``governor_max_wait``, fails as it would in production (GovernorError, GovernorTimeout).

``governed(app, "off")`` runs the same calls with no limit asked (and no Redis), still
recording them. Either way the app's own Governor, its settings and production's code paths are
left as they are: the tasks' classes get a test mixin for the block (and their own back after),
limits are kept in a Redis of the test's (a private ``redis-server`` unless ``redis_url`` names
one) under a key prefix of their own, so nothing is ever flushed.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, Literal

from ..caps import new_token
from ..connect import target
from ..costs import Cost
from ..decision import Decision
from ..errors import ConfigError, GovernorError, GovernorTimeout
from ..limiter import Limiter
from .clock import Clock
from .records import Denied, GovernedCall

__all__ = ["Governed", "Limits", "OnDenied", "governed"]

Limits = Literal["apply", "off"]
OnDenied = Literal["record", "raise"]
Held = list[tuple[Limiter, str, Decision]]

_active: weakref.WeakKeyDictionary[Any, Governed] = weakref.WeakKeyDictionary()
_entering = threading.Lock()


@contextmanager
def governed(
    app: Any,
    limits: Limits,
    *,
    clock: Callable[[], float] | None = None,
    redis_url: str | None = None,
    on_denied: OnDenied = "record",
    eager: bool = True,
) -> Iterator[Governed]:
    """Run ``app``'s tasks eagerly with its limits applied (``"apply"``) or off (``"off"``).

    ``clock``: what decisions are taken at (Unix seconds; default a fresh
    :class:`~governor.testing.Clock`, moved only by the test). ``redis_url``: where the limits
    are counted, under a new key prefix (default: a private ``redis-server`` for the block).
    ``on_denied``: ``"record"`` (``delay()`` returns; the Denied is in ``gov.denials``) or
    ``"raise"``. ``eager``: set ``task_always_eager`` for the block (restored after).
    """
    if limits not in ("apply", "off"):
        raise ConfigError(f"governed(app, limits): 'apply' or 'off', got {limits!r}")
    if on_denied not in ("record", "raise"):
        raise ConfigError(f"governed(on_denied=): 'record' or 'raise', got {on_denied!r}")
    with ExitStack() as stack:
        if limits == "apply" and redis_url is None:
            from ..embedded import EmbeddedRedis

            server = stack.enter_context(EmbeddedRedis())
            redis_url = server.url()
        gov = Governed(app, limits, clock or Clock(), redis_url, on_denied)
        with _entering:
            if app in _active:
                raise RuntimeError(f"app {app.main!r} is already under governed()")
            _active[app] = gov
        stack.callback(_active.pop, app, None)
        stack.callback(gov.close)
        if eager:
            before = app.conf.task_always_eager
            app.conf.task_always_eager = True
            stack.callback(setattr, app.conf, "task_always_eager", before)
        gov.install()
        yield gov


def share(lim: Limiter, cost: Cost) -> Cost:
    """The part of a call's cost ``lim`` counts (units per meter: see governor.celery.metering)."""
    if type(cost) is int:
        return cost
    from ..celery.metering.costs import share as share_of

    return share_of(lim, cost)


class Governed:
    """What :func:`governed` yields: the calls so far, and questions about the next one."""

    def __init__(
        self,
        app: Any,
        limits: Limits,
        clock: Callable[[], float],
        redis_url: str | None,
        on_denied: OnDenied,
    ) -> None:
        from ..celery.config.settings import load_settings
        from ..celery.config.task_limits import validate_task

        self.app = app
        self.limits = limits
        self.clock = clock
        self.redis_url = redis_url
        self.on_denied = on_denied
        self.calls: list[GovernedCall] = []
        """Every eager call of the app's tasks so far, admitted or denied, in order."""
        self._base = load_settings(app.conf, getattr(app, "namespace", None))
        for task in list(app.tasks.values()):
            validate_task(task, self._base)
        self._swapped: list[tuple[Any, type]] = []
        self._queues: dict[str, str | None] = {}
        self._held: dict[str, Held] = {}
        self._denied: dict[str, Denied] = {}
        self.prefix = ""
        self.reset()

    # -- what tests use ---------------------------------------------------------------------

    @property
    def denials(self) -> list[Denied]:
        """The denials so far, in order."""
        return [c.denied for c in self.calls if c.denied is not None]

    @property
    def admitted(self) -> list[GovernedCall]:
        """The calls that ran, in order."""
        return [c for c in self.calls if c.denied is None]

    def check(self, call: Any) -> Denied | None:
        """Whether ``call`` (a task's signature, ``task.s(...)``, or a task without arguments)
        would be denied now: the Denied it would get, or None. Counts nothing."""
        task, args, kwargs, options = self._signature(call)
        request = _Request(f"check-{uuid.uuid4().hex}", self._queue(task, args, kwargs, options))
        specs, cost = self._specs(task, request, args, kwargs)
        now = self.clock()
        worst: tuple[str, str, Decision] | None = None
        for spec_label, subject, lim in specs:
            d = lim.peek(subject, share(lim, cost), now=now, holder=request.id)
            if not d.allowed and (worst is None or d.retry_after > worst[2].retry_after):
                worst = (spec_label, subject, d)
        if worst is None:
            return None
        return _denial(worst[0], worst[1], worst[2], task, request.id, args, kwargs, now)

    def assert_denied(
        self,
        call: Any,
        *,
        limit: str | None = None,
        rule: str | None = None,
        retry_after: float | None = None,
        within: float = 0.001,
    ) -> Denied:
        """Assert that ``call`` would be denied now (by ``limit``, by ``rule``, for
        ``retry_after`` seconds give or take ``within``, each when given); returns the Denied.

        >>> gov.assert_denied(call_partner.s("acme"), rule="5/s", retry_after=0.8)
        """
        denied = self.check(call)
        shown = _shown(call)
        if denied is None:
            raise AssertionError(f"{shown} would be admitted now, not denied")
        wrong = []
        if limit is not None and denied.limit != limit:
            wrong.append(f"limit {denied.limit!r}, not {limit!r}")
        if rule is not None and (denied.rule or "").replace(" ", "") != rule.replace(" ", ""):
            wrong.append(f"{denied.why}, not rule {rule}")
        if retry_after is not None and not abs(denied.retry_after - retry_after) <= within:
            wrong.append(f"a wait of {denied.retry_after:.6f}s, not {retry_after}s")
        if wrong:
            raise AssertionError(f"{shown} is denied, but with " + "; ".join(wrong))
        return denied

    def assert_admitted(self, call: Any) -> None:
        """Assert that ``call`` would be admitted now."""
        denied = self.check(call)
        if denied is not None:
            raise AssertionError(f"{_shown(call)} would be denied: {denied}")

    def reset(self) -> None:
        """Forget everything counted so far (the limits start afresh, under a new key prefix);
        the calls recorded so far stay."""
        from ..celery.admission.calls import Calls
        from ..celery.config.live import LiveView
        from ..celery.config.store import Store

        if self.limits == "off":
            self._calls = Calls(self.app, self._base, None)
            return
        assert self.redis_url is not None
        self._close_store()
        self.prefix = f"gtest{uuid.uuid4().hex[:10]}"
        settings = dataclasses.replace(
            self._base, redis_url=self.redis_url, redis=target(self.redis_url), prefix=self.prefix
        )
        self._store = Store(settings)
        store = self._store
        self._calls = Calls(self.app, settings, LiveView(lambda: store.client, settings))

    # -- what the tasks' test mixin calls ---------------------------------------------------

    def install(self) -> None:
        """Give every task of the app (Celery's own aside) the test mixin, for the block."""
        for task in list(self.app.tasks.values()):
            cls = type(task)
            if task.name.startswith("celery.") or issubclass(cls, UnderTest):
                continue
            task.__class__ = type(
                cls.__name__,
                (UnderTest, cls),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
            )
            self._swapped.append((task, cls))

    def close(self) -> None:
        """Give the tasks their classes back; close the Redis connections of the block."""
        while self._swapped:
            task, cls = self._swapped.pop()
            task.__class__ = cls
        self._close_store()

    def run(
        self,
        task: Any,
        apply: Callable[..., Any],
        args: Any,
        kwargs: Any,
        options: dict[str, Any],
    ) -> Any:
        """An eager call (``task.apply``): remember its queue, run it, give back the slots it
        held, and raise its denial when asked to."""
        task_id = options.pop("task_id", None) or str(uuid.uuid4())
        self._queues[task_id] = self._queue(task, tuple(args or ()), kwargs or {}, options)
        try:
            result = apply(args, kwargs, task_id=task_id, **options)
        finally:
            self._queues.pop(task_id, None)
            self._release(task_id)
        denied = self._denied.pop(task_id, None)
        if denied is not None and self.on_denied == "raise":
            raise denied
        return result

    def admit(
        self, task: Any, task_id: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        """Decide an eager call right before its body: return to run it, raise to not."""
        request = _Request(task_id, self._queues.get(task_id), task.request.retries)
        if self.limits == "off":
            labels = tuple(s.label for s in self._calls.call(task, request, args, kwargs).specs)
            self.calls.append(GovernedCall(task.name, task_id, args, dict(kwargs), 0.0, labels))
            return
        specs, cost = self._specs(task, request, args, kwargs)
        labels = tuple(label for label, _, _ in specs)
        now = self.clock()
        held: Held = []
        holder = f"{task_id}:{request.retries}"
        for i, (label, subject, lim) in enumerate(specs):
            d = lim.acquire(
                subject,
                share(lim, cost),
                now=now,
                holder=holder,
                token=new_token(),
                info="governor.testing",
            )
            if d.allowed:
                held.append((lim, subject, d))
                continue
            self._give_back(held, cost, now)
            worst = (label, subject, d)
            for other_label, other_subject, other in specs[i + 1 :] if d.capped is None else ():
                p = other.peek(other_subject, share(other, cost), now=now, holder=holder)
                if not p.allowed and p.retry_after > worst[2].retry_after:
                    worst = (other_label, other_subject, p)
            denied = _denial(*worst, task, task_id, args, kwargs, now)
            self._check_wait(task, cost, denied)
            self.calls.append(
                GovernedCall(task.name, task_id, args, dict(kwargs), now, labels, denied)
            )
            self._denied[task_id] = denied
            raise denied
        self.calls.append(GovernedCall(task.name, task_id, args, dict(kwargs), now, labels))
        if any(d.hold is not None for _, _, d in held):
            self._held[task_id] = held

    # -- inside -----------------------------------------------------------------------------

    def _specs(
        self, task: Any, request: _Request, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[list[tuple[str, str, Limiter]], Cost]:
        """(label, subject, limiter) of every enforced limit of the call, and its cost."""
        if self.limits == "off":
            raise RuntimeError("governed(app, 'off'): the limits are off, nothing to ask")
        call = self._calls.call(task, request, args, kwargs)
        limiters = [(s.label, s.subject, self._store.limiter(s.name, s.config)) for s in call.specs]
        return limiters, call.cost

    def _check_wait(self, task: Any, cost: Cost, denied: Denied) -> None:
        """What production fails rather than defers: a call no rule can ever admit, a wait
        longer than the task's ``governor_max_wait``."""
        if denied.retry_after == math.inf:
            raise GovernorError(
                f"task {task.name!r} costs {cost}, more than rule {denied.rule} of limit "
                f"{denied.limit} allows: it can never run"
            )
        max_wait = self._calls.max_wait(task)
        if max_wait is not None and denied.capped is None and denied.retry_after > max_wait:
            raise GovernorTimeout(
                f"task {task.name!r} would wait {denied.retry_after:.1f}s for {denied.limit}, "
                f"more than governor_max_wait={max_wait}s"
            )

    def _close_store(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None and store._client is not None:
            store._client.close()

    def _release(self, task_id: str) -> None:
        """The body ended: its concurrency slots go back (refunding nothing else)."""
        for lim, subject, d in self._held.pop(task_id, []):
            if d.hold is not None:
                lim.release(subject, d.hold, now=self.clock())

    def _give_back(self, held: Held, cost: Cost, now: float) -> None:
        for lim, subject, d in held:
            lim.refund(subject, d, share(lim, cost), now=now)

    def _queue(
        self,
        task: Any,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        options: Mapping[str, Any],
    ) -> str | None:
        """The queue a worker would consume the call from, as the app routes it."""
        routed = self.app.amqp.router.route(dict(options), task.name, args, dict(kwargs))
        queue = routed.get("queue")
        name = getattr(queue, "name", queue)
        return None if name is None else str(name)

    def _signature(self, call: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any], Any]:
        from celery.canvas import Signature

        if isinstance(call, Signature):
            task = self.app.tasks[call.task]
            return task, tuple(call.args), dict(call.kwargs), dict(call.options)
        if callable(getattr(call, "run", None)) and isinstance(getattr(call, "name", None), str):
            return self.app.tasks[call.name], (), {}, {}
        raise TypeError(f"expected a task or a signature (task.s(...)), got {call!r}")


class UnderTest:
    """The mixin :func:`governed` gives an app's tasks for its block."""

    app: Any
    request: Any

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        gov = _active.get(self.app)
        if gov is None:
            return super().apply(args, kwargs, **options)  # type: ignore[misc]
        return gov.run(self, super().apply, args, kwargs, options)  # type: ignore[misc]

    def before_start(self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        gov = _active.get(self.app)
        if gov is not None and getattr(self.request, "is_eager", False):
            gov.admit(self, task_id, tuple(args), kwargs)
        super().before_start(task_id, args, kwargs)  # type: ignore[misc]


@dataclasses.dataclass(slots=True)
class _Request:
    """What :class:`Calls` reads of a request: its id, where it came from, its headers."""

    id: str
    queue: str | None = None
    retries: int = 0
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def delivery_info(self) -> dict[str, Any]:
        return {} if self.queue is None else {"queue": self.queue, "routing_key": self.queue}


def _denial(
    label: str,
    subject: str,
    d: Decision,
    task: Any,
    task_id: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    now: float,
) -> Denied:
    return Denied(
        label,
        None if d.rule is None else d.rule.text,
        d.retry_after,
        subject=subject,
        task=task.name,
        task_id=task_id,
        args=args,
        kwargs=kwargs,
        blocked=d.blocked,
        capped=d.capped,
        at=now,
    )


def _shown(call: Any) -> str:
    """A call as a test failure names it: ``proj.call_partner('acme')``."""
    from celery.canvas import Signature

    if not isinstance(call, Signature):
        return f"{getattr(call, 'name', call)}()"
    args = [repr(a) for a in call.args or ()]
    args += [f"{k}={v!r}" for k, v in (call.kwargs or {}).items()]
    return f"{call.task}({', '.join(args)})"
