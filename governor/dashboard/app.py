"""The dashboard's Flask app: three pages, the JSON they poll, and (only with ``allow_writes``)
block / unblock / reset.

=====================  ======================================================================
``GET /``              every limit (search, paging), refreshed live
``GET /limit``         one limit and every subject it has (``?label=partner.call``), paged
``GET /inspect``       one limit's subject (``?name=queue&subject=emails``), as ``inspect``
``GET /api/limits``    the overview's JSON (``?q=&blocked=1&page=1&per=25``)
``GET /api/limit``     one limit's JSON (``?label=&q=&page=1&per=50``): 404 if unknown
``GET /api/inspect``   one subject's JSON (``?name=&subject=``): 404 with a message if unknown
``POST /api/block``    ``{"name", "subject", "duration": "15m", "reason"}`` (writes only)
``POST /api/unblock``  ``{"name", "subject"}`` (writes only)
``POST /api/reset``    ``{"name", "subject"}``: forget what was counted, a block stays
=====================  ======================================================================

Without ``allow_writes`` the write routes are not registered (404). They accept only
``application/json`` bodies, which a page on another site cannot send without the browser
asking first, and :mod:`.access` refuses a write whose ``Origin`` is another site's, a
request whose ``Host`` is not the dashboard's (DNS rebinding), and, with a token, any request
without it. A block lasts at most ``max_block`` seconds (longer ones: ``governor block``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, Response, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from ..cli.admin import forget_counts
from ..cli.common import (
    CliError,
    State,
    format_duration,
    mask_url,
    parse_duration,
    user_errors,
)
from ..cli.entries import LimitEntry
from ..cli.limits import LimitState, has_state, resolve, subject_state
from .access import Access, protect
from .limit_page import SubjectNames, limit_payload
from .payload import overview, subject_payload
from .sampler import Sampler

__all__ = ["create_app"]

log = logging.getLogger("governor.dashboard")

CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
MAX_BLOCK = 7 * 86400.0
"""The longest block the dashboard makes by default (``--max-block``)."""
MAX_ARG = 1000
"""Characters at most in a limit's name or a subject given to the dashboard."""


class Problem(Exception):
    """A request the dashboard cannot answer: shown as ``message`` with ``status``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _arg(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        raise Problem(f"missing {name!r}: give the limit's name and the subject")
    if len(value) > MAX_ARG:
        raise Problem(f"{name!r} is longer than {MAX_ARG} characters")
    return value


def find_entry(sampler: Sampler, name: str, subject: str) -> LimitEntry:
    """The limit ``name`` that ``subject`` belongs to, or a :class:`Problem` saying why not."""
    state = sampler.state
    try:
        with user_errors(state):
            entry = resolve(state, name, subject, None)
            if entry is not None:
                return entry
            for ls in sampler.frame.limits:  # without an app: the limits found in Redis
                if ls.entry.name == name:
                    return LimitEntry("found", name, None, subject, algorithms=ls.entry.algorithms)
            if has_state(state, name):
                return LimitEntry("found", name, None, subject)
    except CliError as exc:
        status = 503 if exc.exit_code == 3 else 404
        raise Problem(exc.message, status) from None
    raise Problem(
        f"unknown limit {name!r}: Redis holds nothing for it under prefix {state.prefix!r}",
        404,
    )


def find_limit(sampler: Sampler, label: str) -> LimitState:
    """The limit labelled ``label`` in the sampler's last read, or a 404 :class:`Problem`."""
    for ls in sampler.frame.limits:
        if ls.entry.label == label:
            return ls
    frame = sampler.frame
    if frame.error is not None and not frame.limits:
        raise Problem(f"Redis is unreachable, no limit read yet: {frame.error}", 503)
    known = ", ".join(repr(ls.entry.label) for ls in frame.limits[:5]) or "none yet"
    raise Problem(f"unknown limit {label!r} (the dashboard knows {known})", 404)


def _page_args(args: Any, per_default: int) -> tuple[int, int]:
    try:
        page = int(args.get("page", "1"))
        per = min(200, max(1, int(args.get("per", str(per_default)))))
    except ValueError:
        raise Problem("page and per must be whole numbers") from None
    return page, per


def _redis(state: State, call: Any, *args: Any) -> Any:
    """``call(*args)`` with Redis and governor errors as a :class:`Problem`."""
    try:
        with user_errors(state):
            return call(*args)
    except CliError as exc:
        raise Problem(exc.message, 503 if exc.exit_code == 3 else 400) from None


