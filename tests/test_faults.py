"""Faults of the governor's Redis under a governed backlog on two worker nodes (see
tests/faults.py): it hangs longer than the socket timeout, it is SIGKILLed and restarted with
its append-only file, and Sentinel fails over (asked, or the master SIGKILLed) while tasks are
parked. No task is lost or run
twice, fail mode "closed" runs nothing ungoverned (the limit holds), decisions resume."""

from __future__ import annotations

import pytest
from faults import HEADER, RULE, SCENARIOS, TASKS

from conftest import ServerHandle

pytestmark = pytest.mark.worker


@pytest.mark.parametrize("fault", ["hang", "crash", "failover", "failover-kill"])
def test_no_task_is_lost_or_run_twice(redis_server: ServerHandle, fault: str) -> None:
    out = SCENARIOS[fault](redis_server.url(1), redis_server.url(3))
    print("\n" + " | ".join(HEADER) + "\n" + " | ".join(str(c) for c in out.row()))
    assert (out.done, out.lost, out.twice) == (TASKS, 0, 0)
    # never more than the limit; after a failover at most what the replication lag admitted
    assert out.most <= RULE + (2 if fault.startswith("failover") else 0)
    assert out.gap < 10.0  # decisions resumed
