"""What each algorithm promises about the admissions it made, checked on a list of them.

``admitted`` is a list of (time in microseconds, cost). ``rules`` are (limit, window_us) pairs.

==================  ==============================================================
sliding_log         at most N in any window of W
sliding_window      at most N in any window of W (buckets count in full)
fixed_window        at most N in each calendar window [kW, (k + 1)W)
gcra                at most N + floor(L / T) in any closed span of length L, T = ceil(W / N)
token_bucket        at most N + floor(L x N / W) in any closed span of length L
==================  ==============================================================

``lo``/``hi``: only the admissions in [lo, hi) count, in windows (spans) starting at ``lo`` or
later: the part of a run under one set of rules.
"""

from __future__ import annotations

import math

Admitted = list[tuple[int, int]]


def breach(
    admitted: Admitted,
    rules: list[tuple[int, int]],
    algorithm: str,
    lo: float = -math.inf,
    hi: float = math.inf,
) -> str | None:
    """The first window in which ``admitted`` exceeds what ``algorithm`` promises under
    ``rules`` (a description), or None."""
    seen = sorted((t, c) for t, c in admitted if lo <= t < hi)
    for limit, window in rules:
        found = _breach(seen, limit, window, algorithm, lo)
        if found is not None:
            return f"{found} under {limit}/{window}us ({algorithm})"
    return None


def _breach(seen: Admitted, limit: int, window: int, algorithm: str, lo: float) -> str | None:
    if algorithm == "fixed_window":
        counts: dict[int, int] = {}
        for t, c in seen:
            k = t // window
            if k * window >= lo:
                counts[k] = counts.get(k, 0) + c
        for k, n in sorted(counts.items()):
            if n > limit:
                return f"{n} in calendar window {k}"
        return None
    if algorithm in ("sliding_log", "sliding_window"):
        for i, (start, _) in enumerate(seen):
            n = sum(c for t, c in seen[i:] if t < start + window)
            if n > limit:
                return f"{n} in [{start}, {start + window})"
        return None
    if algorithm in ("gcra", "token_bucket"):
        emission = -(-window // limit)
        for i, (start, _) in enumerate(seen):
            n = 0
            for t, c in seen[i:]:
                n += c
                span = t - start
                most = limit + (span // emission if algorithm == "gcra" else span * limit // window)
                if n > most:
                    return f"{n} in [{start}, {t}] (at most {most})"
        return None
    raise ValueError(algorithm)
