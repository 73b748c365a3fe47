"""Limits with meters as operators see them: Prometheus metrics per meter (reserved, settled,
refunded, overrun, the upstream's charges, spend in dollars), ``governor status`` (usage per
meter, money as dollars, the totals per meter) and the dashboard's JSON."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, Task
from celery.signals import worker_init
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from governor import Prices
from governor.celery import GovernedTask, Governor, metrics, observe, settle
from governor.cli import cli
from governor.embedded import free_port
from support.celery_helpers import Recorder, new_app, worker
from support.servers import ServerHandle

PRICES = Prices({"input_tokens": "2", "output_tokens": "8"})  # dollars per million tokens
LIMIT = {"requests": "100/m", "tokens": "20000/m", "usd_micro": "5000000/d"}


def scrape(port: int) -> list[Sample]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def scrape_until(port: int, done: Callable[[list[Sample]], bool]) -> list[Sample]:
    deadline = time.monotonic() + 10
    while True:
        try:
            samples = scrape(port)
        except OSError:
            samples = []
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


@pytest.fixture
def metrics_at_worker_init() -> Iterator[Callable[[Any, int], None]]:
    receivers: list[Callable[..., None]] = []

    def arm(app: Any, port: int) -> None:
        def start(sender: Any = None, **_: Any) -> None:
            if getattr(sender, "app", None) is app:
                metrics.install(app, port, "127.0.0.1", worker=sender)

        receivers.append(start)
        worker_init.connect(start, weak=False)

    yield arm
    for receiver in receivers:
        worker_init.disconnect(receiver)
    metrics.uninstall()


def spend_app(redis_server: ServerHandle, q: str) -> tuple[Celery, Any, Recorder]:
    app = new_app(redis_server.url(), q)
    Governor(app)
    rec = Recorder(redis_server.url())

    @app.task(
        bind=True,
        base=GovernedTask,
        shared=False,
        name=f"t.chat.{q}",
        governor_limit=LIMIT,
        governor_key=lambda org, **_: org,
        governor_cost=lambda org, prompt_tokens, max_tokens, **_: {
            "requests": 1,
            "tokens": prompt_tokens + max_tokens,
            "usd_micro": PRICES.micro_dollars(
                {"input_tokens": prompt_tokens, "output_tokens": max_tokens}
            ),
        },
    )
    def chat(self: Task, org: str, prompt_tokens: int, max_tokens: int, output: int) -> None:
        settle(
            self,
            tokens=prompt_tokens + output,
            usd_micro=PRICES.micro_dollars(
                {"input_tokens": prompt_tokens, "output_tokens": output}
            ),
        )
        observe(self, {"x-ratelimit-remaining-tokens": "15000", "x-ratelimit-reset-tokens": "6s"})
        rec.add(org=org)

    return app, chat, rec


def test_metrics_count_each_meter_and_the_spend(
    redis_server: ServerHandle, metrics_at_worker_init: Callable[[Any, int], None]
) -> None:
    q = f"mq-{uuid.uuid4().hex[:8]}"
    app, chat, rec = spend_app(redis_server, q)
    port = free_port()
    metrics_at_worker_init(app, port)
    name = f"t.chat.{q}"
    with worker(app, [q], concurrency=1):
        chat.delay("org-a", 1000, 4000, 1000)  # reserves 5000 tokens, $0.034; uses 2000, $0.010
        chat.delay("org-a", 500, 1000, 1500)  # uses more than it reserved: an overrun of 500
        assert len(rec.wait(2, timeout=15)) == 2
        samples = scrape_until(
            port,
            lambda s: (
                value(s, "governor_meter_units_total", kind="settled", meter="tokens") > 0
                and value(s, "governor_meter_units_total", kind="reserved", meter="tokens") >= 6500
            ),
        )
    units = {
        kind: value(samples, "governor_meter_units_total", limit=name, meter="tokens", kind=kind)
        for kind in ("reserved", "settled", "refunded", "overrun")
    }
    assert units == {"reserved": 6500, "settled": 4000, "refunded": 3000, "overrun": 500}
    spend = value(samples, "governor_spend_dollars_total", limit=name, meter="usd_micro")
    assert spend == pytest.approx(0.010 + 0.013)
    # the upstream said 15000 tokens left; after the first call governor counted 18000 free
    assert value(samples, "governor_upstream_synced_units_total", limit=name, meter="tokens") > 0


def test_status_and_the_dashboard_show_meters_and_money(redis_server: ServerHandle) -> None:
    q = f"sq-{uuid.uuid4().hex[:8]}"
    app, chat, rec = spend_app(redis_server, q)
    with worker(app, [q], concurrency=1):
        chat.delay("org-a", 1000, 4000, 1000)
        assert len(rec.wait(1, timeout=15)) == 1
    runner = CliRunner()
    result = runner.invoke(cli, ["status"], obj=app, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "tokens 20000/m" in out and "usd_micro 5000000/d" in out
    assert "$0.01/$5.00" in out  # org-a spent $0.010 of its $5 a day
    assert "tokens: reserved 5,000, settled 2,000, refunded 3,000, overrun 0" in out
    result = runner.invoke(cli, ["status", "--json"], obj=app, catch_exceptions=False)
    data = json.loads(result.output)
    (limit,) = [x for x in data["limits"] if x["label"] == f"t.chat.{q}"]
    assert limit["meters"]["usd_micro"] == ["5000000/d"]
    assert limit["meter_totals"]["usd_micro"]["settled"] == 10_000
    rows = {r["meter"]: r for r in limit["subjects"][0]["rules"]}
    assert rows["usd_micro"]["used_text"] == "$0.01/$5.00"
