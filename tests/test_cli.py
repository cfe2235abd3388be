"""The ``rq-epoch`` command (sweep, status) against real servers, through click's runner and subprocesses."""

from __future__ import annotations

import inspect
import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from rq_epoch import Job, Queue
from rq_epoch.embedded import EmbeddedServer, find_server_binary, free_port
from rq_epoch.ops.cli import PROGRESS_THRESHOLD, main
from rq_epoch.protocol import keys
from tests.conftest import ROOT, wait_for
from tests.leases import CURRENT, OTHER_EPOCH, start_job

RQ_EPOCH = [sys.executable, '-c', 'from rq_epoch.ops.cli import main; main()']
# click < 8.2 mixes stderr into stdout unless told not to; 8.2 always keeps them apart.
_RUNNER_ARGS: dict[str, Any] = {'mix_stderr': False} if 'mix_stderr' in inspect.signature(CliRunner).parameters else {}


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run the command in-process, with RQ_* and REDIS_* variables of the caller ignored."""
    clean = {name: None for name in os.environ if name.startswith(('RQ_', 'REDIS_'))}
    return CliRunner(**_RUNNER_ARGS).invoke(main, list(args), env={**clean, **(env or {})}, catch_exceptions=False)


def run_process(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the command as a real process."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(('RQ_', 'REDIS_'))}
    environ['PYTHONPATH'] = str(ROOT) + os.pathsep + environ.get('PYTHONPATH', '')
    environ.update(env or {})
    return subprocess.run(
        [*RQ_EPOCH, *args], capture_output=True, text=True, env=environ, cwd=ROOT, timeout=timeout, check=False
    )


def snapshot(conn: redis.Redis) -> dict[bytes, Any]:
    """Every key with its type, value and whether it has a TTL."""
    state: dict[bytes, Any] = {}
    for key in sorted(conn.scan_iter(count=1000)):
        kind = conn.type(key).decode()
        if kind == 'string':
            value: Any = conn.get(key)
        elif kind == 'hash':
            value = conn.hgetall(key)
        elif kind == 'list':
            value = conn.lrange(key, 0, -1)
        elif kind == 'set':
            value = sorted(conn.smembers(key))
        elif kind == 'zset':
            value = conn.zrange(key, 0, -1, withscores=True)
        elif kind == 'stream':
            value = conn.xrange(key)
        else:
            value = conn.dump(key)
        state[key] = (kind, value, conn.ttl(key) >= 0)
    return state


def mixed_leases(conn: redis.Redis) -> dict[str, Job]:
    """Expired leases of every kind in queue 'mail': exempt, recovered, dead, ghost; one live lease."""
    queue = Queue('mail', connection=conn)
    jobs = {}
    jobs['exempt'], _ = start_job(conn, queue, epoch=OTHER_EPOCH)
    jobs['recovered'], _ = start_job(conn, queue, epoch=CURRENT)
    jobs['dead'], _ = start_job(conn, queue, epoch=CURRENT, max_stalled=1)
    jobs['live'], _ = start_job(conn, queue, epoch=CURRENT, expired=False)
    ghost, _ = start_job(conn, queue, epoch=CURRENT)
    conn.delete(ghost.key)
    return jobs


# -- sweep ---------------------------------------------------------------------------------


def test_sweep_prints_a_line_per_queue_with_its_verdict_counts(server: EmbeddedServer, conn: redis.Redis) -> None:
    jobs = mixed_leases(conn)
    Queue('empty', connection=conn).enqueue('tests.jobs.add', 1, 2)

    result = run('sweep', '-u', server.url, '-q', 'mail', '-q', 'empty', '--grace', '0')

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith('rq-epoch sweep: server epoch ' + conn.info('server')['run_id'])
    assert '4 expired lease(s) judged' in lines[0]
    assert lines[1].split() == ['mail', '1', 'ghost,', '1', 'exempt,', '1', 'recovered,', '1', 'dead']
    assert lines[2].split() == ['empty', 'nothing', 'expired']
    assert any(f'dead letter: job {jobs["dead"].id} (queue mail) stalled 1/1' in line for line in lines)
    assert result.stderr == ''
    assert jobs['dead'].get_status(refresh=True) == 'failed'
    jobs['recovered'].refresh()
    assert jobs['recovered'].stalled == 1


def test_sweep_json_is_one_report_with_the_counts(server: EmbeddedServer, conn: redis.Redis) -> None:
    jobs = mixed_leases(conn)

    result = run('sweep', '-u', server.url, '-q', 'mail', '--grace', '0', '--json')

    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report['run_id'] == conn.info('server')['run_id']
    assert report['dry_run'] is False
    assert report['total'] == 4
    expected = {
        'ghost': 1,
        'corrupt': 0,
        'settled': 0,
        'exempt': 1,
        'stopping': 0,
        'recovered': 1,
        'dead': 1,
        'deferred': 0,
    }
    assert report['queues'] == {'mail': expected}
    assert report['totals'] == expected
    assert report['finished'] == [jobs['dead'].id]
    assert {v['job_id']: v['verdict'] for v in report['verdicts']}[jobs['exempt'].id] == 'exempt'


def test_sweep_dry_run_writes_nothing(server: EmbeddedServer, conn: redis.Redis) -> None:
    mixed_leases(conn)
    before = snapshot(conn)

    result = run('sweep', '-u', server.url, '-q', 'mail', '--grace', '0', '--dry-run', '--json')

    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report['dry_run'] is True
    assert report['queues']['mail']['dead'] == 1 and report['queues']['mail']['exempt'] == 1
    assert snapshot(conn) == before

    text = run('sweep', '-u', server.url, '-q', 'mail', '--grace', '0', '--dry-run')
    assert text.exit_code == 0
    assert text.stdout.startswith('rq-epoch sweep --dry-run (nothing written)')
    assert 'would be dead-lettered' in text.stdout
    assert snapshot(conn) == before

    # The same sweep for real does change the server.
    assert run('sweep', '-u', server.url, '-q', 'mail', '--grace', '0').exit_code == 0
    assert snapshot(conn) != before


def test_sweep_quiet_prints_only_when_a_job_was_dead_lettered(server: EmbeddedServer, conn: redis.Redis) -> None:
    queue = Queue('mail', connection=conn)
    start_job(conn, queue, epoch=CURRENT)
    start_job(conn, queue, epoch=OTHER_EPOCH)

    quiet = run('sweep', '-u', server.url, '-q', 'mail', '--grace', '0', '--quiet')
    assert quiet.exit_code == 0
    assert quiet.stdout == '' and quiet.stderr == ''

    dead, _ = start_job(conn, queue, epoch=CURRENT, max_stalled=1)
    loud = run('sweep', '-u', server.url, '-q', 'mail', '--grace', '0', '--quiet')
    assert loud.exit_code == 0
    assert f'dead letter: job {dead.id}' in loud.stdout


def test_sweep_verbose_lists_every_lease(server: EmbeddedServer, conn: redis.Redis) -> None:
    jobs = mixed_leases(conn)
    result = run('sweep', '-u', server.url, '-q', 'mail', '--grace', '0', '-v')
    assert result.exit_code == 0
    assert f'mail job {jobs["exempt"].id} exempt' in result.stdout
    assert f'lease_epoch {OTHER_EPOCH}' in result.stdout


def test_sweep_defers_leases_of_an_older_process_during_the_grace(server: EmbeddedServer, conn: redis.Redis) -> None:
    start_job(conn, Queue('mail', connection=conn), epoch=OTHER_EPOCH)
    result = run('sweep', '-u', server.url, '-q', 'mail', '--grace', '100000')
    assert result.exit_code == 0
    assert '1 deferred' in result.stdout
    assert 'wait for the restart grace' in result.stdout


def test_sweep_all_takes_every_queue_in_rq_queues(server: EmbeddedServer, conn: redis.Redis) -> None:
    start_job(conn, Queue('alpha', connection=conn), epoch=OTHER_EPOCH)
    start_job(conn, Queue('beta', connection=conn), epoch=OTHER_EPOCH)

    result = run('sweep', '-u', server.url, '--all', '--grace', '0', '--json')

    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert sorted(report['queues']) == ['alpha', 'beta']
    assert report['totals']['exempt'] == 2


def test_queue_names_as_arguments_and_from_the_config_module(
    server: EmbeddedServer, conn: redis.Redis, tmp_path: Path
) -> None:
    start_job(conn, Queue('alpha', connection=conn), epoch=OTHER_EPOCH)
    start_job(conn, Queue('beta', connection=conn), epoch=OTHER_EPOCH)
    module = f'epoch_settings_{server.kind}_{server.port}'
    (tmp_path / f'{module}.py').write_text(f"REDIS_URL = '{server.url}'\nQUEUES = ['alpha', 'beta']\n")

    positional = run('sweep', '-u', server.url, 'alpha', '--grace', '0', '--dry-run', '--json')
    assert list(json.loads(positional.stdout)['queues']) == ['alpha']

    configured = run('sweep', '-c', module, '-P', str(tmp_path), '--grace', '0', '--json')
    assert configured.exit_code == 0, configured.output
    assert sorted(json.loads(configured.stdout)['queues']) == ['alpha', 'beta']


def test_rq_redis_url_from_the_environment(server: EmbeddedServer, conn: redis.Redis) -> None:
    start_job(conn, Queue('mail', connection=conn), epoch=OTHER_EPOCH)
    result = run('sweep', '-q', 'mail', '--grace', '0', '--json', env={'RQ_REDIS_URL': server.url})
    assert result.exit_code == 0
    assert json.loads(result.stdout)['totals']['exempt'] == 1


def test_serializer_and_job_class_options(server: EmbeddedServer, conn: redis.Redis) -> None:
    start_job(conn, Queue('mail', connection=conn), epoch=CURRENT, max_stalled=1)
    result = run('sweep', '-u', server.url, '-q', 'mail', '-S', 'pickle', '-j', 'rq.job.Job', '--json')
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)['totals']['dead'] == 1


def test_sweeps_from_many_processes_judge_each_lease_once(server: EmbeddedServer, conn: redis.Redis) -> None:
    queue = Queue('mail', connection=conn)
    for i in range(60):
        start_job(conn, queue, epoch=CURRENT if i % 2 else OTHER_EPOCH, max_stalled=1 if i % 4 == 1 else None)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(('RQ_', 'REDIS_'))}
    environ['PYTHONPATH'] = str(ROOT)
    argv = [*RQ_EPOCH, 'sweep', '-u', server.url, '-q', 'mail', '--grace', '0', '--batch-size', '7', '--json']
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ, cwd=ROOT)
        for _ in range(3)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    judged = [v['job_id'] for report in reports for v in report['verdicts']]
    assert len(judged) == 60
    assert len(set(judged)) == 60
    totals = {name: sum(r['totals'][name] for r in reports) for name in ('exempt', 'recovered', 'dead')}
    assert totals == {'exempt': 30, 'recovered': 15, 'dead': 15}


def test_progress_bar_on_a_terminal_for_a_large_sweep(server: EmbeddedServer, conn: redis.Redis) -> None:
    seconds, _ = conn.time()
    conn.zadd(keys.leases_key('big'), {f'gone{i}': seconds - 10 for i in range(PROGRESS_THRESHOLD + 1)})
    environ = {k: v for k, v in os.environ.items() if not k.startswith(('RQ_', 'REDIS_'))}
    environ['PYTHONPATH'] = str(ROOT)
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*RQ_EPOCH, 'sweep', '-u', server.url, '-q', 'big'],
            stdout=subprocess.PIPE,
            stderr=secondary,
            env=environ,
            cwd=ROOT,
        )
        os.close(secondary)
        terminal = b''
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                terminal += chunk
            elif proc.poll() is not None:
                break
        out, _ = proc.communicate(timeout=30)
    finally:
        os.close(primary)
    assert proc.returncode == 0
    assert f'big  {PROGRESS_THRESHOLD + 1} ghost' in out.decode()
    assert b'sweeping' in terminal and b'100%' in terminal


# -- status --------------------------------------------------------------------------------


def test_status_shows_the_epoch_leases_stalled_jobs_and_dead_letters(server: EmbeddedServer, conn: redis.Redis) -> None:
    queue = Queue('mail', connection=conn)
    dead, _ = start_job(conn, queue, epoch=CURRENT, max_stalled=1)
    stalled, _ = start_job(conn, queue, epoch=CURRENT, max_stalled=5)
    assert run('sweep', '-u', server.url, '-q', 'mail', '--quiet').exit_code == 0
    start_job(conn, queue, epoch=OTHER_EPOCH)
    start_job(conn, queue, epoch=CURRENT)
    start_job(conn, queue, epoch=CURRENT, expired=False)
    run_id = conn.info('server')['run_id']
    before = snapshot(conn)

    result = run('status', '-u', server.url, '--grace', '0')

    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f'server epoch: run_id {run_id}' in out
    assert 'role master' in out
    assert 'queue mail' in out
    assert ' '.join(line.strip() for line in out.splitlines() if 'live leases' in line).split() == [
        'live',
        'leases',
        '1',
    ]
    assert '2 (1 would be exempt, 1 counted; 1 exempt, 1 recovered)' in out
    assert f'{stalled.id}  stalled 1/5  queued' in out
    assert 'dead letters      1' in out and dead.id in out
    assert snapshot(conn) == before

    doc = json.loads(run('status', '-u', server.url, '-q', 'mail', '--grace', '0', '--json').stdout)
    assert doc['server']['run_id'] == run_id
    assert doc['restart_grace'] == 0
    mail = doc['queues']['mail']
    assert mail['live_leases'] == 1
    assert mail['expired_leases'] == 2
    assert mail['would_be_exempt'] == 1 and mail['would_be_counted'] == 1
    assert {j['job_id'] for j in mail['stalled_jobs']} == {stalled.id, dead.id}
    assert mail['dead_letters'] == [dead.id]
    assert mail['counters']['dead'] == 1 and mail['counters']['recovered'] == 1
    assert snapshot(conn) == before


def test_status_counts_leases_of_an_older_process_as_exempt_during_the_grace(
    server: EmbeddedServer, conn: redis.Redis
) -> None:
    start_job(conn, Queue('mail', connection=conn), epoch=None)
    doc = json.loads(run('status', '-u', server.url, '--json', '--grace', '100000').stdout)
    assert doc['queues']['mail']['expired']['deferred'] == 1
    assert doc['queues']['mail']['would_be_exempt'] == 1
    text = run('status', '-u', server.url, '--grace', '100000').stdout
    assert 'restart grace: 100000s' in text


def test_status_through_sentinel_settings(server: EmbeddedServer, conn: redis.Redis, tmp_path: Path) -> None:
    port = free_port()
    conf = tmp_path / 'sentinel.conf'
    conf.write_text(
        textwrap.dedent(
            f"""\
            port {port}
            bind 127.0.0.1
            dir {tmp_path}
            sentinel monitor epochmaster 127.0.0.1 {server.port} 1
            """
        )
    )
    binary = find_server_binary(server.kind)
    proc = subprocess.Popen(
        [binary, str(conf), '--sentinel'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path
    )
    try:
        sentinel = redis.Redis(host='127.0.0.1', port=port)

        def master_known() -> bool:
            try:
                return bool(sentinel.execute_command('SENTINEL', 'get-master-addr-by-name', 'epochmaster'))
            except redis.exceptions.ConnectionError:
                return False

        wait_for(master_known, 15, what='the sentinel to answer')
        sentinel.close()
        module = f'epoch_sentinel_{server.kind}_{port}'
        (tmp_path / f'{module}.py').write_text(
            f"SENTINEL = {{'INSTANCES': [('127.0.0.1', {port})], 'MASTER_NAME': 'epochmaster'}}\n"
        )
        start_job(conn, Queue('mail', connection=conn), epoch=OTHER_EPOCH)
        result = run('status', '-c', module, '-P', str(tmp_path), '--json')
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc['server']['run_id'] == conn.info('server')['run_id']
        assert doc['queues']['mail']['expired_leases'] == 1
    finally:
        proc.kill()
        proc.wait(10)


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize('command', ['sweep', 'status'])
def test_unreachable_server_is_exit_1_with_one_line(command: str) -> None:
    url = f'redis://127.0.0.1:{free_port()}/0'
    proc = run_process(command, '-u', url, '-q', 'default')
    assert proc.returncode == 1
    assert proc.stdout == ''
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith('Error: cannot reach 127.0.0.1:')
    assert 'Traceback' not in proc.stderr


@pytest.mark.parametrize(
    'rules, words',
    [
        (['-info'], 'INFO'),
        (['-evalsha', '-eval', '-script'], 'refused'),
    ],
    ids=['no-info', 'no-scripts'],
)
def test_server_refusing_a_verb_is_exit_1_with_one_line(
    server: EmbeddedServer, conn: redis.Redis, rules: list[str], words: str
) -> None:
    conn.execute_command('ACL', 'SETUSER', 'epochless', 'on', '>pw', '~*', '&*', '+@all', *rules)
    try:
        url = f'redis://epochless:pw@127.0.0.1:{server.port}/0'
        for command in ('sweep', 'status'):
            result = run(command, '-u', url, '-q', 'mail')
            assert result.exit_code == 1, (command, result.output)
            assert result.stdout == ''
            lines = result.stderr.splitlines()
            assert len(lines) == 1, result.stderr
            assert lines[0].startswith('Error: ') and words in lines[0]
        proc = run_process('sweep', '-u', url, '-q', 'mail')
        assert proc.returncode == 1
        assert len(proc.stderr.splitlines()) == 1 and 'Traceback' not in proc.stderr
    finally:
        conn.execute_command('ACL', 'DELUSER', 'epochless')


@pytest.mark.parametrize(
    'args',
    [
        ['sweep', '--no-such-flag'],
        ['sweep', '-q', 'mail', '--max-stalled', '0'],
        ['sweep', '-q', 'mail', '--batch-size', 'many'],
        ['sweep', '-q', 'mail', '--grace', '-1'],
        ['sweep', '-q', 'mail', '--all'],
        ['sweep', '-q', 'mail', '--quiet', '--verbose'],
        ['sweep'],
        ['sweep', '-q', 'mail', '-j', 'no.such.JobClass'],
        ['sweep', '-q', 'mail', '-j', 'tests.jobs.add'],
        ['sweep', '-q', 'mail', '-S', 'no.such.serializer'],
        ['sweep', '-q', 'mail', '-c', 'no_such_settings_module'],
        ['status', '--json=yes'],
        ['no-such-command'],
    ],
)
def test_bad_usage_is_exit_2(server: EmbeddedServer, args: list[str]) -> None:
    result = run(*args, '-u', server.url) if args[0] in ('sweep', 'status') else run(*args)
    assert result.exit_code == 2, result.output


def test_bad_settings_in_the_environment_are_exit_2(server: EmbeddedServer) -> None:
    result = run('sweep', '-u', server.url, '-q', 'mail', env={'RQ_EPOCH_MAX_STALLED': 'lots'})
    assert result.exit_code == 2
    assert 'RQ_EPOCH_MAX_STALLED' in result.stderr


def test_bad_url_is_exit_2() -> None:
    result = run('sweep', '-u', 'http://127.0.0.1:1', '-q', 'mail')
    assert result.exit_code == 2


def test_version() -> None:
    result = run('--version')
    assert result.exit_code == 0
    assert result.stdout.startswith('rq-epoch, version ')
