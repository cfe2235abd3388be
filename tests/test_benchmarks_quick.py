"""Every benchmark runs in its quick mode and writes its JSON, so that none can rot.

Nothing here looks at a time or a ratio: only that each benchmark runs, that the jobs end
where they should (its exit code), and that its results have their shape. The fixture
the sweep benchmarks build in bulk is checked against real workers killed mid-job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import fixture, report
from tests.conftest import ROOT, SERVER_KINDS

#: Every test here runs a benchmark (or builds its fixture) with real servers and workers.
pytestmark = pytest.mark.slow

#: Module, and the keys its JSON must have.
BENCHMARKS = {
    'sweep_vs_cleanup': ('rows', 'sizes', 'repeat', 'server'),
    'sweep_latency': ('baseline', 'during', 'batch_study'),
    'worker_throughput': ('runs', 'summary'),
    'durable': ('latency', 'throughput', 'enqueue', 'summary'),
    'heartbeat': ('real_workers', 'latency', 'idle_sweep', 'targets'),
    'memory': ('rows',),
    'detection': ('runs', 'summary'),
    'pickup': ('runs', 'wait_alone', 'summary'),
    'fleet': ('cells', 'simulated', 'growth', 'targets'),
    'page_viewers': ('state', 'commands_per_render', 'rows', 'ratios'),
    'deploy': ('runs', 'summary', 'settings', 'graces'),
}


def run_quick(module: str, out: Path, *extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith('RQ_EPOCH_')}
    env['PYTHONPATH'] = str(ROOT) + os.pathsep + env.get('PYTHONPATH', '')
    proc = subprocess.run(
        [sys.executable, '-m', f'benchmarks.{module}', '--quick', '--out', str(out), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f'{module} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}'
    return json.loads(out.read_text(encoding='utf-8'))


@pytest.fixture(scope='module')
def results_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the module's results, so the report test can reuse them."""
    return tmp_path_factory.mktemp('bench-results')


@pytest.mark.parametrize('module', list(BENCHMARKS))
def test_benchmark_runs_in_quick_mode(module: str, results_dir: Path) -> None:
    doc = run_quick(module, results_dir / f'{module}.json')
    assert doc['benchmark'] == module
    assert doc['quick'] is True
    for key in BENCHMARKS[module]:
        assert key in doc, f'{module} results lack {key!r}'
    assert doc['environment']['server']


@pytest.mark.parametrize('kind', [k for k in SERVER_KINDS if k == 'redis'])  # the benchmarks' --server choices
def test_sweep_benchmark_runs_on_other_servers(kind: str, tmp_path: Path) -> None:
    doc = run_quick('sweep_vs_cleanup', tmp_path / 'sweep.json', '--server', kind)
    assert doc['server'].startswith(kind)
    assert [row['case'] for row in doc['rows']] == list(fixture.CASES)
    assert all(row['ok'] for row in doc['rows'])


def test_sweep_benchmark_keeps_the_median_of_repeated_runs_and_compares_it_with_stock(tmp_path: Path) -> None:
    doc = run_quick('sweep_vs_cleanup', tmp_path / 'sweep.json', '--cases', 'dead,stock-fail', '--repeat', '3')
    rows = {row['case']: row for row in doc['rows']}
    assert list(rows) == ['stock-fail', 'dead']  # the stock case first, whatever the order asked
    for row in rows.values():
        assert row['ok'] and len(row['runs_seconds']) == 3
        assert row['seconds'] == sorted(row['runs_seconds'])[1]
    assert rows['dead']['vs'] == 'stock-fail'
    assert rows['dead']['speedup'] == round(rows['stock-fail']['seconds'] / rows['dead']['seconds'], 2)
    dead = rows['dead']['checks']
    assert dead['found']['callbacks'] == dead['expected']['callbacks'] == 200  # every job's on_failure ran
    assert dead['found']['queued'] == 20  # one job in ten had a dependent, enqueued when it failed


