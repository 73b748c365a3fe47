"""The Celery internals governor relies on, checked where the rest of the suite only sees their
effect; part of the versions matrix (noxfile.py, the ``compat`` marker).

A message known to be denied is deferred in the worker's main process before it reaches the
pool: governor's request class wraps the ``execute_using_pool`` that Celery's per-task request
subclass (``create_request_cls``) defines, and leaves Celery's dispatch by raising
``TaskRevokedError`` (``_skip_pool``), which ``WorkController._process_task`` catches, giving the
prefork pool's semaphore slot back. A Celery version that stopped defining that method, or
stopped catching that error, would send every denial through the pool (the first test fails)
or stall a prefork worker after its first early deferral (the second test fails). And on
kombu < 5.7 a threads worker's loop needs governor's tick (governor/celery/hub_tick.py) to send
the acknowledgements its pool threads queue.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from celery import current_task

from governor.celery import Governor, signals
from governor.celery.admission.early import HINT_TTL
from governor.celery.hub_tick import needs_tick
from support.celery_helpers import Recorder, most_in_window, new_app, wait_for, worker
from support.servers import ServerHandle

pytestmark = pytest.mark.compat


def test_known_denials_are_deferred_before_the_pool(redis_server: ServerHandle) -> None:
    """Under "4/m", four run; four more sent then are known denied: the worker's main thread
    defers them (outside Celery's tracer) before the pool sees them."""
    q = f"cp-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q, governor_queues={q: "4/m"})
    Governor(app)
    rec = Recorder(redis_server.url())
    where: list[str] = []

    def deferred(**_: Any) -> None:
        # a pool thread runs the gate inside Celery's tracer, with the task on its stack
        where.append("pool" if current_task else "main")

    @app.task(shared=False)
    def job(n: int) -> None:
        rec.add(n=n)

    signals.task_deferred.connect(deferred, weak=False)
    try:
        with worker(app, [q], concurrency=1):
            for n in range(4):
                job.delay(n)
            seen = rec.wait(4, timeout=15)
            # the main process trusts a peek that found room for HINT_TTL: messages that came
            # sooner would go to the pool (and did, once in four runs of the matrix)
            time.sleep(2 * HINT_TTL)
            for n in range(4, 8):
                job.delay(n)
            wait_for(lambda: list(where), lambda w: len(w) >= 4, timeout=15)
    finally:
        signals.task_deferred.disconnect(deferred)
    assert sorted(r["n"] for r in seen) == list(range(4))
    assert where == ["main"] * 4, where


@pytest.mark.worker
def test_early_deferrals_give_the_prefork_pool_its_slot_back(
    nodes_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One prefork node with ONE pool process: after a prefetched backlog's first four run,
    the rest are deferred early (the DEBUG log names the process: MainProcess) and all run."""
    monkeypatch.setenv("GT_LOGLEVEL", "DEBUG")
    queue = f"cp-{uuid.uuid4().hex[:6]}"
    nodes = nodes_factory({queue: "4/s"})
    nodes.start(1, concurrency=1, queues=[queue])
    nodes.publish(queue, 16)
    runs = nodes.wait_runs(16, timeout=30)
    log = nodes.log_text()
    assert not nodes.failures(), nodes.failures()[:3]
    assert sorted(r["n"] for r in runs) == list(range(16)), log[-3000:]
    assert most_in_window(sorted(r["t"] for r in runs), 1.0) <= 4 + 1
    assert re.search(r"/MainProcess\] governor: \S+ deferred", log), log[-3000:]


def test_held_acknowledgements_do_not_stall_a_threads_worker(redis_server: ServerHandle) -> None:
    """A governed message's ack is held until its body ends, then queued on the worker's loop
    by a pool thread; with prefetch 1 the next message comes once the loop has sent it. kombu
    < 5.7 does not wake the loop for it (up to 10 s a message): governor's hub tick does."""
    q = f"cp-{uuid.uuid4().hex[:8]}"
    app = new_app(redis_server.url(), q, governor_queues={q: "100/s"}, worker_prefetch_multiplier=1)
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(shared=False)
    def job(n: int) -> None:
        rec.add(n=n)

    with worker(app, [q], concurrency=1):
        for n in range(8):
            job.delay(n)
        seen = rec.wait(8, timeout=10)
    assert sorted(r["n"] for r in seen) == list(range(8))


def test_the_tick_is_for_the_threads_pool_on_a_hub_without_a_waker() -> None:
    from celery.concurrency import prefork, solo, thread

    class OldHub: ...

    class NewHub:
        def _create_waker(self) -> None: ...

    assert needs_tick(thread.TaskPool, OldHub)
    assert not needs_tick(thread.TaskPool, NewHub)
    assert not needs_tick(prefork.TaskPool, OldHub) and not needs_tick(solo.TaskPool, OldHub)


def test_every_governed_app_in_a_process_gets_its_worker_setup(redis_server: ServerHandle) -> None:
    """Celery < 5.7 keys a signal receiver that is a bound method by its function alone: the
    worker_init of a second Governor in the process was dropped (its worker ran ungoverned)."""
    from governor.celery.request import GovernedRequestMixin

    apps = [new_app(redis_server.url(), f"cp-{uuid.uuid4().hex[:8]}") for _ in range(2)]
    jobs = []

    def job() -> None: ...

    for app in apps:
        Governor(app)
        app.conf.governor_queues = {app.conf.task_default_queue: "5/s"}
        jobs.append(app.task(shared=False, name=f"{app.main}.job")(job))
    for app, job in zip(apps, jobs):
        with worker(app, [app.conf.task_default_queue]):
            assert issubclass(app.tasks[job.name].Request, GovernedRequestMixin), app.main


def test_a_cluster_refuses_redis_py_without_cluster_transactions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-py < 6.1 refuses transactions on a RedisCluster, which parked tasks and live
    limits run: governor_redis_cluster (and --cluster) say so when the settings are read."""
    import redis

    from governor import ConfigError
    from governor.connect import cluster_supported, target

    for version, supported in [
        ("5.3.1", False),
        ("6.0.0", False),
        ("6.1.0", True),
        ("8.1.0", True),
    ]:
        monkeypatch.setattr(redis, "__version__", version)
        assert cluster_supported() is supported
    monkeypatch.setattr(redis, "__version__", "6.0.0")
    with pytest.raises(ConfigError, match=r"needs redis-py 6\.1 or later .* this is redis-py 6\.0"):
        target("redis://h1:7000,h2:7000", cluster=True)


def test_late_receivers_of_two_instances_both_hear_the_tracers_signal() -> None:
    """``receive_late``: the same bound method of two instances is two receivers (Celery < 5.7
    keys a bound method by its function alone), and a list replaced by clearing a dead weak
    receiver is the one the tracer read when it was built (Celery < 5.7 replaces it)."""
    import gc

    from celery.utils.dispatch import Signal

    from governor.celery.patches import receive_late

    signal = Signal(name="governor_test_postrun")
    tracers_list = signal.receivers  # what build_tracer keeps

    class Hearer:
        def __init__(self) -> None:
            self.heard = 0

        def done(self, **_: Any) -> None:
            self.heard += 1

    def weak_receiver(**_: Any) -> None:
        pass

    signal.connect(weak_receiver)  # weak: dies below, and the next connect clears it
    del weak_receiver
    gc.collect()
    first, second = Hearer(), Hearer()
    receive_late(signal, first.done, f"test.{id(first)}")
    receive_late(signal, second.done, f"test.{id(second)}")
    assert signal.receivers is tracers_list and len(tracers_list) == 2
    signal.send(sender=None)
    assert (first.heard, second.heard) == (1, 1)
