"""``python -m workers.showcase``: see :mod:`workers.showcase`."""

from workers.showcase.command import main

main()
