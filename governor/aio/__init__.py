"""The asyncio twins of :class:`governor.Limiter` and :class:`governor.Concurrency`, on
``redis.asyncio`` clients: same scripts, same arguments, same replies; only the I/O is awaited.

>>> import redis.asyncio as aioredis
>>> limiter = Limiter(aioredis.Redis(), "10/s", name="partner-api")
>>> decision = await limiter.acquire("customer-42")
>>> warehouse = Concurrency(aioredis.Redis(), 5, name="warehouse")
>>> async with warehouse.hold("export") as permit:
...     ...
"""

from .concurrency import Concurrency, Permit
from .limiter import Limiter

__all__ = ["Concurrency", "Limiter", "Permit"]
