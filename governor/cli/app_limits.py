"""The limits a Celery app configures, with the live ones (``governor limits set``) in place of
the configured ones they name: what status, inspect, top and ``limits`` show for ``-A``."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import GovernorError
from .apps import settings_of
from .common import CliError, State
from .entries import Config, LimitEntry

if TYPE_CHECKING:
    from ..celery.config.settings import Settings

__all__ = ["app_limits", "configured_limits"]


def _tasks(app: Any) -> list[Any]:
    try:
        app.loader.import_default_modules()
    except Exception as exc:
        raise CliError(
            f"Celery app {app.main!r}: importing its task modules raised "
            f"{type(exc).__name__}: {exc}"
        ) from None
    return sorted(
        (t for t in app.tasks.values() if not t.name.startswith("celery.")),
        key=lambda t: str(t.name),
    )


def app_limits(state: State, live: bool = True) -> list[LimitEntry]:
    """:func:`configured_limits` of the state's app, read once per invocation; ``live``: with
    the live limits set in Redis in place of the configured ones they name."""
    if state.app is None:
        return []
    if "limits" not in state.cache:
        state.cache["limits"] = configured_limits(state.app, settings_of(state.app))
    entries = list(state.cache["limits"])
    if not live:
        return entries
    if "live" not in state.cache:
        state.cache["live"] = _live_configs(state)
    found = state.cache["live"]
    entries = [_live_entry(e, found[e.label]) if e.label in found else e for e in entries]
    if any(e.config is not None and e.config.adaptive for e in entries):
        entries = _adapted(state, entries)
    return entries


def _live_entry(entry: LimitEntry, live: Config) -> LimitEntry:
    configured = entry.config.text if entry.config is not None else None
    return replace(entry, config=replace(live, configured=configured))


def _adapted(state: State, entries: list[LimitEntry]) -> list[LimitEntry]:
    """Adaptive limits as workers see them now: their rules scaled by their factor."""
    from ..celery.config.factors import read_factors, scale_rules

    settings = settings_of(state.app)
    factors = read_factors(state.client, state.prefix)
    out = []
    for e in entries:
        factor = factors.get(e.label)
        if e.config is not None and e.config.adaptive and factor is not None:
            f = factor.at(time.time(), settings.adaptive_rise, settings.adaptive_hold)
            rules = scale_rules(e.config.rules, f, e.config.algorithm)
            config = replace(e.config, rules=rules, factor=f, ceiling=e.config.rules)
            e = replace(e, config=config)
        out.append(e)
    return out


def _live_configs(state: State) -> dict[str, Config]:
    from ..celery.config.limit_config import limit_config
    from ..celery.config.live import LiveLimits

    settings = settings_of(state.app)
    out = {}
    for label, entry in LiveLimits(state.client, state.prefix).entries().items():
        try:
            config = limit_config(
                entry.value, settings.algorithm, label, settings.concurrency_lease
            )
        except GovernorError:
            continue
        out[label] = replace(_config(config), live=True, live_by=entry.by, live_at=entry.at)
    return out


def _config(config: Any) -> Config:
    return Config(
        tuple(config.rules),
        str(config.algorithm),
        config.concurrency,
        float(config.lease),
        bool(getattr(config, "shadow", False)),
        adaptive=bool(getattr(config, "adaptive", False)),
        fair=getattr(config, "fair_by", None) is not None,
        weight=getattr(config, "weight", None),
        meters=tuple(getattr(config, "meters", ())),
    )


def configured_limits(app: Any, settings: Settings) -> list[LimitEntry]:
    """Every limit the app configures: queues, then whole-task limits, then per-key limits."""
    from ..celery.config.task_limits import key_config, task_limit_config

    out = [LimitEntry("queue", "queue", _config(c), q) for q, c in settings.queues.items()]
    tasks = _tasks(app)
    whole: dict[str, Config] = {name: _config(c) for name, c in settings.tasks.items()}
    keyed: dict[str, tuple[Config, list[str]]] = {}
    for task in tasks:
        config = task_limit_config(task, settings)
        if config is not None:
            whole[task.name] = _config(config)
        config = key_config(task, settings)
        if config is not None:
            name = getattr(task, "governor_name", None) or task.name
            keyed.setdefault(name, (_config(config), []))[1].append(task.name)
    out += [LimitEntry("task", "task", c, name, (name,)) for name, c in sorted(whole.items())]
    out += [
        LimitEntry("key", name, c, None, tuple(names)) for name, (c, names) in sorted(keyed.items())
    ]
    return out
