"""Prometheus metrics (governor.celery.metrics) scraped over HTTP from real workers: an
in-process threads worker, and `celery worker -P prefork` processes
(tests/support/metrics_app.py)."""

from __future__ import annotations

import glob
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Task
from celery.signals import worker_init
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from governor import Limiter
from governor.celery import Governor, metrics, signals
from governor.embedded import free_port
from support.celery_helpers import Recorder, new_app, wait_for, worker
from support.servers import ServerHandle

HERE = Path(__file__).resolve().parents[1] / "support"


def queue_name() -> str:
    return f"mq-{uuid.uuid4().hex[:8]}"


def scrape(port: int) -> list[Sample]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def scrape_until(
    port: int, done: Callable[[list[Sample]], bool], timeout: float = 10.0
) -> list[Sample]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            samples = scrape(port)
        except OSError:
            samples = []
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def waits_of(task: Task) -> int:
    return int(((task.request.headers or {}).get("governor") or {}).get("waits", 0))


@pytest.fixture
def installed_at_worker_init() -> Iterator[Callable[[Any, int | None], None]]:
    """Install the metrics when a worker for ``app`` starts (as the setting will), then undo."""
    receivers: list[Callable[..., None]] = []

    def arm(app: Any, port: int | None) -> None:
        def start(sender: Any = None, **_: Any) -> None:
            if getattr(sender, "app", None) is app:
                metrics.install(app, port, "127.0.0.1", worker=sender)

        receivers.append(start)
        worker_init.connect(start, weak=False)

    yield arm
    for receiver in receivers:
        worker_init.disconnect(receiver)
    metrics.uninstall()


# -- one process: the threads pool -----------------------------------------------------------


def test_threads_worker_counts_admissions_and_deferrals(
    redis_server: ServerHandle,
    failures: list[BaseException],
    installed_at_worker_init: Callable[[Any, int | None], None],
) -> None:
    q = queue_name()
    partner = f"partner-{uuid.uuid4().hex[:6]}"
    app = new_app(redis_server.url(), q, governor_queues={q: "3/s"})
    governor = Governor(app)
    rec = Recorder(redis_server.url())
    port = free_port()
    installed_at_worker_init(app, port)

    @app.task(bind=True, shared=False)
    def job(self: Task, n: int) -> None:
        rec.add(kind="job", n=n, waits=waits_of(self))

    @governor.task(
        "1/s", key=lambda customer, **_: customer, limit_name=partner, bind=True, shared=False
    )
    def call_partner(self: Task, customer: str, n: int) -> None:
        rec.add(kind="partner", n=n, waits=waits_of(self))

    with worker(app, [q], concurrency=4, pool="threads"):
        assert metrics.installed()
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import REGISTRY

            assert metrics.registry() is REGISTRY  # threads: one process, no multiprocess files
        for n in range(6):
            job.delay(n)
        for n in range(3):
            call_partner.delay("acme", n)
        runs = rec.wait(9, timeout=15)
        assert len(runs) == 9, runs
        samples = scrape_until(
            port, lambda s: value(s, "governor_admitted_total", limit=f"queue:{q}") >= 9
        )

    waited = [r for r in runs if r["waits"] > 0]
    total_waits = sum(r["waits"] for r in runs)
    assert waited, "the burst should have made some calls wait"
    assert value(samples, "governor_admitted_total", limit=f"queue:{q}") == 9
    assert value(samples, "governor_admitted_total", limit=partner) == 3
    deferred = value(samples, "governor_deferred_total", limit=f"queue:{q}") + value(
        samples, "governor_deferred_total", limit=partner
    )
    assert deferred == total_waits >= len(waited)
    # (a call both limits deny is deferred under the one with the longer wait)
    for s in samples:
        if s.name == "governor_deferred_total" and s.value:
            assert s.labels["limit"] in (f"queue:{q}", partner)
            assert s.labels["booked"] == "true"  # sliding_log books
            assert s.labels["rule"] == {f"queue:{q}": "3/s", partner: "1/s"}[s.labels["limit"]]
    limits = (f"queue:{q}", partner)
    count = sum(value(samples, "governor_delay_seconds_count", limit=lim) for lim in limits)
    assert count == deferred
    for lim in limits:
        buckets = [
            s.value
            for s in samples
            if s.name == "governor_delay_seconds_bucket" and s.labels["limit"] == lim
        ]
        assert buckets == sorted(buckets)  # cumulative
        assert value(samples, "governor_delay_seconds_bucket", limit=lim, le="+Inf") == value(
            samples, "governor_delay_seconds_count", limit=lim
        )
    delays = sum(value(samples, "governor_delay_seconds_sum", limit=lim) for lim in limits)
    # nine calls under 3/s (and 1/s for the partner's three): every wait is a few seconds at
    # most, also for a task that missed its slot on a loaded machine and re-booked behind the rest
    assert 0 < delays <= 5 * count
    les = {s.labels["le"] for s in samples if s.name == "governor_delay_seconds_bucket"}
    assert {"0.001", "1.0", "3600.0", "86400.0", "+Inf"} <= les
    # every call that waited started on its booking: how late is measured once for each
    assert value(samples, "governor_lateness_seconds_count") == len(waited)
    assert not failures, failures  # deferrals are not task failures


