"""Example Celery apps governed by governor: the README's examples, ``governor demo``'s workers
and the services in ``docker-compose.yml``.

=======================  ==================================================================
module                   what it shows
=======================  ==================================================================
``workers.app``          the Celery app: broker and limiter Redis from the environment,
                         ``Governor(app)``, the ``emails`` queue quota, the nightly cap
``workers.partner_api``  a per-customer limit on calls to a partner's API
``workers.emails``       a per-queue quota covering every task consumed from ``emails``
``workers.nightly``      a nightly batch under a daily cap, and a producer for it
``workers.exports``      a concurrency cap on a queue (3 at once), and one per account
``workers.reports``      a queue's rate shared fairly between customers, with a weight
``workers.showcase``     the examples under load on two nodes, and the docs' pictures of
                         the dashboard taken from them (``python -m workers.showcase``)
=======================  ==================================================================

Run a worker with ``celery -A workers.app worker -Q celery,emails,exports,reports``.
"""
