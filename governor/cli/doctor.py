"""``governor doctor``: deployment checks of governor's Redis, one line each.

::

    $ governor --redis-url redis://10.0.0.5:6379/0 doctor
    ok    redis        7.2.4 at 10.0.0.5:6379, role master, ping 0.4 ms
    FAIL  persistence  nothing on disk (no AOF, no RDB save points) and no replica: ...
    ok    eviction     maxmemory-policy noeviction: ...
    ok    clock        Redis clock +0.002s from this host's (round trip 0.4 ms)
    $ governor -A proj doctor --json        # adds the broker's visibility timeout check

Checks (see :mod:`governor.deployment` for why each matters): version (6.2 or later; a line
only when it fails), persistence (parked tasks and
caps' waiters survive a restart), eviction (``maxmemory-policy``), clock, cluster coverage (a
cluster: every slot served), and with an app the broker's ``visibility_timeout`` against
``governor_park_after``. Exit status 1 when a check FAILs (warnings do not), 3 when Redis is
unreachable.
"""

from __future__ import annotations

import time
from typing import Any

import click

from ..deployment import (
    FAIL,
    OK,
    Check,
    clock,
    cluster_coverage,
    eviction,
    persistence,
    servers,
    version,
    visibility,
)
from .common import EXIT_FAILED, State, echo_json, mask_url, pass_state

__all__ = ["doctor", "run_checks"]


def _connection(state: State) -> Check:
    client = state.client
    before = time.monotonic()
    client.ping()
    ping = (time.monotonic() - before) * 1000
    found = servers(client)
    server, node = found[0]
    info = node.info("server")
    role = node.info("replication").get("role", "?")
    kind = state.target_kind()
    how = {"sentinel": " through Sentinel", "cluster": f" (cluster of {len(found)} masters)"}
    detail = (
        f"{info.get('redis_version', '?')} at {server}{how.get(kind, '')}, role {role}, "
        f"ping {ping:.1f} ms"
    )
    if role != "master":
        return Check("redis", FAIL, f"{detail}: a replica refuses governor's writes", server)
    return Check("redis", OK, detail, server)


def run_checks(state: State) -> list[Check]:
    """Every check that applies to the state's Redis (and app)."""
    checks = [_connection(state)]
    nodes = servers(state.client)
    # the version shows in the first line; a line of its own only when it is not good
    versions = [version(server, node.info("server")) for server, node in nodes]
    checks += [check for check in versions if check.status != OK]
    checks += [persistence(server, node) for server, node in nodes]
    checks += [eviction(server, node) for server, node in nodes]
    checks += [clock(server, node) for server, node in nodes]
    checks += cluster_coverage(state.client)
    if state.app is not None:
        from .apps import settings_of

        settings = settings_of(state.app)
        conf = state.app.conf
        found = visibility(
            conf.get("broker_url"),
            conf.get("broker_transport_options"),
            settings.park_after,
            settings.max_wait,
        )
        if found is not None:
            checks.append(found)
    return checks


def _json(check: Check) -> dict[str, Any]:
    return {
        "check": check.name,
        "status": check.status,
        "server": check.server or None,
        "detail": check.detail,
    }


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@pass_state
def doctor(state: State, as_json: bool) -> None:
    """Check the deployment: version, persistence, eviction, clock, cluster slots, visibility
    timeout.

    One line per check (ok / warn / FAIL); exit status 1 when a check FAILs.
    """
    checks = run_checks(state)
    failed = any(check.status == FAIL for check in checks)
    if as_json:
        echo_json(
            {
                "redis_url": mask_url(state.redis_url),
                "app": state.app_name,
                "ok": not failed,
                "checks": [_json(check) for check in checks],
            }
        )
    else:
        width = max(len(check.name) for check in checks)
        several = len({check.server for check in checks if check.server}) > 1
        for check in checks:
            where = f"[{check.server}] " if several and check.server else ""
            click.echo(f"{check.status:<5} {check.name:<{width}}  {where}{check.detail}")
    if failed:
        click.get_current_context().exit(EXIT_FAILED)
