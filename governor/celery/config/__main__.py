"""``python -m governor.celery.config``: print the configuration page of the docs."""

from .defaults import markdown

print(markdown(), end="")
