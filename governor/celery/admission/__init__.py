"""The admission of a governed call, right before its body (and, for known denials, earlier).

- :mod:`.gate`: the steps, in order (start here);
- :mod:`.calls`: what governs one call (its limits, cost, wait state);
- :mod:`.early`: a message known to be denied is deferred in the worker's main process;
- :mod:`.shadow`: shadow limits, asked after an admission;
- :mod:`.holding`: the concurrency slots a running task holds until its body ends.
"""
