"""``python -m workers.showcase`` (the example apps under load, and the docs' pictures taken from
them), and what it added to the examples: the partner-API example calling a real HTTP partner
(``PARTNER_API_URL``) whose 429 pauses one customer on every worker.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from celery import Celery
from test_workers import ROOT, _example_worker, store_client

from governor import Limiter
from governor.connect import close_client
from support.celery_helpers import wait_for
from support.servers import ServerHandle
from workers.showcase.partner import Partner
from workers.showcase.pictures import browser_missing

PICTURES = {
    "dashboard.png",
    "dashboard-limit.png",
    "dashboard-inspect.png",
    "dashboard-cap.png",
    "dashboard-writes.png",
    "dashboard-redis-down.png",
}


def processes_naming(*needles: str) -> list[int]:
    """Pids of the processes whose command line or environment holds one of ``needles``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if any(n.encode() in text for n in needles):
            found.append(int(entry.name))
    return found


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])  # type: ignore[return-value]


@pytest.mark.worker
def test_a_429_from_the_partner_pauses_that_customer_only(redis_server: ServerHandle) -> None:
    """A real worker node of workers.app calls a local partner that refuses globex after 3
    calls: globex is paused by upstream (its Retry-After), acme's calls all go through."""
    partner = Partner({"globex": 3}, retry_after=600).start()
    names = {
        "queue": f"ex-{uuid.uuid4().hex[:8]}",
        "prefix": f"gt{uuid.uuid4().hex[:10]}",
        "broker": redis_server.url(1),
        "store": redis_server.url(2),
        "results": redis_server.url(3),
        "master": "",
    }
    worker = _example_worker(names, {"PARTNER_API_URL": partner.url})
    node = next(worker)
    producer = Celery("producer", broker=names["broker"], set_as_current=False)
    try:
        with producer.producer_or_acquire() as conn:
            for n in range(6):
                for customer in ("acme", "globex"):
                    producer.send_task(
                        "workers.partner_api.call_partner",
                        (customer, {"n": n}),
                        queue=names["queue"],
                        producer=conn,
                    )
        done = wait_for(lambda: partner.count("acme"), lambda n: n == 6, timeout=60)
        refused = wait_for(lambda: partner.count("globex", 429), bool, timeout=60)
        log = Path(node["log"]).read_text(errors="replace")[-3000:]
        assert done == 6 and refused >= 1, log
        store = store_client(node)
        usage = Limiter(store, "5/s, 200/h", name="partner-api", prefix=names["prefix"])
        globex, acme = usage.usage("globex"), usage.usage("acme")
        close_client(store)
        assert globex.paused and "HTTP 429" in (globex.blocked or ""), globex
        assert 500 < globex.blocked_for <= 600  # the partner's Retry-After, on Redis's clock
        assert acme.blocked is None
        assert partner.count("globex", 200) == 3
        assert partner.count("globex", 429) <= 2  # at most the calls in flight (-c 2) meet it
    finally:
        producer.close()
        worker.close()  # stops the node
        partner.close()


@pytest.mark.worker
@pytest.mark.slow
@pytest.mark.skipif(bool(browser_missing()), reason=browser_missing() or "")
def test_the_showcase_takes_the_pictures_and_stops_everything(tmp_path: Path) -> None:
    """The whole tool, as docs/development.md runs it (without the demo's report): every
    picture taken, the width of a page, and nothing left running."""
    proc = subprocess.run(
        [sys.executable, "-m", "workers.showcase", "--screenshots", str(tmp_path), "--no-demo"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert {p.name for p in tmp_path.iterdir()} == PICTURES, proc.stderr[-3000:]
    for name in PICTURES:
        width, height = png_size(tmp_path / name)
        assert width == 1280 and height >= 700, (name, width, height)
    assert png_size(tmp_path / "dashboard.png")[1] > 900  # the whole page, taller than a window
    for line in ("governor limits set partner-api", "governor block partner-api initech"):
        assert line in proc.stderr
    # nothing it started is left: Redis, worker nodes and dashboards all name its Redis's port
    port = re.search(r"Redis on redis://127\.0\.0\.1:(\d+)/", proc.stderr)
    assert port, proc.stderr[:2000]
    assert processes_naming(f"127.0.0.1:{port[1]}/", f"--port\0{port[1]}\0") == []
