"""The JSON the dashboard's pages poll: the CLI's ``--json`` shapes (:mod:`governor.cli.views`)
plus a rate series per subject, filtered and paged."""

from __future__ import annotations

import math
from typing import Any

from ..cli.common import json_number
from ..cli.entries import LimitEntry
from ..cli.limits import LimitState, SubjectState
from ..cli.views import limit_json, subject_json
from .sampler import Frame, History, Parked, rate_of

__all__ = ["limit_matches", "overview", "parked_json", "subject_payload"]

OVERVIEW_POINTS = 60
"""Points of each subject's rate series in the overview (the subject's page has them all)."""


def subject_payload(
    label: str, s: SubjectState, history: History, points: int | None = None
) -> dict[str, Any]:
    """``inspect --json``'s subject part, its rate now and its rate series ``[[t, rate]]``."""
    out = subject_json(s)
    rate = rate_of(s)
    series = history.get(label, s.subject)
    if points is not None:
        series = series[-points:]
    out["rate"] = None if rate is None else json_number(rate[0])
    out["rate_limit"] = None if rate is None else json_number(rate[1])
    out["history"] = [[round(t, 2), round(r, 3)] for t, r in series]
    return out


def _text(entry: LimitEntry) -> str:
    rules = entry.config.text if entry.config is not None else "rules unknown"
    return " ".join([entry.label, entry.name, rules, *entry.tasks]).lower()


def limit_matches(ls: LimitState, query: str) -> tuple[bool, list[SubjectState]]:
    """Whether the limit's own words match ``query``, and its subjects that do."""
    if not query:
        return True, ls.subjects
    if query in _text(ls.entry):
        return True, ls.subjects
    return False, [s for s in ls.subjects if query in s.subject.lower()]


def parked_json(parked: Parked) -> dict[str, Any]:
    return {
        "total": parked.total,
        "next_due": parked.next_due,
        "by_limit": parked.by_label,
        "counts_capped": parked.capped,
    }


def overview(
    frame: Frame,
    history: History,
    *,
    query: str = "",
    blocked_only: bool = False,
    page: int = 1,
    per: int = 25,
    shown: int = 5,
) -> dict[str, Any]:
    """Limits matching ``query`` (in the limit's name, rules, tasks or a subject), page ``page``
    of ``per``; each with at most ``shown`` subjects (blocked, then the fullest, first)."""
    query = query.strip().lower()
    picked: list[tuple[LimitState, list[SubjectState]]] = []
    for ls in frame.limits:
        own, subjects = limit_matches(ls, query)
        if blocked_only:
            subjects = [s for s in subjects if s.usage.blocked is not None]
            own = False
        if own or subjects:
            picked.append((ls, subjects))
    pages = max(1, math.ceil(len(picked) / per))
    page = min(max(1, page), pages)
    limits = []
    for ls, subjects in picked[(page - 1) * per : page * per]:
        item = limit_json(LimitState(ls.entry, [], ls.total, ls.parked, ls.capped, ls.meters))
        item["rules_text"] = ls.entry.config.text if ls.entry.config else None
        item["subjects"] = [
            subject_payload(ls.entry.label, s, history, OVERVIEW_POINTS) for s in subjects[:shown]
        ]
        item["matching_subjects"] = len(subjects)
        limits.append(item)
    every = [s for ls in frame.limits for s in ls.subjects]
    return {
        "time": frame.time,
        "source": frame.source,
        "error": frame.error,
        "error_since": frame.error_since,
        "calls": frame.calls,
        "took": round(frame.took, 4),
        "parked": parked_json(frame.parked),
        "summary": {
            "limits": len(frame.limits),
            "subjects": len(every),
            "blocked": sum(s.usage.blocked is not None and not s.usage.paused for s in every),
            "paused": sum(s.usage.paused for s in every),
            "full": sum(not s.admits for s in every),
        },
        "matched": len(picked),
        "page": page,
        "pages": pages,
        "per": per,
        "limits": limits,
    }
