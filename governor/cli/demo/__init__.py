"""``governor demo``: a local flood across two worker nodes, checked against its rules.

- :mod:`.command`: the command (start here): what it runs, in order, and the verdict;
- :mod:`.processes`: the embedded Redis, the worker nodes and the producer, and Ctrl-C;
- :mod:`.app`: the Celery app the demo's workers load (``-A governor.cli.demo.app``);
- :mod:`.report`: what the tasks record, the live view and the summary;
- :mod:`.page` and :mod:`.charts`: ``--report run.html``, one self-contained page.
"""

from .command import demo

__all__ = ["demo"]
