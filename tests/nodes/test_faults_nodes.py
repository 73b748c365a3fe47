"""Faults of worker nodes and of the broker connection under a governed backlog (see
tests/support/faults_nodes.py): a node SIGKILLed mid-backlog, the broker connection dropping for 3 s
as a worker re-publishes a deferred task or acknowledges one. No task is lost or run twice,
the limit holds, decisions resume."""

from __future__ import annotations

import pytest

from support.faults import HEADER, RULE, TASKS
from support.faults_nodes import SCENARIOS
from support.servers import ServerHandle

pytestmark = pytest.mark.worker

HIT = {
    "node-kill": "",
    "broker-drop-publish": "re-publish failed",
    "broker-drop-ack": "redelivery dropped",
}
"""What the row's note must show the fault hit (a re-publish failing, a lost acknowledgement's
redelivery dropped). A node killed holding a release lease (``releaser-kill`` in
bench/faults.py) is tested in tests/nodes/test_celery_nodes.py."""


@pytest.mark.parametrize("fault", list(HIT))
def test_no_task_is_lost_or_run_twice(redis_server: ServerHandle, fault: str) -> None:
    out = SCENARIOS[fault](redis_server.url(1), redis_server.url(3))
    print("\n" + " | ".join(HEADER) + "\n" + " | ".join(str(c) for c in out.row()))
    assert (out.done, out.lost, out.twice) == (TASKS, 0, 0), out
    assert out.most <= RULE, out  # never more than the limit
    assert out.gap < 10.0, out  # decisions resumed
    assert HIT[fault] in out.note and not out.note.startswith("0 "), out
