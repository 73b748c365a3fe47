"""What the tests share besides fixtures: worker nodes and apps, real server clusters, fault
scenarios, reference models, helpers. Test files import ``support.<module>``; ``bench/`` imports
``tests.support.<module>`` (run from the checkout: ``python -m bench.faults``).
"""
