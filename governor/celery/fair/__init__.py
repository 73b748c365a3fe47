"""Fair sharing of a limit between tenants.

- :mod:`.tenants`: which tenant a call is for;
- :mod:`.sharing`: the gate's step: a denied call waits in its limit's fair queue;
- :mod:`.queue`: the fair queue in Redis (``fair_put.lua``, ``fair_take.lua``,
  ``fair_claim.lua``);
- :mod:`.dispatcher`: the thread that sends the lowest tags on as the limit has room.
"""
