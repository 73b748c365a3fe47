"""What governs a task, as configured: settings, limits, live limits, the Redis a process uses.

- :mod:`.defaults`: every ``governor_*`` setting, declared once (name, default, check, doc);
- :mod:`.settings`: :class:`~.settings.Settings`, read and checked from ``app.conf``;
- :mod:`.redis_options`: which Redis (``governor_redis_*``, else the broker's);
- :mod:`.limit_config`: one limit's value (``"10/s"`` or a mapping) parsed into a
  :class:`~governor.celery.types.LimitConfig`;
- :mod:`.task_limits`: which limits govern a task (queue, task, key);
- :mod:`.live`: live limits (set from the CLI for every worker) and a process's view of them;
- :mod:`.factors`: how an adaptive limit's rules scale;
- :mod:`.store`: a process's Redis client and limiters.
"""
