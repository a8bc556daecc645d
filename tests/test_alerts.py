"""The alert rules, checked by Prometheus's own promtool: the rendered rules file is valid
(``promtool check rules``), each alert fires on the series that should raise it and not on the
others beside them (``promtool test rules``, tests/prometheus/), and the PrometheusRule carries
the same groups."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sluice.deploy import alerts
from sluice.deploy.manifests import RenderOptions, render, to_yaml
from tests.conftest import ROOT

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed: apt-get install prometheus")


@needs_promtool
def test_the_rendered_rules_file_passes_promtool_check(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(to_yaml([alerts.rules_file()]))
    checked = subprocess.run([str(PROMTOOL), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and f"SUCCESS: {len(alerts.RULES)} rules found" in checked.stdout, checked


@needs_promtool
def test_each_alert_fires_on_its_cause_and_not_beside_it() -> None:
    tested = subprocess.run([str(PROMTOOL), "test", "rules", str(ROOT / "tests/prometheus/sluice-rules.test.yml")],
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    test_file = yaml.safe_load((ROOT / "tests/prometheus/sluice-rules.test.yml").read_text())
    tested_alerts = {case["alertname"] for block in test_file["tests"] for case in block["alert_rule_test"]}
    assert tested_alerts == {alert for alert, *_ in alerts.RULES}


def test_the_prometheus_rule_holds_the_rules_files_groups() -> None:
    (rule,) = render_monitoring()
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == alerts.rules_file()
    assert (ROOT / "deploy/sluice-rules.yml").read_text() == to_yaml([alerts.rules_file()]), \
        "deploy/sluice-rules.yml drifted: run `sluice deploy render --out deploy`"


def render_monitoring() -> list[dict[str, object]]:
    from sluice.config import Settings

    return render(Settings.load(cwd=ROOT, env={}).catalog, RenderOptions())["monitoring.yaml"]
