"""``rq-epoch worker``: RQ's ``rq worker``, with rq-epoch's worker class, that waits for a server that is down.

Real servers, real ``rq-epoch worker`` processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from rq.job import JobStatus

from rq_epoch import Queue
from rq_epoch.embedded import EmbeddedServer
from tests.conftest import ROOT, WorkerProcess, wait_for

QUEUES = ('cmd-a', 'cmd-b')
EPOCH_LINE = 'rq-epoch on server epoch'  # rq_epoch.Worker's first line once it has the server's epoch
_SCRIPT = Path(sys.executable).with_name('rq-epoch')
RQ_EPOCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, '-c', 'from rq_epoch.ops.cli import main; main()']


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without its RQ_* and REDIS_* settings, with short rq-epoch intervals."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(('RQ_', 'REDIS_'))}
    env.update(
        {
            'PYTHONPATH': str(ROOT),
            'PYTHONUNBUFFERED': '1',
            'RQ_EPOCH_HEARTBEAT_INTERVAL': '1',
            'RQ_EPOCH_LEASE_MARGIN': '2',
            'RQ_EPOCH_SWEEP_INTERVAL': '1',
        }
    )
    env.update(extra or {})
    return env


def start_command(log: Path, *args: str, env: dict[str, str] | None = None) -> WorkerProcess:
    with open(log, 'wb') as out:
        proc = subprocess.Popen(
            [*RQ_EPOCH, 'worker', *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=environment(env)
        )
    return WorkerProcess(proc, log)


def test_a_worker_started_while_the_server_is_down_waits_and_then_works(
    conn: redis.Redis, server: EmbeddedServer, tmp_path: Path
) -> None:
    server.stop()
    worker = start_command(tmp_path / 'worker.log', '--url', server.url, *QUEUES, env={'RQ_EPOCH_STARTUP_WAIT': '120'})
    try:
        try:
            wait_for(lambda: 'waiting for it' in worker.output(), 60, what='the worker waiting for the server')
            assert 'Error 111' in worker.output() or 'Connection refused' in worker.output()
            assert worker.proc.poll() is None, worker.output()
        finally:
            server.start()
        client = server.client()
        job = Queue(QUEUES[1], connection=client).enqueue('tests.jobs.add', 2, 2)
        wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 60, what='the job done')
        client.close()
        assert worker.proc.poll() is None, worker.output()
        output = worker.output()
        assert output.count('waiting for it') == 1
        assert output.count('the server is back') == 1
        assert EPOCH_LINE in output
    finally:
        worker.kill()


@pytest.mark.parametrize(
    ('args', 'message'),
    [
        (['--url', 'redis://127.0.0.1:1', '--no-such-option', 'q1'], 'No such option'),
        (['--url', 'redis://127.0.0.1:1', '--max-jobs', 'many', 'q1'], "Invalid value for '--max-jobs'"),
        (['--url', 'redis://127.0.0.1:1', '-v', '-q', 'q1'], 'mutually exclusive'),
        (['-c', 'no_such_settings_module', 'q1'], "No module named 'no_such_settings_module'"),
    ],
)
def test_a_bad_option_is_a_usage_error(args: list[str], message: str) -> None:
    # Nothing listens on port 1: the command must stop at its arguments, before any wait.
    done = subprocess.run(
        [*RQ_EPOCH, 'worker', *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment({'RQ_EPOCH_STARTUP_WAIT': '120'}),
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert 'Usage: rq-epoch worker [OPTIONS] [QUEUES]...' in done.stderr
    assert message in done.stderr
    assert args[-2] in done.stderr or args[-3] in done.stderr  # the bad option or value is named
    assert 'Traceback' not in done.stderr


def test_help_is_rqs_worker_help_with_what_rq_epoch_adds() -> None:
    done = subprocess.run(
        [*RQ_EPOCH, 'worker', '--help'], capture_output=True, text=True, env=environment(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert '--worker-class rq_epoch.Worker' in done.stdout
    assert 'RQ_EPOCH_STARTUP_WAIT' in done.stdout
    assert '--dequeue-strategy' in done.stdout  # RQ's own options
    assert 'Starts an RQ worker.' in done.stdout


@pytest.mark.parametrize(
    ('how', 'epoch_worker'),
    [
        ('url', True),
        ('env-url', True),
        ('config-module', True),
        ('worker-class-option', False),
        ('env-worker-class', False),
    ],
)
def test_a_start_with_the_server_up_runs_the_chosen_worker_class(
    conn: redis.Redis, server: EmbeddedServer, tmp_path: Path, how: str, epoch_worker: bool
) -> None:
    """rq_epoch.Worker unless -w or RQ_WORKER_CLASS chooses a class; the connection found as ``rq worker`` finds it."""
    args: list[str] = ['--url', server.url]
    env: dict[str, str] = {'RQ_EPOCH_STARTUP_WAIT': '120'}
    if how == 'env-url':
        args, env['RQ_REDIS_URL'] = [], server.url
    elif how == 'config-module':
        (tmp_path / 'worker_settings.py').write_text(f'REDIS_URL = {server.url!r}\n')
        args = ['-c', 'worker_settings', '-P', str(tmp_path)]
    elif how == 'worker-class-option':
        args += ['-w', 'rq.Worker']
    elif how == 'env-worker-class':
        env['RQ_WORKER_CLASS'] = 'rq.Worker'
    job = Queue(QUEUES[1], connection=conn).enqueue('tests.jobs.add', 2, 2)
    worker = start_command(tmp_path / 'worker.log', *args, '--burst', *QUEUES, env=env)
    try:
        wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 60, what='the job done')
        wait_for(lambda: 'done, quitting' in worker.output(), 60, what='the end of the burst')
        output = worker.output()
        assert (EPOCH_LINE in output) is epoch_worker, output
        assert 'waiting for it' not in output  # the server was found at once, where the worker found it
    finally:
        worker.kill()


@pytest.mark.parametrize('queue_name', ['-dashed', '--help'])
def test_arguments_after_a_bare_double_dash_reach_rq_worker_as_given(
    conn: redis.Redis, server: EmbeddedServer, tmp_path: Path, queue_name: str
) -> None:
    """``--`` ends the options: a queue named like an option comes after it, and ``rq worker``
    must get the ``--`` too, or it reads the name as an option (or prints its help)."""
    job = Queue(queue_name, connection=conn).enqueue('tests.jobs.add', 2, 2)
    worker = start_command(
        tmp_path / 'worker.log', '--url', server.url, '--burst', '--', queue_name, env={'RQ_EPOCH_STARTUP_WAIT': '120'}
    )
    try:
        wait_for(lambda: worker.proc.poll() is not None, 60, what='the end of the burst')
        output = worker.output()
        assert worker.proc.returncode == 0, output
        assert job.get_status(refresh=True) == JobStatus.FINISHED, output
        assert EPOCH_LINE in output  # rq_epoch.Worker, added before the "--"
        assert 'RQ_EPOCH_STARTUP_WAIT' not in output  # no help note: "--help" was a queue name
    finally:
        worker.kill()
