"""What ships beside the metrics: the alert rules (checked and unit-tested by promtool), the
Grafana dashboard (every query valid PromQL over metrics Tether exposes) and the metric
list of docs/observability.md (every metric, with its labels)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tether.metrics import METRICS

from ..helpers import ROOT
from ..metrics_helpers import promtool_run

ASSETS = ROOT / "docs" / "observability"
GUIDE = ROOT / "docs" / "observability.md"
EXPOSED = {series for spec in METRICS for series in spec.series}
METRIC_NAME = re.compile(r"\btether_[a-z_]+\b")
# What Grafana puts in a query before Prometheus sees it.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$queue": ".*", "$task": ".*"}


def test_the_alert_rules_pass_promtool() -> None:
    assert "SUCCESS: 10 rules found" in promtool_run("check", "rules", ASSETS / "alerts.yml")


def test_the_alert_rules_fire_as_their_unit_tests_say() -> None:
    assert "SUCCESS" in promtool_run("test", "rules", ASSETS / "alerts_test.yml")


def test_the_alert_rules_use_only_metrics_tether_exposes() -> None:
    used = set(METRIC_NAME.findall((ASSETS / "alerts.yml").read_text()))
    assert used and used <= EXPOSED, used - EXPOSED


def _queries(node: Any) -> list[str]:
    """Every PromQL query of a dashboard: panel targets and the variables' queries."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                found.append(value)
            else:
                found += _queries(value)
    elif isinstance(node, list):
        for item in node:
            found += _queries(item)
    return found


def test_the_dashboard_queries_are_valid_promql_over_tether_metrics(tmp_path: Path) -> None:
    dashboard = json.loads((ASSETS / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] == "tether-queues"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    for panel in panels:
        assert panel["title"] and panel["description"], panel
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    queries = _queries(dashboard)
    exprs = [q for q in queries if not q.startswith("label_values(")]
    assert len(exprs) >= len(panels)
    # Every metric a query names is one Tether exposes (a histogram's _bucket included)...
    for query in queries:
        used = set(METRIC_NAME.findall(query))
        assert used, f"a query that reads no Tether metric: {query}"
        assert used <= EXPOSED, f"{query} reads {used - EXPOSED}, which Tether does not expose"
    # ... and every panel query is valid PromQL: promtool checks them as recording rules.
    rules = []
    for n, expr in enumerate(exprs):
        query = expr
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        assert "$" not in query, f"a Grafana variable this test does not know: {expr}"
        rules.append({"record": f"tether:dashboard:query{n}", "expr": query})
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in promtool_run("check", "rules", path)


def test_the_guide_lists_every_metric_with_its_labels() -> None:
    guide = GUIDE.read_text()
    rows = {
        match.group(1): match.group(0)
        for match in re.finditer(r"^\| `(tether_[a-z_]+)`[^\n]*$", guide, re.M)
    }
    assert set(rows) == {spec.name for spec in METRICS}
    for spec in METRICS:
        row = rows[spec.name]
        assert f"| {spec.kind} |" in row, row
        for label in spec.labels:
            assert f"`{label}`" in row, (spec.name, label)
