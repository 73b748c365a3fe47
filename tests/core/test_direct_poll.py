"""The lean lane's check of an idle connection under gevent: the operating system's poll, not
gevent's cooperative one (a check that does not wait needs no event loop)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_lane_checks_idle_connections_with_the_os_poll_under_gevent() -> None:
    pytest.importorskip("gevent")
    code = """
from gevent import monkey
monkey.patch_all()
import select
from governor import direct
assert select.poll is not monkey.get_original("select", "poll")  # gevent's
assert direct._os_poll() is monkey.get_original("select", "poll")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
