"""The example Celery app, configured from the environment.

=======================  =====================================================================
variable                 meaning (default)
=======================  =====================================================================
``BROKER_URL``           Celery's broker (``redis://localhost:6379/0``)
``GOVERNOR_REDIS_URL``   Redis holding governor's counters (``redis://localhost:6379/1``);
                         the ``governor`` command reads the same variable
``GOVERNOR_PREFIX``      key prefix of governor's counters (``governor``)
``GOVERNOR_SENTINEL_     the URLs are Sentinel URLs (``sentinel://h1:26379;sentinel://h2:26379``)
MASTER``                 and this is the master's name, for governor's Redis and, when
                         ``BROKER_URL`` is a Sentinel URL too, for the broker (unset)
``GOVERNOR_REDIS_        ``1``: ``GOVERNOR_REDIS_URL`` lists a Redis Cluster's nodes
CLUSTER``                (``redis://h1:7000,h2:7000``) (unset)
=======================  =====================================================================

The ``governor`` command reads the same variables, so ``governor -A workers.app status`` finds
the same Redis (``docker compose --profile sentinel`` runs the examples on Sentinel).

Limits, all global (every worker node and process shares them through Redis):

- queue ``emails``: 10 a second and 800 a day, for every task consumed from it
  (:mod:`workers.emails`);
- task ``workers.nightly.run_job``: 1/s, 20/m, 200/h, 800/d (:mod:`workers.nightly`);
- per customer, 5/s and 200/h on the partner API (on the task, :mod:`workers.partner_api`);
- queue ``exports``: 30 a minute and 3 running at once (a warehouse's connections), and one
  rebuild at a time per account (:mod:`workers.exports`);
- queue ``reports``: 2 a second, shared fairly between customers, acme with weight 2
  (:mod:`workers.reports`).

::

    celery -A workers.app worker -Q celery,emails,exports,reports -n node1@%h
    governor -A workers.app status
"""

from __future__ import annotations

import os

from celery import Celery

from governor.celery import Governor

BROKER_URL = os.environ.get("BROKER_URL", "redis://localhost:6379/0")
GOVERNOR_REDIS_URL = os.environ.get("GOVERNOR_REDIS_URL", "redis://localhost:6379/1")

app = Celery("workers", broker=BROKER_URL)
app.conf.update(
    governor_redis_url=GOVERNOR_REDIS_URL,
    governor_prefix=os.environ.get("GOVERNOR_PREFIX", "governor"),
    # every task consumed from the "emails" queue counts against this quota
    governor_queues={
        "emails": "10/s, 800/d",
        "exports": {"rules": "30/m", "concurrency": 3},  # 3 connections to the warehouse
        # a report service's 2 a second, shared between customers: none waits behind another's
        # batch; acme's plan counts twice
        "reports": {"rules": "2/s", "fair_by": "customer", "weights": {"acme": 2}},
    },
    # a whole-task limit, kept here with the other operational settings
    governor_tasks={"workers.nightly.run_job": "1/s, 20/m, 200/h, 800/d"},
    task_ignore_result=True,  # the examples keep no results: no result backend needed
    broker_connection_retry_on_startup=True,
)
SENTINEL_MASTER = os.environ.get("GOVERNOR_SENTINEL_MASTER")
if SENTINEL_MASTER:  # as Celery's own Sentinel broker is told its master
    app.conf.governor_redis_transport_options = {"master_name": SENTINEL_MASTER}
    if BROKER_URL.startswith("sentinel://"):
        app.conf.broker_transport_options = {"master_name": SENTINEL_MASTER}
if os.environ.get("GOVERNOR_REDIS_CLUSTER", "").lower() in ("1", "true", "t", "yes", "y", "on"):
    app.conf.governor_redis_cluster = True
governor = Governor(app)

# The task modules register their tasks on import (after `app` and `governor` exist).
from . import emails, exports, nightly, partner_api, reports  # noqa: E402

__all__ = ["app", "emails", "exports", "governor", "nightly", "partner_api", "reports"]