def create_app(
    sampler: Sampler,
    *,
    allow_writes: bool = False,
    per_page: int = 25,
    shown: int = 5,
    access: Access | None = None,
    max_block: float = MAX_BLOCK,
) -> Flask:
    """The dashboard for ``sampler``'s Redis and limits (the caller starts the sampler),
    answering as ``access`` says (default: loopback names only, no token)."""
    access = access if access is not None else Access()
    app = Flask(__name__)
    protect(app, access)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    state: State = sampler.state
    names = SubjectNames()
    page_info = {
        "interval_ms": round(sampler.interval * 1000),
        "writes": allow_writes,
        "where": sampler.where,
        "app_name": state.app_name,
        "examine": sampler.examine,
        "history": format_duration(sampler.history.seconds),
        "auth": access.token is not None,
    }

    @app.after_request
    def headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "same-origin"  # a form post keeps its Origin
        return response

    @app.errorhandler(Problem)
    def problem(exc: Problem) -> Any:
        if request.path.startswith("/api/"):
            return jsonify(error=exc.message), exc.status
        page = render_template("error.html", message=exc.message, **page_info)
        return page, exc.status

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        return problem(Problem(f"{exc.name}: {exc.description}", exc.code or 500))

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Any:
        log.exception("dashboard request failed")
        return problem(Problem(mask_url(f"the dashboard failed: {type(exc).__name__}: {exc}"), 500))

    @app.get("/")
    def index() -> str:
        return render_template("index.html", **page_info)

    @app.get("/inspect")
    def inspect_page() -> str:
        name, subject = _arg(request.args, "name"), _arg(request.args, "subject")
        entry = find_entry(sampler, name, subject)
        return render_template("inspect.html", entry=entry, name=name, subject=subject, **page_info)

    @app.get("/limit")
    def limit_page() -> str:
        ls = find_limit(sampler, _arg(request.args, "label"))
        return render_template("limit.html", entry=ls.entry, **page_info)

    @app.get("/api/limit")
    def api_limit() -> Any:
        args = request.args
        ls = find_limit(sampler, _arg(args, "label"))
        page, per = _page_args(args, 50)
        data = _redis(
            state, lambda: limit_payload(
                state, ls, names, sampler.history, query=args.get("q", ""), page=page, per=per
            )
        )  # fmt: skip
        return jsonify(data)

    @app.get("/api/limits")
    def api_limits() -> Any:
        args = request.args
        page, per = _page_args(args, per_page)
        data = overview(
            sampler.frame,
            sampler.history,
            query=args.get("q", ""),
            blocked_only=args.get("blocked") == "1",
            page=page,
            per=per,
            shown=shown,
        )
        return jsonify({**data, "interval": sampler.interval, "writes": allow_writes})

    @app.get("/api/inspect")
    def api_inspect() -> Any:
        name, subject = _arg(request.args, "name"), _arg(request.args, "subject")
        entry = find_entry(sampler, name, subject)
        s = _redis(state, subject_state, state, entry, subject)
        sampler.record(entry.label, s)
        out = {**entry.describe(), **subject_payload(entry.label, s, sampler.history)}
        out["rules_text"] = entry.config.text if entry.config else None
        out["time"] = time.time()
        return jsonify(out)

    if allow_writes:
        _write_routes(app, sampler, max_block)
    return app


def _body() -> dict[str, Any]:
    data = request.get_json(silent=True) if request.is_json else None
    if not isinstance(data, dict):
        raise Problem("send a JSON object (Content-Type: application/json)", 415)
    return data


def _write_routes(app: Flask, sampler: Sampler, max_block: float) -> None:
    state = sampler.state

    @app.post("/api/block")
    def block() -> Any:
        data = _body()
        name, subject = _arg(data, "name"), _arg(data, "subject")
        try:
            seconds = parse_duration(str(data.get("duration", "")))
        except ValueError as exc:
            raise Problem(str(exc)) from None
        if seconds > max_block:
            raise Problem(
                f"a block from the dashboard lasts at most {format_duration(max_block)} "
                f"(--max-block), not {format_duration(seconds)}: for longer, governor block"
            )
        reason = str(data.get("reason", ""))[:500]
        entry = find_entry(sampler, name, subject)
        until = _redis(state, entry.limiter(state).block, subject, seconds, reason)
        log.warning("dashboard: blocked %s %s for %ss: %s", name, subject, seconds, reason)
        sampler.refresh()
        return jsonify(name=name, subject=subject, blocked=True, until=until, reason=reason)

    @app.post("/api/unblock")
    def unblock() -> Any:
        data = _body()
        name, subject = _arg(data, "name"), _arg(data, "subject")
        entry = find_entry(sampler, name, subject)
        was = _redis(state, entry.limiter(state).unblock, subject)
        log.warning("dashboard: unblocked %s %s", name, subject)
        sampler.refresh()
        return jsonify(name=name, subject=subject, was_blocked=was)

    @app.post("/api/reset")
    def reset() -> Any:
        data = _body()
        name, subject = _arg(data, "name"), _arg(data, "subject")
        find_entry(sampler, name, subject)
        keys = _redis(state, forget_counts, state, name, subject)
        log.warning("dashboard: reset %s %s (%d keys)", name, subject, keys)
        sampler.refresh()
        return jsonify(name=name, subject=subject, reset=True, keys=keys)
