"""Settings declared once (governor.celery.config.defaults): the docs, the Settings fields, the
task attributes and a limit's keys all come from the one table, and every check names its
setting."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from governor import ConfigError
from governor.celery import GovernedTask
from governor.celery.config.defaults import LIMIT_KEYS, SETTINGS, TASK_OPTIONS, markdown
from governor.celery.config.limit_config import limit_config
from governor.celery.config.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]


def app_with(**conf: Any) -> Celery:
    app = Celery("settings-test", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(conf)
    return app


def test_the_configuration_page_is_the_table() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == markdown(), "run: python -m governor.celery.config > docs/configuration.md"


def test_every_settings_field_is_declared() -> None:
    declared = {s.field for s in SETTINGS}
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert fields - declared == {"redis"}  # how to reach the declared redis_url: derived
    assert declared - fields == {"redis_transport_options", "redis_cluster", "redis_client"}
    defaults = load_settings(app_with().conf)
    for s in SETTINGS:
        if s.check is not None:
            assert getattr(defaults, s.field) == s.default, s.name


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.check is not None], ids=str)
def test_a_bad_value_names_its_setting(setting: Any) -> None:
    if setting.name in ("governor_metrics_tenants",):  # any value is a truth value
        return
    with pytest.raises(ConfigError, match=setting.name):
        load_settings(app_with(**{setting.name: object()}).conf)


def test_an_unknown_setting_is_reported_with_a_guess(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="governor.celery"):
        load_settings(app_with(governor_queus={"a": "1/s"}).conf)
    assert "governor_queus" in caplog.text and "did you mean governor_queues" in caplog.text


def test_governed_task_has_every_task_option() -> None:
    doc = GovernedTask.__doc__ or ""
    for option in TASK_OPTIONS:
        assert getattr(GovernedTask, option.name) == option.default, option.name
        assert f"``{option.name}``" in doc


def test_a_limit_takes_exactly_the_declared_keys() -> None:
    full = {
        "rules": "10/s",
        "algorithm": "sliding_log",
        "shadow": False,
        "transit": 0.25,
        "adaptive": False,
        "fair_by": "tenant",
        "weights": {"a": 2},
    }
    assert {k.name for k in LIMIT_KEYS} == set(full) | {"concurrency"}
    limit_config(full, "sliding_log", "here")
    limit_config({"concurrency": 2}, "sliding_log", "here")
    with pytest.raises(ConfigError, match="here"):
        limit_config({**full, "rule": "1/s"}, "sliding_log", "here")


def test_transit_lengthens_each_window_of_the_limit() -> None:
    """``transit``: the upstream counts a call when it arrives, later than its admission."""
    from governor import Rule

    meters = limit_config(
        {"rules": {"requests": "100/4s", "tokens": "16000/m"}, "transit": 0.1}, "sliding_log", "q"
    )
    assert meters.rules == (Rule(100, 4.1), Rule(16000, 60.1))
    assert dict(meters.meters) == {"requests": (Rule(100, 4.1),), "tokens": (Rule(16000, 60.1),)}
    assert limit_config({"rules": "10/s", "transit": 0}, "gcra", "q").rules == (Rule(10, 1),)
    for bad in (-1, 0.0005, "0.1", True, 61):
        with pytest.raises(ConfigError, match="q: transit must be 0 to 60 seconds"):
            limit_config({"rules": "10/s", "transit": bad}, "sliding_log", "q")
    app = app_with()

    @app.task(base=GovernedTask, governor_limit="5/s", governor_transit=0.25, shared=False)
    def t() -> None: ...

    from governor.celery.config.task_limits import task_limit_config

    config = task_limit_config(t, load_settings(app.conf))
    assert config is not None and config.rules == (Rule(5, 1.25),)
