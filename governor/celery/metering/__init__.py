"""Limits with meters in Celery: what a call costs under each limit, learned estimates,
settling what a task used, and the upstream's own counters (docs/token-quotas.md).

- :mod:`.costs`: a call's share under each limit, checked; ``learned(default)``;
- :mod:`.learned`: learned estimates and the totals per limit and meter, in Redis;
- :mod:`.settling`: the reservations of running tasks and their settling;
- :mod:`.sync`: the upstream's rate-limit headers folded into governor's counts.

What users call is :mod:`governor.celery.usage` (``settle``, ``observe``).
"""
