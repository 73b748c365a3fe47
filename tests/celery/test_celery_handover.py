"""Publishing a hand-over (governor/celery/waiting/handover.py): a message the broker refuses is
known not to be out, so it is parked for the releasers (a sweep never publishes a hand-over
again: that made copies of messages that were only late, issue 18 finding 1); one that cannot be
read leaves the line at once when its cap is known, else its hand-over lapses (finding 2)."""

from __future__ import annotations

import socket
import uuid

from celery import Celery

from governor import Limiter
from governor.celery import Governor
from governor.celery.types import HEADER, handed_by
from governor.celery.waiting import parking
from governor.celery.waiting.envelope import envelope, open_envelope
from support.servers import ServerHandle


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_hand_over_the_broker_refuses_is_parked(redis_server: ServerHandle) -> None:
    app = Celery(f"test-{uuid.uuid4().hex[:8]}", broker=f"redis://127.0.0.1:{closed_port()}/0")
    app.conf.update(
        governor_redis_url=redis_server.url(2),
        governor_prefix=f"gt{uuid.uuid4().hex[:8]}",
        task_publish_retry=False,
        broker_connection_retry=False,
        broker_connection_timeout=0.5,
    )

    @app.task(name="handover.export")
    def export(n: int) -> int:
        return n

    gate = Governor(app).gate
    sig = export.s(7).set(task_id="t-1", headers={HEADER: {"waits": 1}})
    message = envelope(app, dict(sig), 0.0, "task:handover.export")
    cap = Limiter(gate.client, None, concurrency=1, name="task", prefix=gate.settings.prefix)
    handed = handed_by(cap, "handover.export", [("t-1:0", message), ("t-2:0", "not an envelope")])
    assert gate.handover.publish(handed) == 1
    client, prefix = gate.client, gate.settings.prefix
    assert parking.parked_count(client, prefix) == 1
    _now, taken = parking.take_due(client, prefix, 5.0, 10.0, 10)
    ((parked_id, text),) = taken
    parked, _due, _env = open_envelope(app, text)
    carried = parked.options["headers"][HEADER]
    assert parked.id == "t-1" and list(parked.args) == [7]
    assert carried["parked"] == parked_id and carried["waits"] == 1 and carried["woken"]
