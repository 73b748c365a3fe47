"""Faults of the governor's Redis under a governed backlog on two worker nodes (see
tests/support/faults.py): it hangs longer than the socket timeout, it is SIGKILLed and restarted
with its append-only file, Sentinel fails over (asked, or the master SIGKILLed) while tasks are
parked, and a Redis Cluster master holding parked tasks is SIGKILLed (its replica takes over).
No task is lost or run twice, fail mode "closed" runs nothing ungoverned (the limit holds),
decisions resume. A cluster replica that lags when the limit's master dies lets the limit
overshoot by at most the admissions it lost, and that overshoot is measured."""

from __future__ import annotations

import pytest

from support.faults import HEADER, RULE, SCENARIOS, TASKS, Outcome
from support.servers import ServerHandle

pytestmark = pytest.mark.worker


def _show(out: Outcome) -> None:
    print("\n" + " | ".join(HEADER) + "\n" + " | ".join(str(c) for c in out.row()))


@pytest.mark.parametrize("fault", ["hang", "crash", "failover", "failover-kill", "cluster-kill"])
def test_no_task_is_lost_or_run_twice(redis_server: ServerHandle, fault: str) -> None:
    out = SCENARIOS[fault](redis_server.url(1), redis_server.url(3))
    _show(out)
    assert (out.done, out.lost, out.twice) == (TASKS, 0, 0)
    # never more than the limit; after a failover at most what the replication lag admitted
    failover = fault.startswith(("failover", "cluster"))
    assert out.most <= RULE + (2 if failover else 0)
    assert out.gap < 10.0  # decisions resumed
    if fault == "cluster-kill":  # the killed master held parked tasks, not the limit
        assert out.failover is not None and out.failover.parked > 0
        # the other masters' parked tasks keep being released and claimed while it fails over
        # (about 2.5 s): measured 0.8-1.1 s; 2.2-3.2 s when a claim sat in redis-py's retries
        # and one shard's error stopped every release (see governor/redis_target.py, parking);
        # the bound leaves room for a loaded machine, the README has the figures
        assert out.gap < 3.5


def test_a_lagging_replica_overshoots_at_most_what_it_lost(redis_server: ServerHandle) -> None:
    out = SCENARIOS["cluster-kill-lag"](redis_server.url(1), redis_server.url(3))
    _show(out)
    assert (out.done, out.lost, out.twice) == (TASKS, 0, 0)  # parked tasks were elsewhere
    assert out.failover is not None and out.failover.writes > 0  # the lag was real
    assert out.most - RULE <= out.failover.ahead <= out.failover.writes
    assert out.gap < 10.0
