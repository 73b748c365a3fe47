"""The Django project. Importing it imports the Celery app, so that Django's processes (web,
shell, management commands) and the worker all have it, with governor installed, before any
task is sent: ``@shared_task`` tasks then bind to it."""

from .celery import app as celery_app

__all__ = ("celery_app",)