def test_deferrals_name_the_rule_or_the_block(
    redis_server: ServerHandle,
    installed_at_worker_init: Callable[[Any, int | None], None],
) -> None:
    q = queue_name()
    partner = f"partner-{uuid.uuid4().hex[:6]}"
    app = new_app(redis_server.url(), q, governor_queues={q: "2/s"})
    governor = Governor(app)
    rec = Recorder(redis_server.url())
    port = free_port()
    installed_at_worker_init(app, port)

    @app.task(shared=False)
    def job(n: int) -> None:
        rec.add(n=n)

    @governor.task("5/s", key=lambda customer, **_: customer, limit_name=partner, shared=False)
    def call_partner(customer: str) -> None:
        rec.add(customer=customer)

    Limiter(
        redis.Redis.from_url(app.conf.governor_redis_url),
        "5/s",
        name=partner,
        prefix=app.conf.governor_prefix,
    ).block("acme", 60, "maintenance")
    with worker(app, [q], concurrency=4):
        for n in range(4):
            job.delay(n)
        assert len(rec.wait(4, timeout=10)) == 4
        call_partner.delay("acme")
        samples = scrape_until(
            port, lambda s: value(s, "governor_deferred_total", limit=partner) >= 1
        )
    rules = {
        (s.labels["limit"], s.labels["rule"])
        for s in samples
        if s.name == "governor_deferred_total" and s.value
    }
    assert rules == {(f"queue:{q}", "2/s"), (partner, "blocked")}


def test_signals_without_a_worker_yet_and_the_parked_gauge(
    redis_server: ServerHandle,
    installed_at_worker_init: Callable[[Any, int | None], None],
) -> None:
    """Parking and releasing have no sender in the gate yet: the signals are sent as the
    releaser will send them. Receivers never raise into the sender."""
    q = queue_name()
    app = new_app(redis_server.url(), q)
    Governor(app)
    port = free_port()
    installed_at_worker_init(app, port)
    with worker(app, [q], concurrency=1, pool="solo"):
        other = free_port()
        metrics.install(app, other)  # a second call changes nothing
        with pytest.raises(OSError):
            scrape(other)
        metrics.watch_parked(lambda: 7)
        request = type("Request", (), {"delivery_info": {"routing_key": q}})()
        for _ in range(2):
            signals.task_parked.send(sender=None, request=request, due=time.time() + 60)
        signals.task_released.send(sender=None, count=5, queue=q)
        responses = signals.task_deferred.send(
            sender=None, request=None, limit=f"queue:{q}", rule=None, delay="soon", booked=False,
            blocked="maintenance",
        )  # fmt: skip
        assert [r for _, r in responses if r is not None] == []
        samples = scrape(port)
        assert value(samples, "governor_parked_tasks") == 7
        metrics.watch_parked(None)
        metrics.set_parked(3)
        later = scrape(port)
    assert value(samples, "governor_parked_total", queue=q) == 2
    assert value(samples, "governor_released_total", queue=q) == 5
    # the bad delay was not observed, but the deferral was counted, as blocked
    assert value(samples, "governor_deferred_total", limit=f"queue:{q}", rule="blocked") == 1
    assert value(samples, "governor_delay_seconds_count", limit=f"queue:{q}") == 0
    assert value(later, "governor_parked_tasks") == 3


