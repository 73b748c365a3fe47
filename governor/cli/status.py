"""``governor status``: every limit with its usage per rule, blocks and bookings.

::

    $ governor -A proj status
    queue:emails  10/s, 800/d  (sliding_log)
     subject  rule   usage          used  resets in  state
     emails   10/s   ██████░░░░░░   6/10      0.40s  ok
              800/d  ░░░░░░░░░░░░  6/800    23h 59m
    $ governor status --json | jq '.limits[].subjects[] | select(.blocked)'

With an app (``-A`` or ``celery -A proj governor status``) it shows the configured limits, the
subjects of per-key limits found in Redis (SCAN); without one, whatever it finds under the
prefix, grouped by limiter name (rules unknown, so only blocks and bookings). Last, how many
dead letters wait for an operator (``governor dead-letters``), if any.
"""

from __future__ import annotations

import click

from .common import State, echo_json, mask_url, pass_state
from .limits import all_limits, dead_letter_count, parking_available
from .views import console, limit_json, limits_view

__all__ = ["status"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--subjects",
    "max_subjects",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Show at most this many subjects per limit (blocked, then the fullest, first).",
)
@pass_state
def status(state: State, as_json: bool, max_subjects: int) -> None:
    """Every limit: usage bars per rule, blocks, bookings; and the dead letters."""
    states, source = all_limits(state, max_subjects)
    dead = dead_letter_count(state)
    if as_json:
        echo_json(
            {
                "redis_url": mask_url(state.redis_url),
                "prefix": state.prefix,
                "app": state.app_name,
                "source": source,
                "limits": [limit_json(ls) for ls in states],
                "dead_letters": dead,
            }
        )
        return
    out = console()
    where = f"{mask_url(state.redis_url)} prefix {state.prefix!r}"
    if source == "app":
        out.print(f"Limits of app {state.app_name!r} in {where}\n")
    elif state.app is not None:
        out.print(f"App {state.app_name!r} configures no limits; found in {where}:\n")
    else:
        out.print(f"Found in {where} (-A APP adds rules and usage):\n")
    if not states:
        out.print("Nothing found.")
    else:
        out.print(limits_view(states, parked=parking_available()))
    if dead:
        out.print(
            f"{dead} dead letters: waiting tasks that could not be read or published "
            "(governor dead-letters list)",
            style="bold yellow",
        )
