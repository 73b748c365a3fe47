"""A limit's own page: every subject it has, by name, paged (the overview shows a few).

The overview reads at most ``examine`` subjects per limit, the fullest first. A limit's page
lists them all: its subjects' names (one SCAN per 1000 of the limit's keys, cached for
``NAMES_TTL`` seconds, at most ``MAX_NAMES``), filtered by a search and paged, and reads the
usage of the page's subjects only. A refresh of an open limit page costs, in Redis calls::

    per subject on the page (at most 100): 1 (usage) + 1 with a cap + 1 if fair
    + every NAMES_TTL seconds: the SCAN of the limit's names

>>> names = SubjectNames(ttl=5.0)                     # doctest: +SKIP
>>> limit_payload(state, ls, names, history, query="acme", page=1, per=50)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import threading
import time
from itertools import islice
from typing import Any

from ..cli.common import State
from ..cli.limits import LimitState, subject_state
from ..cli.views import limit_json
from .payload import OVERVIEW_POINTS, subject_payload
from .sampler import History

__all__ = ["MAX_NAMES", "NAMES_TTL", "SubjectNames", "limit_payload"]

NAMES_TTL = 5.0
"""Seconds a limit's subject names are reused before they are scanned again."""
MAX_NAMES = 20_000
"""Subject names listed at most per limit (beyond that the page says the list is cut)."""


class SubjectNames:
    """Every subject name of a per-key limit (sorted), scanned at most once per ``ttl``."""

    def __init__(self, ttl: float = NAMES_TTL, most: int = MAX_NAMES) -> None:
        self.ttl = ttl
        self.most = most
        self._cache: dict[str, tuple[float, list[str], bool]] = {}
        self._lock = threading.Lock()

    def get(self, state: State, ls: LimitState) -> tuple[list[str], bool]:
        """(names, whether more exist than listed)."""
        entry = ls.entry
        if entry.subject is not None:
            return [entry.subject], False
        with self._lock:
            hit = self._cache.get(entry.label)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                return hit[1], hit[2]
        if entry.config is None:  # found in Redis only: the sampler's names are all there are
            found = [s.subject for s in ls.subjects]
            names, cut = sorted(found), ls.capped
        else:
            scanned = list(islice(entry.limiter(state).subjects(), self.most + 1))
            names, cut = sorted(set(scanned[: self.most])), len(scanned) > self.most
        with self._lock:
            self._cache[entry.label] = (time.monotonic(), names, cut)
            for label in [k for k, v in self._cache.items() if time.monotonic() - v[0] > 60]:
                del self._cache[label]
        return names, cut


def limit_payload(
    state: State,
    ls: LimitState,
    names: SubjectNames,
    history: History,
    *,
    query: str = "",
    page: int = 1,
    per: int = 50,
) -> dict[str, Any]:
    """The limit (as ``status --json`` shows it) with page ``page`` of its subjects whose name
    contains ``query``, by name; each subject as the overview shows it."""
    everyone, cut = names.get(state, ls)
    query = query.strip().lower()
    matching = [n for n in everyone if query in n.lower()] if query else everyone
    pages = max(1, math.ceil(len(matching) / per))
    page = min(max(1, page), pages)
    shown = [subject_state(state, ls.entry, n) for n in matching[(page - 1) * per : page * per]]
    out = limit_json(LimitState(ls.entry, [], ls.total, ls.parked, ls.capped))
    out["rules_text"] = ls.entry.config.text if ls.entry.config else None
    out["subjects"] = [subject_payload(ls.entry.label, s, history, OVERVIEW_POINTS) for s in shown]
    out.update(
        subject_count=len(everyone),
        subject_count_capped=cut,
        matched=len(matching),
        page=page,
        pages=pages,
        per=per,
        paused=sum(s.usage.paused for s in shown),
        blocked=sum(s.usage.blocked is not None and not s.usage.paused for s in shown),
        time=time.time(),
    )
    return out
