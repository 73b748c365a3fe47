"""Celery integration: global, exact limits on tasks, queues and keys.

>>> from governor.celery import Governor, GovernedTask
>>> app.conf.governor_queues = {"emails": "10/s, 800/d", "exports": {"concurrency": 5}}
>>> Governor(app)
"""

from ..errors import GovernorTimeout
from .app import Governor
from .backoff import Backoff
from .batch import submit_batch
from .gate import Deferred
from .holding import current_permits
from .task import GovernedTask

__all__ = [
    "Backoff",
    "Deferred",
    "GovernedTask",
    "Governor",
    "GovernorTimeout",
    "current_permits",
    "submit_batch",
]
