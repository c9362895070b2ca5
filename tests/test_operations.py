"""The operations kit stays true to the code: the Prometheus scrape config and alert rules parse
and every PromQL expression names only metrics amc exports (with the right suffix for their
type), and the Grafana dashboard is valid JSON whose panels cover every exported metric.

There is no promtool here, so PromQL is checked for what a typo breaks most often: unknown
metric names, a counter read without `_total`, a histogram without `_bucket`/`_count`/`_sum`,
and unbalanced brackets."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloud import metrics as cloud_metrics
from host import metrics as host_metrics

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "amc-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"

NAME = re.compile(r"\b(amc_[a-z0-9_]+)\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}


def exported() -> dict[str, str]:
    """Every metric family amc exports: name -> type."""
    return {
        family.name: family.type
        for registry in (cloud_metrics.REGISTRY, host_metrics.REGISTRY)
        for family in registry.collect()
    }


def families_in(expr: str) -> set[str]:
    """The metric families an expression reads; fails on a name amc does not export."""
    known = exported()
    found: set[str] = set()
    for name in NAME.findall(expr):
        family = next(
            (
                name.removesuffix(suffix)
                for kind, suffixes in SUFFIXES.items()
                for suffix in suffixes
                if name.endswith(suffix) and known.get(name.removesuffix(suffix)) == kind
            ),
            name,
        )
        assert family in known, f"{name!r} in {expr!r} is not a metric amc exports"
        if known[family] in SUFFIXES:
            assert family != name, f"{name!r}: a {known[family]} is read with a suffix"
        found.add(family)
    assert found, f"{expr!r} reads no amc metric"
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack: list[str] = []
    for char in re.sub(r'"[^"]*"', "", expr):
        if char in pairs:
            stack.append(pairs[char])
        elif char in pairs.values():
            assert stack and stack.pop() == char, f"unbalanced brackets in {expr!r}"
    assert not stack, f"unbalanced brackets in {expr!r}"
    return found


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load((PROMETHEUS / "amc-alerts.yml").read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_the_scrape_config_scrapes_clouds_and_hosts_and_loads_the_rules() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert {job["job_name"] for job in config["scrape_configs"]} == {"amc-cloud", "amc-host"}
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS / rule_file).is_file()


@pytest.mark.parametrize("rule", rules(), ids=lambda r: str(r["alert"]))
def test_each_alert_rule_is_complete_and_reads_exported_metrics(rule: dict[str, Any]) -> None:
    assert re.fullmatch(r"Amc[A-Za-z]+", rule["alert"])
    assert rule["labels"]["severity"] in {"info", "warning", "critical"}
    assert rule["annotations"]["summary"]
    if "for" in rule:
        assert re.fullmatch(r"\d+[smh]", rule["for"])
    families_in(rule["expr"])


def test_the_alerts_that_matter_are_there() -> None:
    read = {rule["alert"]: families_in(rule["expr"]) for rule in rules()}
    assert "amc_cloud_queue_depth" in read["AmcQueueGrowing"]
    assert "amc_cloud_lease_renewals" in read["AmcNoRenewals"]
    assert "amc_cloud_provider_errors" in read["AmcProviderErrorRate"]
    assert {"amc_cloud_spend_today_usd", "amc_cloud_daily_budget_usd"} <= read[
        "AmcDailyBudgetNearlySpent"
    ]


def test_the_dashboard_is_grafana_json_covering_every_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    shown: set[str] = set()
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["gridPos"]["w"] > 0 and panel["targets"]
        for target in panel["targets"]:
            shown |= families_in(target["expr"])
    assert set(exported()) - shown == set(), "every metric has a panel"


def test_the_operations_guide_names_every_metric_and_the_files() -> None:
    text = OPERATIONS.read_text()
    for name in exported():
        assert f"`{name}" in text, f"docs/operations.md does not describe {name}"
    for path in ("deploy/prometheus/prometheus.yml", "deploy/prometheus/amc-alerts.yml"):
        assert path in text
    assert "deploy/grafana/amc-dashboard.json" in text
