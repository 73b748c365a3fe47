"""Faults under a governed backlog: tasks lost, run twice, starts against the limit, gaps.

Faults of the governor's Redis, of worker nodes and of the broker connection: tasks lost, run
twice, the most starts in a second against the limit, and how long decisions stopped.

    python bench/faults.py                 # a few minutes
    python bench/faults.py --only failover
    python bench/faults.py --only node-kill

The scenarios live in tests/faults.py (faults of the governor's Redis) and
tests/faults_nodes.py (a worker node killed, the broker connection dropping);
tests/test_faults.py and tests/test_faults_nodes.py run some of them. 40 no-op tasks under
10/s on 2 worker nodes x 2 prefork processes, waits over 1 s parked in Redis, the fault
1.5 s after publishing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import faults
import faults_nodes
from faults import HEADER

from common import table
from governor.embedded import EmbeddedRedis

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
