"""``governor dashboard``: a small web page showing what every limit is doing, live.

Needs the ``dashboard`` extra (``pip install 'governor[dashboard]'``: Flask). Nothing in the
core imports this package. :mod:`.sampler` reads Redis once per refresh in one thread,
:mod:`.payload` shapes the JSON the pages poll, :mod:`.app` serves the pages and (only with
``allow_writes``) block / unblock / reset, :mod:`.server` runs it all. The chart is hand-drawn
SVG in ``static/dashboard.js``: no CDN, nothing fetched from elsewhere.
"""