def test_sweep_benchmark_refuses_an_unknown_case() -> None:
    bad = subprocess.run(
        [sys.executable, '-m', 'benchmarks.sweep_vs_cleanup', '--quick', '--cases', 'floor'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and '--cases takes stock-retry' in bad.stderr


def test_report_renders_every_section(results_dir: Path) -> None:
    for module in BENCHMARKS:
        if not (results_dir / f'{module}.json').exists():  # this test was run alone
            run_quick(module, results_dir / f'{module}.json')
    text = report.markdown(results_dir)
    for heading in (
        '### Sweep vs stock cleanup',
        '### What a cleanup does to other clients',
        '### Worker throughput',
        '### Durable grants and outcomes',
        '### Heartbeats',
        '### Server memory per running job',
        "### Time until a dead worker's job runs again",
        '### Picking up jobs on several queues',
        '### A fleet of workers',
        "### The exporter's page with many viewers",
        '### A job cut short by a deploy',
    ):
        assert heading in text


def test_throughput_parts_each_leave_their_part_out_beside_stock(tmp_path: Path) -> None:
    """``--parts``: the worker without the fence sends no commit script (its one script call
    per job is the grant), RQ's worker beside rq-epoch's code none, and every side ran every job."""
    doc = run_quick('worker_throughput', tmp_path / 'parts.json', '--parts')
    assert [r['side'] for r in doc['runs']] == ['stock', 'rq-epoch', 'rq-epoch unfenced', 'stock beside rq-epoch']
    assert all(r['ok'] for r in doc['runs'])
    s = doc['summary']
    assert s['stock']['scripts_per_job'] == s['stock beside rq-epoch']['scripts_per_job'] == 0
    assert 0 < s['rq-epoch unfenced']['scripts_per_job'] < s['rq-epoch']['scripts_per_job']
    assert s['rq-epoch']['script_server_ms_per_job'] > s['stock']['script_server_ms_per_job'] == 0
    for side in ('stock', 'rq-epoch', 'rq-epoch unfenced', 'stock beside rq-epoch'):
        # The kernel's share of the worker's CPU (the fork, the page copies) is part of it.
        assert 0 < s[side]['worker_system_cpu_ms_per_job'] < s[side]['worker_cpu_ms_per_job']
    section = report.throughput_section(doc)
    assert '| of which in the kernel ms / job |' in section
    assert '| ratio rq-epoch unfenced / stock |' in section
    assert '| ratio stock beside rq-epoch / stock |' in section


def test_fleet_benchmark_measures_both_sides_of_every_fleet(results_dir: Path) -> None:
    """Each side's fleet registered, idled and ran every paced job; the simulated fleet too."""
    path = results_dir / 'fleet.json'
    doc = json.loads(path.read_text(encoding='utf-8')) if path.exists() else run_quick('fleet', path)
    assert [(c['workers'], c['queues']) for c in doc['cells']] == [(3, 2)]
    assert [(c['workers'], c['queues']) for c in doc['simulated']] == [(20, 2)]
    for cell in doc['cells'] + doc['simulated']:
        for side in ('stock', 'rq-epoch'):
            run = cell[side]
            assert run['ok'] and run['side'] == side
            assert run['pickup']['n'] == run['jobs'] > 0  # every job started, and its latency was read
            assert run['connections'] >= cell['workers']  # the benchmark's own connection left out
            assert run['jobs_busiest']  # the server ran the fleet's commands
        assert cell['stock']['clients']['blocked_clients'] == cell['workers']  # stock waits in BLPOP


def test_a_repeated_fleet_cell_reports_each_sides_median_and_keeps_every_fleet() -> None:
    """``--repeat``: a side's figures are the medians of its fleets, which are kept beside them."""
    from benchmarks.fleet import FIGURES, median_run

    def fleet(cpu: float, connections: int, p50: float) -> dict:
        run = {figure: 1.0 for figure in FIGURES}
        run.update(cpu_ms_per_job=cpu, connections=connections, load_average=1.0, ok=True)
        run['pickup'] = {'p50_ms': p50, 'p99_ms': 2 * p50}
        return run

    runs = [fleet(3.0, 9, 12.0), fleet(2.0, 9, 14.0), fleet(2.5, 9, 11.0)]
    side = median_run(runs)
    assert side['cpu_ms_per_job'] == 2.5
    assert side['connections'] == 9 and isinstance(side['connections'], int)
    assert side['pickup'] == {'p50_ms': 12.0, 'p99_ms': 24.0}
    assert side['repeats'] == runs
    assert median_run(runs[:1]) is runs[0]


def test_bulk_fixture_matches_real_workers_killed_mid_job() -> None:
    differences = fixture.validate('valkey', n_jobs=2)
    assert differences == {'stock': [], 'rq-epoch': []}


def test_deploy_benchmark_hands_back_or_recovers_every_stopped_job_and_reports_stocks(results_dir: Path) -> None:
    """rq-epoch's job runs again after every stop, uncounted: handed back after a long grace,
    requeued by the sweep (``stopping``) after a short one; stock's work-horse dies of the SIGTERM
    sent to every process, and its job is failed."""
    path = results_dir / 'deploy.json'
    doc = json.loads(path.read_text(encoding='utf-8')) if path.exists() else run_quick('deploy', path)
    epoch = [r for r in doc['runs'] if r['side'] == 'rq-epoch']
    assert sorted((r['sequence'], r['grace']) for r in epoch) == sorted(
        (sequence, grace) for sequence in ('term-then-kill', 'term-all-then-kill') for grace in doc['graces'].values()
    )
    for run in epoch:
        assert run['outcome'] == 'ran again' and run['stalled'] == 0, run
        expected = 'handed_back' if run['grace'] == doc['graces']['long'] else 'stopping'
        assert run['counters'].get(expected) == 1, run
    (stock,) = [r for r in doc['runs'] if r['side'] == 'stock']
    assert (stock['sequence'], stock['outcome']) == ('term-all-then-kill', 'failed'), stock
