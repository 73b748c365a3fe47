"""Celery integration: global, exact limits on tasks, queues and keys.

>>> from governor.celery import Governor, GovernedTask
>>> app.conf.governor_queues = {"emails": "10/s, 800/d", "exports": {"concurrency": 5}}
>>> Governor(app)
"""

from ..errors import GovernorTimeout
from .admission.holding import current_permits
from .app import Governor
from .batch import submit_batch
from .feedback.backoff import Backoff
from .task import GovernedTask
from .types import Deferred
from .usage import learned, observe, settle

__all__ = [
    "Backoff",
    "Deferred",
    "GovernedTask",
    "Governor",
    "GovernorTimeout",
    "current_permits",
    "learned",
    "observe",
    "settle",
    "submit_batch",
]
