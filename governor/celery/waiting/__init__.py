"""Where a denied task waits, and how it comes back to run once.

- :mod:`.republish`: a deferred call goes back as a short ETA, or is parked;
- :mod:`.parking`: long waits kept in Redis (``park.lua``), picked up when nearly due
  (``take_due.lua``) by the :mod:`.releaser` thread of every worker;
- :mod:`.cap_line`: waiting in a full concurrency cap's line, and the sweeps of lapsed slots
  (``caps_due.lua``); :mod:`.handover`: publishing a waiter handed a freed slot;
- :mod:`.envelope`: a task's message as kept in Redis;
- :mod:`.dead_letters`: messages nobody can read or publish, kept for an operator;
- :mod:`.redelivery`: a message whose acknowledgement was lost is not run twice.
"""
