"""examples/prometheus/: the scrape config and the alert rules, parsed and checked against a real scrape."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import redis
import yaml

from rq_epoch import Queue
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.ops.metrics import DEFAULT_PORT, LEASE_STATES, SWEPT_VERDICTS
from tests.conftest import ROOT
from tests.leases import CURRENT, start_job
from tests.test_metrics import ExporterProcess, get, parse
from tests.tools import system_tool

#: The examples do not depend on the server kind: one kind is enough.
pytestmark = pytest.mark.parametrize('server', ['valkey'], indirect=True)

HERE = ROOT / 'examples' / 'prometheus'
ALERTS = {
    'RqEpochExporterCannotReadServer',
    'RqEpochSweepsStopped',
    'RqEpochDeadLettersRising',
    'RqEpochLeasesDeferredPastGrace',
    'RqEpochCountedStallsRising',
}


def load(name: str) -> Any:
    return yaml.safe_load((HERE / name).read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in load('rq-epoch-alerts.yml')['groups'] for rule in group['rules']]


def test_scrape_config_points_at_the_exporter_and_loads_the_rules(server: EmbeddedServer, conn: redis.Redis) -> None:
    config = load('prometheus.yml')
    assert config['rule_files'] == ['rq-epoch-alerts.yml']
    assert all((HERE / name).is_file() for name in config['rule_files'])
    [job] = [job for job in config['scrape_configs'] if job['job_name'] == 'rq-epoch']
    assert job['static_configs'] == [{'targets': [f'127.0.0.1:{DEFAULT_PORT}']}]
    exporter = ExporterProcess(['--url', server.url])
    try:
        url = exporter.url.replace('/metrics', job['metrics_path'])
        assert parse(get(url))[('rq_epoch_up', ())] == 1
    finally:
        assert exporter.stop()[0] == 0


def test_alert_rules_cover_the_cases_and_name_only_metrics_the_exporter_serves(
    server: EmbeddedServer, conn: redis.Redis
) -> None:
    start_job(conn, Queue('default', connection=conn), epoch=CURRENT, expired=False)
    exporter = ExporterProcess(['--url', server.url])
    try:
        samples = parse(get(exporter.url))
    finally:
        exporter.stop()
    served = {name for name, _ in samples}
    assert {rule['alert'] for rule in rules()} == ALERTS
    for rule in rules():
        assert rule['labels']['severity'] in ('warning', 'critical')
        assert rule['annotations']['summary'] and rule['annotations']['description']
        names = set(re.findall(r'rq_epoch_\w+', rule['expr']))
        assert names and names <= served, (rule['alert'], names - served)
        for label, allowed in (('verdict', SWEPT_VERDICTS), ('state', LEASE_STATES)):
            for values in re.findall(label + r'=~?"([^"]+)"', rule['expr']):
                assert set(values.split('|')) <= set(allowed), (rule['alert'], values)


@pytest.mark.parametrize(
    'args',
    [
        ['check', 'config', 'prometheus.yml'],
        ['check', 'rules', 'rq-epoch-alerts.yml'],
        ['test', 'rules', 'rq-epoch-alerts.test.yml'],
    ],
    ids=['check-config', 'check-rules', 'test-rules'],
)
def test_promtool_accepts_the_config_and_the_rules_pass_their_unit_tests(
    server: EmbeddedServer, args: list[str]
) -> None:
    out = subprocess.run([system_tool('promtool'), *args], capture_output=True, text=True, cwd=HERE, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'SUCCESS' in out.stdout
