"""`deploy/prometheus/` alert rules and the `deploy/grafana/` dashboard: every metric
they use is one `/metrics` exports, and every expression is valid PromQL (`promtool`)."""

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.integration.test_api_harness import running_api

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "vigil-alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "vigil.json"
_METRIC = re.compile(r"\bvigil_[a-z0-9_]+\b")
_SUFFIX = re.compile(r"_(bucket|sum|count|total|created)$")


def _alert_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def _panel_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:  # never a silent skip: scripts/test and .ci/run install it
        pytest.fail("promtool is missing: install it (`sudo apt-get install prometheus`)")
    return found


async def test_every_metric_the_alerts_and_the_dashboard_use_is_exported(
    session_database_url: str,
) -> None:
    async with running_api(session_database_url, namespace=f"t{uuid.uuid4().hex[:8]}") as api:
        response = await api.client.get("/metrics", headers=api.user.headers)
    assert response.status_code == 200, response.text
    exported = {
        _SUFFIX.sub("", name) for name in re.findall(r"^# TYPE (\S+) ", response.text, re.M)
    }

    used = {
        _SUFFIX.sub("", name)
        for expr in _alert_exprs() + _panel_exprs()
        for name in _METRIC.findall(expr)
    }

    assert used, "the files name no metric"
    assert used - exported == set(), f"not in /metrics: {sorted(used - exported)}"
    # and what operators need most is watched: quarantine, the leader, outbox lag, dead letters
    alerts = " ".join(_alert_exprs())
    for needed in (
        "vigil_pool_hosts",
        "vigil_scheduler_leading",
        "vigil_outbox_oldest_seconds",
        'vigil_queue_messages{queue="dead_letters"}',
        "vigil_dead_letters",
        "vigil_attempts_failed",
    ):
        assert needed in alerts, needed


def test_the_alert_rules_and_every_panel_expression_are_valid_promql(tmp_path: Path) -> None:
    promtool = _promtool()
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    panels = {
        "groups": [
            {
                "name": "panels",
                "rules": [
                    {"record": f"vigil_panel:{n}", "expr": expr}
                    for n, expr in enumerate(_panel_exprs())
                ],
            }
        ]
    }
    as_rules = tmp_path / "panels.yml"
    as_rules.write_text(yaml.safe_dump(panels))
    checked = subprocess.run(
        [promtool, "check", "rules", str(as_rules)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