def test_a_busy_port_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:
            with caplog.at_level(logging.ERROR, logger="governor.celery.metrics"):
                metrics.install(object(), port, "127.0.0.1", multiprocess=False)
            assert metrics.installed()
            signals.task_admitted.send(sender=None, request=None, limits=["queue:x"], waits=0)
        finally:
            metrics.uninstall()
    assert f"cannot serve metrics on 127.0.0.1:{port}" in caplog.text


@pytest.mark.skipif(
    bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR")), reason="multiprocess mode set by the user"
)
def test_multiprocess_mode_in_process_and_back() -> None:
    from prometheus_client import values

    before = values.ValueClass
    port = free_port()
    metrics.install(object(), port, "127.0.0.1", multiprocess=True)
    try:
        directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
        assert os.path.basename(directory).startswith(f"governor-metrics-{os.getpid()}-")
        signals.task_admitted.send(sender=None, request=None, limits=["queue:mp"], waits=0)
        assert glob.glob(os.path.join(directory, f"counter_{os.getpid()}.db"))
        assert value(scrape(port), "governor_admitted_total", limit="queue:mp") == 1
    finally:
        metrics.uninstall()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ and not os.path.exists(directory)
    assert values.ValueClass is before


def test_storage_unavailable_is_counted(
    redis_server: ServerHandle,
    failures: list[BaseException],
    installed_at_worker_init: Callable[[Any, int | None], None],
) -> None:
    q = queue_name()
    app = new_app(
        redis_server.url(),
        q,
        governor_queues={q: "5/s"},
        governor_redis_url=f"redis://127.0.0.1:{free_port()}/0",  # nobody listens there
        governor_fail_mode="open",
        governor_socket_timeout=0.2,
    )
    Governor(app)
    rec = Recorder(redis_server.url())
    port = free_port()
    installed_at_worker_init(app, port)

    @app.task(shared=False)
    def job() -> None:
        rec.add(ran=True)

    with worker(app, [q], concurrency=1):
        job.delay()
        assert len(rec.wait(1, timeout=10)) == 1  # fail open: it ran, ungoverned
        samples = scrape_until(port, lambda s: value(s, "governor_storage_unavailable_total") >= 1)
    assert value(samples, "governor_storage_unavailable_total", fail_mode="open") == 1
    assert value(samples, "governor_admitted_total", limit=f"queue:{q}") == 0
    assert not failures


# -- processes: the prefork pool -------------------------------------------------------------


