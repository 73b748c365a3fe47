"""The upstream's answers: a task raises :class:`~.backoff.Backoff` after a 429 or 503.

- :mod:`.backoff`: the exception, and reading ``Retry-After``/rate-limit headers;
- :mod:`.pausing`: the limit paused for every worker, the task booked behind the pause;
- :mod:`.adaptive`: an adaptive limit's factor multiplied down (``adapt.lua``).
"""
