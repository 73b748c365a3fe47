"""governor's benchmarks. Run each from the checkout as a module, e.g. ``python -m bench.limiter``;
each prints a table with ratios against a baseline measured in the same run. They import their
shared helpers from :mod:`bench.common` and :mod:`bench.nodes`, and the fault scenarios from
``tests.support`` (the test suite's)."""
