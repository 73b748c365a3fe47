"""The Grafana dashboard and the Prometheus alert rules under deploy/: every query names only
metrics governor really exports, with labels those metrics really carry."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from governor.celery.metrics.definitions import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "governor.json"
ALERTS = ROOT / "deploy" / "prometheus" / "governor-alerts.yml"

SCRAPE_LABELS = {"job", "instance"}
"""Labels Prometheus adds to every scraped series."""
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range"}


def exported() -> dict[str, set[str]]:
    """Sample name -> its labels, as a worker's /metrics serves them (one child per metric, so
    labelled metrics show their samples). ``_created`` is left out: prefork workers serve the
    multiprocess collector, which has none."""
    registry = CollectorRegistry()
    metrics = Metrics(registry=registry)
    for metric in metrics.all():
        names = metric._labelnames
        if names:
            metric.labels(*["x"] * len(names))
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


EXPORTED = exported()


# -- a small PromQL reader: enough to find metric names, selectors and grouping labels ----------

AGGREGATORS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week", "delta",
    "deriv", "exp", "floor", "histogram_quantile", "holt_winters", "hour", "idelta",
    "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log2",
    "log10", "max_over_time", "min_over_time", "minute", "month", "predict_linear",
    "present_over_time", "quantile_over_time", "rate", "resets", "round", "scalar", "sgn",
    "sort", "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time",
    "time", "timestamp", "vector", "year",
}  # fmt: skip
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
            "and", "or", "unless", "atan2", "inf", "nan"}  # fmt: skip

TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      |(?P<range>\[[^\]]*\])
      |(?P<var>\$\{?\w+\}?)
      |(?P<dur>\d+(?:ms|[smhdwy])\b)
      |(?P<num>\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+)
      |(?P<ident>[A-Za-z_:][\w:]*)
      |(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},@])
      |(?P<space>\s+)""",
    re.X,
)
MATCHER = re.compile(r"""\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*,?""")


@dataclass
class Query:
    """What one PromQL expression uses."""

    metrics: list[str] = field(default_factory=list)
    selected: list[tuple[str, str]] = field(default_factory=list)
    """(metric, label) for each label matcher ``metric{label="..."}``."""
    grouped: list[tuple[str, str]] = field(default_factory=list)
    """(metric, label) for each label in ``by (...)``, with each metric it aggregates."""
    variables: set[str] = field(default_factory=set)


def tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        assert m is not None, f"cannot read {expr[pos:]!r} in {expr!r}"
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "space":
            out.append((kind, m.group()))
    return out


