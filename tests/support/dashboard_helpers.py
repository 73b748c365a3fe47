"""Helpers for the dashboard's tests: an app with three kinds of limits, a dashboard on it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from celery import Celery

from governor.cli.common import State

from .celery_helpers import limits_app as shared_limits_app


def limits_app(url: str, prefix: str) -> Celery:
    """A queue quota, a whole-task limit and a per-key limit (as the CLI's tests use)."""
    return shared_limits_app(url, prefix, "dash", __name__)


def state_of(app: Celery) -> State:
    """What ``governor -A app`` would read: the app's Redis and prefix."""
    return State(
        redis_url=str(app.conf.governor_redis_url), prefix=str(app.conf.governor_prefix), app=app
    )


def get(url: str) -> tuple[int, Any]:
    """(status, JSON or text) of a GET; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            status, body, kind = response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        status, body, kind = exc.code, exc.read(), exc.headers
    text = body.decode()
    return status, json.loads(text) if "json" in kind.get("Content-Type", "") else text


def post(url: str, data: Any, content_type: str = "application/json") -> tuple[int, Any]:
    body = json.dumps(data).encode() if content_type == "application/json" else data.encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode()
        return exc.code, json.loads(text) if text.startswith("{") else text
