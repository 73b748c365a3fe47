"""Django settings of the example: the usual ones, then Celery's and governor's, which Celery
reads through its ``CELERY_`` namespace (``CELERY_GOVERNOR_QUEUES`` is ``governor_queues``)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "an example only: never use this key")
DEBUG = True
ALLOWED_HOSTS: list[str] = []
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "partners",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- Celery ----------------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379")

CELERY_BROKER_URL = f"{REDIS_URL}/0"
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ROUTES = {"partners.tasks.send_receipt": {"queue": "emails"}}

# -- governor: global limits in Redis --------------------------------------------------------
CELERY_GOVERNOR_REDIS_URL = f"{REDIS_URL}/1"
CELERY_GOVERNOR_QUEUES = {"emails": "10/s, 800/d"}
CELERY_GOVERNOR_TASKS = {"partners.tasks.nightly_report": "1/m"}
CELERY_GOVERNOR_MAX_WAIT = 3600  # fail a task that would wait longer than an hour in total