def closing(toks: list[tuple[str, str]], start: int) -> int:
    """The index of the ``)`` matching the ``(`` at ``start``."""
    depth = 0
    for i in range(start, len(toks)):
        depth += {"(": 1, ")": -1}.get(toks[i][1], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses: {toks}")


def label_list(toks: list[tuple[str, str]], start: int) -> tuple[list[str], int]:
    """The labels of ``(a, b)`` starting at ``start``, and the index after it."""
    end = closing(toks, start)
    return [v for k, v in toks[start + 1 : end] if k == "ident"], end + 1


def parse(expr: str) -> Query:
    query = Query(variables=set(re.findall(r"\$\{?(\w+)", expr)))
    toks = tokens(expr)
    metric_at: dict[int, str] = {}
    groupings: list[tuple[list[str], int]] = []  # (labels, index of the aggregated "(")
    skip: set[int] = set()  # a trailing "by (...)"
    i = 0
    while i < len(toks):
        kind, value = toks[i]
        if i in skip:
            i += 1
            continue
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if value == "{":
            raise AssertionError(f"a selector without a metric name in {expr!r}")
        if kind != "ident":
            i += 1
            continue
        if value in AGGREGATORS:
            j, labels, clause = i + 1, [], ""
            if toks[j][1] in ("by", "without"):
                clause = toks[j][1]
                labels, j = label_list(toks, j + 1)
            end = closing(toks, j)
            if end + 1 < len(toks) and toks[end + 1][1] in ("by", "without"):
                clause = toks[end + 1][1]
                labels, after = label_list(toks, end + 2)
                skip.update(range(end + 1, after))
            # "without" names labels to drop: nothing to check
            groupings.append((labels if clause == "by" else [], j))
            i = j
            continue
        if value in KEYWORDS:
            if value in ("on", "ignoring", "group_left", "group_right") and nxt == "(":
                raise AssertionError(f"vector matching is not checked here: {expr!r}")
            i += 1
            continue
        if value in FUNCTIONS and nxt == "(":
            i += 1
            continue
        assert nxt != "(", f"unknown function {value!r} in {expr!r}"
        query.metrics.append(value)
        metric_at[i] = value
        if nxt == "{":
            end = next(k for k in range(i + 1, len(toks)) if toks[k][1] == "}")
            inner = "".join(v for _, v in toks[i + 2 : end])
            matched = MATCHER.findall(inner)
            assert not MATCHER.sub("", inner), f"cannot read the matchers {inner!r} in {expr!r}"
            query.selected += [(value, label) for label, _, _ in matched]
            i = end
        i += 1
    for labels, start in groupings:
        end = closing(toks, start)
        inside = [m for k, m in metric_at.items() if start < k < end]
        query.grouped += [(m, label) for m in inside for label in labels]
    return query


def test_the_reader_finds_metrics_selectors_and_groupings() -> None:
    q = parse(
        'histogram_quantile(0.9, sum by (le, limit) (rate(governor_delay_seconds_bucket{limit=~"$limit"}[$__rate_interval])))'  # noqa: E501
    )
    assert q.metrics == ["governor_delay_seconds_bucket"]
    assert q.selected == [("governor_delay_seconds_bucket", "limit")]
    assert q.grouped == [
        ("governor_delay_seconds_bucket", "le"),
        ("governor_delay_seconds_bucket", "limit"),
    ]
    assert q.variables == {"limit", "__rate_interval"}
    q = parse("sum(rate(a_total[5m])) by (job) / max(b offset 1h) > 2 * 0.5")
    assert q.metrics == ["a_total", "b"]
    assert q.grouped == [("a_total", "job")]
    with pytest.raises(AssertionError, match="unknown function"):
        parse("rat(a_total[5m])")
    with pytest.raises(AssertionError, match="without a metric name"):
        parse('sum({__name__="a"})')


# -- the files -----------------------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def load_alerts() -> dict[str, Any]:
    data = yaml.safe_load(ALERTS.read_text())
    assert isinstance(data, dict)
    return data


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, expr) for every panel target and query variable."""
    out: list[tuple[str, str]] = []
    for panel in load_dashboard()["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    return out


def alert_queries() -> list[tuple[str, str]]:
    return [
        (f"alert {rule['alert']}", rule["expr"])
        for group in load_alerts()["groups"]
        for rule in group["rules"]
    ]


ALL = dashboard_queries() + alert_queries()


def check(where: str, expr: str) -> Query:
    q = parse(expr)
    assert q.metrics, f"{where}: no metric in {expr!r}"
    for name in q.metrics:
        assert name in EXPORTED, f"{where}: governor exports no {name!r} ({sorted(EXPORTED)})"
    for name, label in q.selected + q.grouped:
        assert label in EXPORTED[name] | SCRAPE_LABELS, f"{where}: {name} has no label {label!r}"
    return q


@pytest.mark.parametrize(("where", "expr"), ALL, ids=[w for w, _ in ALL])
def test_every_query_names_exported_metrics_and_labels(where: str, expr: str) -> None:
    check(where, expr)


def test_the_exported_names_are_what_the_readme_lists() -> None:
    for name in ("governor_admitted_total", "governor_delay_seconds_bucket", "governor_running"):
        assert name in EXPORTED
    assert EXPORTED["governor_deferred_total"] == {"limit", "rule", "booked"}
    assert EXPORTED["governor_delay_seconds_bucket"] == {"limit", "le"}
    assert "governor_admitted" not in EXPORTED and "governor_unavailable_total" not in EXPORTED


def test_the_dashboard_is_a_grafana_dashboard_on_a_datasource_variable() -> None:
    dash = load_dashboard()
    assert dash["title"] and dash["uid"] and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["DS_PROMETHEUS"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    limit = variables["limit"]
    assert limit["type"] == "query" and limit["multi"] and limit["includeAll"]
    assert limit["datasource"]["uid"] == "${DS_PROMETHEUS}"
    definition = re.fullmatch(r"label_values\((\w+), (\w+)\)", limit["definition"])
    assert definition, limit["definition"]
    assert definition[2] in EXPORTED[definition[1]]
    assert limit["query"]["query"] == limit["definition"]
    assert "__inputs" not in dash  # the variable serves both import and provisioning

    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(graphs) >= 10
    used: set[str] = set()
    for panel in graphs:
        assert panel["type"] in ("timeseries", "stat"), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        targets = panel["targets"]
        assert targets, panel["title"]
        assert len({t["refId"] for t in targets}) == len(targets)
        for target in targets:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
            q = parse(target["expr"])
            assert q.variables <= set(variables) | GRAFANA_VARIABLES, target["expr"]
            used.update(q.metrics)
    # every metric family governor exports has a panel
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in EXPORTED}
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used}
    assert families <= shown, families - shown


DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")


def test_the_alert_rules_are_prometheus_rules() -> None:
    groups = load_alerts()["groups"]
    assert [g["name"] for g in groups] == ["governor"]
    rules = {r["alert"]: r for r in groups[0]["rules"]}
    assert set(rules) == {
        "GovernorRedisUnavailable",
        "GovernorDeferralsDominate",
        "GovernorLatenessHigh",
        "GovernorParkedTasksGrowing",
        "GovernorSlotsLost",
        "GovernorDeadLetters",
    }
    for name, rule in rules.items():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, name
        assert DURATION.fullmatch(rule["for"]), (name, rule["for"])
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        q = parse(rule["expr"])
        assert not q.variables, f"{name}: Grafana variables in a Prometheus rule"
        # labels the annotations quote must survive the expression's aggregations
        quoted = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"])))
        kept = {label for _, label in q.grouped}
        assert quoted <= kept, (name, quoted - kept)
    assert rules["GovernorRedisUnavailable"]["labels"]["severity"] == "critical"


GRAFANA_VALUES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$limit": ".*"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_promtool_accepts_the_rules_and_the_dashboard_queries(tmp_path: Path) -> None:
    """Prometheus' own parser: the alert file as it is, the panels' queries as recording rules
    (Grafana's variables replaced by values)."""
    done = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = []
    for n, (_, expr) in enumerate(dashboard_queries()):
        for name, value in GRAFANA_VALUES.items():
            expr = expr.replace(name, value)
        records.append({"record": f"governor:panel{n}", "expr": expr})
    panels = tmp_path / "panels.yml"
    panels.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": records}]}))
    done = subprocess.run(
        ["promtool", "check", "rules", str(panels)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
