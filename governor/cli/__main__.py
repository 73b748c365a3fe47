"""``python -m governor.cli``: the same as the ``governor`` command."""

from . import main

main()