class PreforkWorker:
    """`celery -A metrics_app worker -P prefork -c 2` in its own process group."""

    def __init__(self, redis_server: ServerHandle, env: dict[str, str], logs: Path) -> None:
        self.key = f"gm{uuid.uuid4().hex[:10]}"
        self.queue = queue_name()
        self.port = free_port()
        self.record = redis.Redis.from_url(redis_server.url(3))
        self.log = logs / f"{self.key}.log"
        inherited = {k: v for k, v in os.environ.items() if k.upper() != "PROMETHEUS_MULTIPROC_DIR"}
        self.env = {
            **inherited,
            **env,
            "GM_BROKER": redis_server.url(1),
            "GM_STORE": redis_server.url(2),
            "GM_RECORD": redis_server.url(3),
            "GM_KEY": self.key,
            "GM_QUEUE": self.queue,
            "GM_RULES": "4/s",
            "GM_PORT": str(self.port),
            "GM_PREFIX": self.key,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        args = (
            f"-m celery -A metrics_app worker -P prefork -c 2 -Q {self.queue} -n {self.key}@%h "
            "--without-gossip --without-mingle --without-heartbeat --loglevel INFO"
        ).split()
        proc = self.proc = subprocess.Popen(
            [sys.executable, *args, *extra],
            cwd=HERE,
            env=self.env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                scrape(self.port)  # the port is up: install ran, in worker_init
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"no metrics port; worker log:\n{self.text()[-3000:]}")

    def publish(self, count: int) -> None:
        app = new_app(self.env["GM_BROKER"], self.queue)
        with app.producer_or_acquire() as producer:
            for n in range(count):
                app.send_task("metrics_app.job", (n,), queue=self.queue, producer=producer)

    def runs(self, count: int, timeout: float) -> list[dict[str, Any]]:
        wait_for(lambda: self.record.llen(f"{self.key}:runs"), lambda n: n >= count, timeout, 0.05)
        return [json.loads(x) for x in self.record.lrange(f"{self.key}:runs", 0, -1)]

    def failures(self) -> list[Any]:
        return [json.loads(x) for x in self.record.lrange(f"{self.key}:failures", 0, -1)]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # warm shutdown of the main process
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.mark.worker
@pytest.mark.parametrize("own_dir", [False, True], ids=["governor-dir", "user-dir"])
def test_prefork_worker_sums_its_pool_processes(
    redis_server: ServerHandle, tmp_path: Path, own_dir: bool
) -> None:
    user_dir = tmp_path / "prometheus"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(user_dir)} if own_dir else {}
    w = PreforkWorker(redis_server, env, tmp_path)
    total = 10
    try:
        # pool processes are replaced after 3 tasks (deferrals count): the sums must survive
        w.start("--max-tasks-per-child", "3")
        assert w.proc is not None
        main_pid = w.proc.pid
        made = glob.glob(os.path.join(tempfile.gettempdir(), f"governor-metrics-{main_pid}-*"))
        assert len(made) == (0 if own_dir else 1), made
        w.publish(total)
        runs = w.runs(total, timeout=20)
        assert len(runs) == total, f"{len(runs)} of {total} ran\n{w.text()[-3000:]}"
        label = f"queue:{w.queue}"
        samples = scrape_until(
            w.port, lambda s: value(s, "governor_admitted_total", limit=label) >= total
        )
        assert not w.failures(), w.failures()
    finally:
        w.stop()

    pids = {r["pid"] for r in runs}
    assert main_pid not in pids and len(pids) >= 2, pids  # counted in pool processes
    waited = [r for r in runs if r["waits"] > 0]
    total_waits = sum(r["waits"] for r in runs)
    assert waited, "10 calls at once under 4/s: some must have waited"
    assert value(samples, "governor_admitted_total", limit=label) == total
    deferred = value(samples, "governor_deferred_total", limit=label)
    assert deferred == total_waits >= len(waited)
    booked = value(samples, "governor_deferred_total", limit=label, booked="true")
    assert booked == deferred  # sliding_log books every wait
    assert value(samples, "governor_deferred_total", limit=label, rule="4/s") == deferred
    assert value(samples, "governor_delay_seconds_count", limit=label) == deferred
    assert value(samples, "governor_delay_seconds_bucket", limit=label, le="+Inf") == deferred
    assert 0 < value(samples, "governor_delay_seconds_sum", limit=label) <= 4 * deferred
    assert value(samples, "governor_lateness_seconds_count") == len(waited)
    assert "governor_parked_tasks" in {s.name for s in samples}
    if own_dir:  # the user's directory is used and left alone
        files = sorted(p.name for p in user_dir.glob("counter_*.db"))
        assert len(files) >= 2, files
        assert user_dir.is_dir()
    else:  # governor's own directory goes with the worker
        assert made and not os.path.exists(made[0]), made
