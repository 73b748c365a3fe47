"""The Celery app, with governor installed where the app is made.

The order matters:

1. ``DJANGO_SETTINGS_MODULE`` first: Celery reads Django's settings lazily, but the first read
   needs it;
2. ``config_from_object`` next: it replaces the app's configuration, so anything set on
   ``app.conf`` before it is lost (celery-once #77 lost its settings that way); governor's
   settings live in settings.py as ``CELERY_GOVERNOR_*``;
3. ``Governor(app)`` before any task is sent: it checks every ``governor_*`` setting when the
   app finalizes, in web processes as in workers;
4. ``autodiscover_tasks()`` last: it imports each installed app's ``tasks.py`` lazily.
"""

import os

from celery import Celery

from governor.celery import Governor

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

app = Celery("mysite")
app.config_from_object("django.conf:settings", namespace="CELERY")
governor = Governor(app)
app.autodiscover_tasks()
