"""Every benchmark runs in its quick mode and writes its JSON, so that none can rot.

Nothing here looks at a time or a ratio: only that each benchmark runs, that the jobs end
where they should (its exit code), and that its results have their shape. The fixture
the sweep benchmarks build in bulk is checked against real workers killed mid-job.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from benchmarks import fixture, report
from benchmarks.scenarios import CASES, QUEUE, SPECIFIED_FLOOR_SCRIPT, compact_script, prepare
from rq_epoch import Sweeper, keys, scripts
from tests.conftest import ROOT, SERVER_KINDS

#: Every test here runs a benchmark (or builds its fixture) with real servers and workers.
pytestmark = pytest.mark.slow

#: Module, and the keys its JSON must have.
BENCHMARKS = {
    'sweep_vs_cleanup': ('rows', 'sizes', 'server'),
    'sweep_anatomy': ('rows', 'repeat', 'server'),
    'call_cost': ('rows', 'rounds', 'batches', 'server'),
    'sweep_latency': ('baseline', 'during', 'batch_study', 'targets'),
    'worker_throughput': ('runs', 'summary'),
    'heartbeat': ('real_workers', 'latency', 'idle_sweep', 'targets'),
    'memory': ('rows',),
    'detection': ('runs', 'summary'),
    'pickup': ('runs', 'fleet', 'wait_alone', 'summary'),
    'fleet': ('cells', 'simulated', 'growth', 'targets'),
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


@pytest.mark.parametrize('kind', [k for k in SERVER_KINDS if k != 'valkey'])
def test_sweep_benchmark_runs_on_other_servers(kind: str, tmp_path: Path) -> None:
    doc = run_quick('sweep_vs_cleanup', tmp_path / 'sweep.json', '--server', kind)
    assert doc['server'].startswith(kind)
    cases = {row['case'] for row in doc['rows']}
    assert cases == {'stock-retry', 'exempt', 'recovered', 'stock-fail', 'dead', 'floor', 'dead-floor'}
    assert all(row['ok'] for row in doc['rows'])


def test_sweep_benchmark_repeats_stock_cases_only_when_asked(tmp_path: Path) -> None:
    cases = ('--cases', 'stock-fail,dead,dead-floor', '--repeat', '2')
    once = run_quick('sweep_vs_cleanup', tmp_path / 'once.json', *cases)
    again = run_quick('sweep_vs_cleanup', tmp_path / 'again.json', *cases, '--repeat-stock')
    runs = {
        doc_name: {row['case']: len(row['extra'].get('runs_seconds', [0])) for row in doc['rows']}
        for doc_name, doc in (('once', once), ('again', again))
    }
    assert runs == {
        'once': {'stock-fail': 1, 'dead': 2, 'dead-floor': 2},
        'again': {'stock-fail': 2, 'dead': 2, 'dead-floor': 2},
    }
    assert all(row['ok'] for row in once['rows'] + again['rows'])
    # Paired ratios: the median over the rounds of the ratio within each round.
    for doc in (once, again):
        rows = {row['case']: row for row in doc['rows']}
        dead, floor = rows['dead']['extra']['runs_seconds'], rows['dead-floor']['extra']['runs_seconds']
        assert rows['dead']['vs_floor_paired'] == round(
            statistics.median(d / f for d, f in zip(dead, floor, strict=True)), 2
        )
    stock = {row['case']: row for row in again['rows']}['stock-fail']['extra']['runs_seconds']
    dead = {row['case']: row for row in again['rows']}['dead']
    assert dead['speedup_paired'] == round(
        statistics.median(s / d for s, d in zip(stock, dead['extra']['runs_seconds'], strict=True)), 2
    )
    assert {row['case']: row for row in once['rows']}['dead']['speedup_paired'] is None  # stock ran once


def test_sweep_anatomy_interleaved_calls_every_variant_on_one_set_of_leases(tmp_path: Path) -> None:
    doc = run_quick('sweep_anatomy', tmp_path / 'anatomy.json', '--interleave')
    assert doc['interleave'] is True
    steps = [row['step'] for row in doc['rows']]
    assert steps[0] == 'script alone' and steps[-3:] == ['floor', 'floor, gathered', 'read and drop']
    assert all(row['ok'] and row['calls'] >= 2 for row in doc['rows'])
    assert len({row['calls'] for row in doc['rows']}) == 1  # one call of each per round


def test_sweep_anatomy_side_by_side_measures_every_size_at_the_same_moments(tmp_path: Path) -> None:
    doc = run_quick('sweep_anatomy', tmp_path / 'anatomy.json', '--interleave', '--sizes', '600,1200', '--side-by-side')
    assert doc['side_by_side'] is True
    rows = doc['rows']
    assert sorted({row['n'] for row in rows}) == [600, 1200]
    assert all(row['ok'] and row['calls'] >= 2 for row in rows)
    assert len({row['calls'] for row in rows}) == 1  # each size as many calls as the smallest allows
    assert all(row['growth'] is not None for row in rows if row['n'] == 1200)


def test_sweep_anatomy_ballast_adds_jobs_that_no_variant_reads(tmp_path: Path) -> None:
    doc = run_quick(
        'sweep_anatomy',
        tmp_path / 'anatomy.json',
        '--interleave',
        '--ballast',
        '500',
        '--no-aof',
        '--server-config',
        'hash-max-listpack-entries=0',
    )
    assert doc['ballast'] == 500 and doc['aof'] is False
    assert doc['server_config'] == {'hash-max-listpack-entries': '0'}
    assert all(row['ok'] and row['ballast'] == 500 for row in doc['rows'])


def test_sweep_anatomy_rounds_pool_the_calls_of_sets_made_again(tmp_path: Path) -> None:
    one = run_quick('sweep_anatomy', tmp_path / 'one.json', '--interleave', '--sizes', '600', '--floors-only')
    two = run_quick(
        'sweep_anatomy', tmp_path / 'two.json', '--interleave', '--sizes', '600', '--floors-only', '--rounds', '2'
    )
    assert [row['step'] for row in one['rows']] == ['script alone', 'floor', 'floor, gathered']
    assert two['rounds'] == 2 and two['floors_only'] is True
    assert all(row['ok'] for row in one['rows'] + two['rows'])
    assert [row['calls'] for row in two['rows']] == [2 * row['calls'] for row in one['rows']]


def test_sweep_anatomy_recovered_verdicts_are_judged_beside_the_floors_exempt_set(tmp_path: Path) -> None:
    doc = run_quick(
        'sweep_anatomy',
        tmp_path / 'anatomy.json',
        '--interleave',
        '--sizes',
        '600',
        '--floors-only',
        '--verdict',
        'recovered',
    )
    assert doc['verdict'] == 'recovered'
    # ok: every lease the script judged was counted as recovered, the floors requeued their own set
    assert all(row['ok'] and row['verdict'] == 'recovered' and row['calls'] >= 2 for row in doc['rows'])


def test_sweep_anatomy_written_out_compact_and_specified_floor_judge_as_the_script_does(tmp_path: Path) -> None:
    for verdict in ('exempt', 'recovered'):
        doc = run_quick(
            'sweep_anatomy',
            tmp_path / f'{verdict}.json',
            '--interleave',
            '--sizes',
            '600',
            '--floors-only',
            '--written-out',
            '--specified',
            '--compact',
            '--verdict',
            verdict,
        )
        assert doc['written_out'] is True and doc['specified'] is True and doc['compact'] is True
        assert [row['step'] for row in doc['rows']] == [
            'script alone',
            'written out',
            '- stock entries',
            'compact',
            'floor, specified',
            'floor',
            'floor, gathered',
        ]
        # ok: every lease requeued, and with recovered every one counted as recovered
        assert all(row['ok'] and row['calls'] >= 2 for row in doc['rows']), doc['rows']
        assert all(row['server_vs_specified_floor'] is not None for row in doc['rows'])


#: The job fields the specified floor writes: the specification's part of a requeue.
SPECIFIED_FIELDS = ('status', 'stalled', 'exempt_recoveries')


def _after(conn: redis.Redis, job_ids: list[str], executions: dict[str, str]) -> dict[str, tuple]:
    """Per job: the specified fields, the record of its taken lease, whether its lease and RQ's entry are gone,
    and whether it is queued."""
    queued = {job_id.decode() for job_id in conn.lrange(keys.queue_key(QUEUE), 0, -1)}
    out = {}
    for job_id in job_ids:
        execution = executions[job_id]
        fields = conn.hmget(keys.job_key(job_id), *SPECIFIED_FIELDS, keys.taken_field(execution))
        out[job_id] = (
            *fields,
            conn.zscore(keys.leases_key(QUEUE), job_id),
            conn.zscore(keys.wip_key(QUEUE), f'{job_id}:{execution}'),
            job_id in queued,
        )
    return out


@pytest.mark.parametrize('verdict', ['exempt', 'recovered'])
def test_the_specified_floor_writes_what_the_sweep_writes_for_the_specification(
    conn: redis.Redis, verdict: str
) -> None:
    """The same leases judged by the sweep and by the specified floor end alike in what the
    specification asks (the counts, the record of the taken lease, requeued at the front)."""
    ended = {}
    for who in ('sweep', 'specified floor'):
        jobs = prepare(conn, CASES[verdict], 5)
        executions = {j: conn.hget(keys.job_key(j), 'lease_execution').decode() for j in jobs.job_ids}
        if who == 'sweep':
            report = Sweeper(conn, restart_grace=0).sweep([QUEUE])
            assert {v.verdict for v in report.verdicts} == {verdict}
        else:
            lease_keys = [keys.leases_key(QUEUE), keys.wip_key(QUEUE), keys.finishing_key(), keys.stats_key(QUEUE)]
            reply = conn.eval(SPECIFIED_FLOOR_SCRIPT, len(lease_keys), *lease_keys, keys.PREFIX, QUEUE, 30, 3)
            assert int(reply[12]) == 5
        ended[who] = sorted(_after(conn, jobs.job_ids, executions).values())
    assert ended['sweep'] == ended['specified floor']
    counted = {'exempt': (None, b'1'), 'recovered': (b'1', None)}[verdict]
    assert all(row[:5] == (b'queued', *counted, verdict.encode(), None) for row in ended['sweep'])
    assert all(row[5] is None and row[6] is True for row in ended['sweep'])


@pytest.mark.parametrize('verdict', ['exempt', 'recovered'])
def test_the_compact_script_leaves_leases_as_the_sweep_does(conn: redis.Redis, verdict: str) -> None:
    """The same leases judged by the sweep and by the compact script end alike: the job's fields,
    the record of the taken lease, RQ's entries, the queue, the counters and the reply's records."""
    ended, lines = {}, {}
    for who in ('sweep', 'compact'):
        conn.delete(keys.stats_key(QUEUE))
        jobs = prepare(conn, CASES[verdict], 5)
        executions = {j: conn.hget(keys.job_key(j), 'lease_execution').decode() for j in jobs.job_ids}
        sweep_keys = [
            keys.leases_key(QUEUE),
            keys.wip_key(QUEUE),
            keys.finishing_key(),
            keys.stats_key(QUEUE),
            keys.legacy_leases_key(QUEUE),
        ]
        source = scripts.sweep().source if who == 'sweep' else compact_script()
        conn.delete(keys.queues_key())  # the requeue must register the queue again
        reply = conn.eval(source, len(sweep_keys), *sweep_keys, keys.PREFIX, QUEUE, 30, 3, 0, 86400, '0', 0, 0, 0)
        lines[who] = sorted(line.split(b' ', 1)[0] for line in reply[13].split(b'\n'))
        after = _after(conn, jobs.job_ids, executions)
        extra = {j: tuple(conn.hmget(keys.job_key(j), 'started_at', 'stall_epochs')) for j in jobs.job_ids}
        ended[who] = (
            sorted((*after[j], *extra[j]) for j in jobs.job_ids),
            conn.hget(keys.stats_key(QUEUE), verdict),
            conn.sismember(keys.queues_key(), keys.queue_key(QUEUE)),
        )
    assert ended['sweep'] == ended['compact']
    assert ended['sweep'][1:] == (b'5', True)
    assert lines['sweep'] == lines['compact'] == [verdict.encode()] * 5


def test_report_renders_every_section(results_dir: Path) -> None:
    for module in BENCHMARKS:
        if not (results_dir / f'{module}.json').exists():  # this test was run alone
            run_quick(module, results_dir / f'{module}.json')
    text = report.markdown(results_dir)
    for heading in (
        '### 1. Sweep vs stock cleanup',
        '### 2. What a cleanup does',
        '### 3. Worker throughput',
        '### 4. Server memory per running job',
        '### 5. Picking up jobs on several queues',
        '### 6. A fleet of workers',
    ):
        assert heading in text


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


def test_bulk_fixture_matches_real_workers_killed_mid_job() -> None:
    differences = fixture.validate('valkey', n_jobs=2)
    assert differences == {'stock': [], 'rq-epoch': []}


def test_sweep_benchmark_gives_failing_jobs_as_many_dependents_as_asked(tmp_path: Path) -> None:
    cases = ('--cases', 'stock-fail,dead,dead-floor')
    none = run_quick('sweep_vs_cleanup', tmp_path / 'none.json', *cases, '--dependents-every', '0')
    fourth = run_quick('sweep_vs_cleanup', tmp_path / 'fourth.json', *cases, '--dependents-every', '4')
    for doc, dependents in ((none, 0), (fourth, 50)):  # --quick: 200 jobs
        assert doc['dependents_every'] in (0, 4)
        for row in doc['rows']:
            assert row['checks']['expected']['queued'] == row['checks']['found']['queued'] == dependents, row['case']
    bad = subprocess.run(
        [sys.executable, '-m', 'benchmarks.sweep_vs_cleanup', '--quick', '--dependents-every', '-1'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and '--dependents-every must be 0 or more' in bad.stderr
