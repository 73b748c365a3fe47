"""Faults under a governed backlog: tasks lost, run twice, starts against the limit, gaps.

Faults of the governor's Redis, of worker nodes and of the broker connection: tasks lost, run
twice, the most starts in a second against the limit, and how long decisions stopped.

    python -m bench.faults                 # a few minutes
    python -m bench.faults --only failover
    python -m bench.faults --only node-kill

The scenarios live in tests/support/faults.py (faults of the governor's Redis) and
tests/support/faults_nodes.py (a worker node killed, the broker connection dropping);
tests/nodes/test_faults.py and tests/nodes/test_faults_nodes.py run some of them. 40 no-op
tasks under 10/s on 2 worker nodes x 2 prefork processes, waits over 1 s parked in Redis, the fault
1.5 s after publishing.
"""

from __future__ import annotations

import argparse

from bench.common import table
from governor.embedded import EmbeddedRedis
from tests.support import faults, faults_nodes
from tests.support.faults import HEADER

SCENARIOS = {**faults.SCENARIOS, **faults_nodes.SCENARIOS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    rows = []
    with EmbeddedRedis() as broker:
        for name, scenario in SCENARIOS.items():
            if args.only and args.only != name:
                continue
            out = scenario(broker.url(1), broker.url(3))
            print(out, flush=True)
            rows.append(out.row())
    print()
    print(table(HEADER, rows))


if __name__ == "__main__":
    main()
