"""One answer for a call under all of its limits (no Celery here, only limiters).

- :mod:`.decider`: start on the call's bookings, take from an admission lease, or ask Redis;
- :mod:`.rounds`: the multi-limit rounds (``acquire_all``, ``reserve_all``, ``claim_all``):
  every limit admits or what was taken goes back; a cap's slot is taken here, with the rules;
- :mod:`.leases`: admission leases, a few admissions a pool process takes at once.
"""
