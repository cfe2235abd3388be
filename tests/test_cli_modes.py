"""RQ's command-line modes with rq-epoch's workers: ``--with-scheduler`` across a server restart,
``rq worker-pool -w rq_epoch.Worker`` (restart ridden through, SIGKILL counted) and the dequeue
strategies. Real processes, real signals, real restarts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from rq.job import JobStatus

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.pids import descendants_of, send_signal
from rq_epoch.protocol import keys
from tests.conftest import ROOT, wait_for
from tests.test_restart_ride_through import executions


class Pool:
    """A real ``rq worker-pool`` process and everything it starts."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def kill(self) -> None:
        """SIGKILL the pool, its workers, their work-horses and scheduler processes."""
        tree = [self.proc.pid, *descendants_of(self.proc.pid)]
        for pid in tree:
            send_signal(pid, signal.SIGKILL)
        self.proc.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors='replace') if self.log.exists() else ''


@pytest.fixture
def start_pool(server, tmp_path: Path) -> Iterator[Callable[..., Pool]]:
    started: list[Pool] = []

    def start(*queues: str, workers: int = 2, worker_class: str = 'rq_epoch.Worker') -> Pool:
        environ = dict(os.environ)
        environ['PYTHONPATH'] = str(ROOT) + os.pathsep + environ.get('PYTHONPATH', '')
        environ.update(
            {
                'RQ_EPOCH_HEARTBEAT_INTERVAL': '1',
                'RQ_EPOCH_LEASE_MARGIN': '2',
                'RQ_EPOCH_SWEEP_INTERVAL': '1',
                'RQ_EPOCH_RESTART_GRACE': '4',
                'PYTHONUNBUFFERED': '1',
            }
        )
        log = tmp_path / f'pool-{len(started)}.log'
        argv = [sys.executable, '-m', 'rq.cli', 'worker-pool', '--url', server.url, '-w', worker_class]
        argv += ['-n', str(workers), *queues]
        with open(log, 'wb') as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=environ)
        pool = Pool(proc, log)
        started.append(pool)
        return pool

    yield start
    for pool in started:
        if pool.proc.poll() is None:
            pool.kill()


def _scheduler_lock(queue: str) -> str:
    return f'{keys.PREFIX}:scheduler-lock:{queue}'


@pytest.mark.parametrize('flavour', ['rq_epoch.Worker', 'rq_epoch.SimpleWorker'])
def test_with_scheduler_jobs_scheduled_after_a_server_restart_still_run(
    conn, server, start_worker, flavour: str
) -> None:
    """RQ's scheduler process quits on a connection error; RQ starts it again only with its
    maintenance (every 10 minutes by default). rq-epoch's worker starts it again when the
    server is back."""
    queue = Queue('sched', connection=conn)
    worker = start_worker('sched', worker_class=flavour, args=['--with-scheduler'])
    wait_for(lambda: conn.exists(_scheduler_lock('sched')), 30, what='the scheduler holding its lock')
    before = queue.enqueue_in(timedelta(seconds=1), 'tests.jobs.add', 1, 2)
    wait_for(lambda: before.get_status(refresh=True) == JobStatus.FINISHED, 30, what='scheduled job before')
    server.restart(down_for=2)
    conn = server.client()
    queue = Queue('sched', connection=conn)
    after = queue.enqueue_in(timedelta(seconds=2), 'tests.jobs.add', 2, 3)
    wait_for(lambda: after.get_status(refresh=True) == JobStatus.FINISHED, 30, what='scheduled job after the restart')
    assert after.latest_result().return_value == 5
    assert conn.hget(after.key, 'lease_execution') is not None
    assert 'the scheduler process' in worker.output() and 'starting it again' in worker.output()
    assert worker.proc.poll() is None


def test_worker_pool_rides_through_a_restart_and_keeps_scheduling(conn, server, start_pool, tmp_path: Path) -> None:
    queue = Queue('pool', connection=conn)
    log = tmp_path / 'log'
    jobs = [queue.enqueue('tests.jobs.sleep_and_record', str(log), f'p{i}', 4) for i in range(3)]
    pool = start_pool('pool', workers=2)
    wait_for(
        lambda: sum(j.get_status(refresh=True) == JobStatus.STARTED for j in jobs) == 2, 60, what='two jobs running'
    )
    server.restart(down_for=2)
    conn = server.client()
    wait_for(lambda: all(conn.hget(j.key, 'status') == b'finished' for j in jobs), 60, what='every job finished once')
    for i, job in enumerate(jobs):
        job = Job.fetch(job.id, connection=conn)
        assert executions(log, f'p{i}') == (1, 1)
        assert (job.stalled, job.exempt_recoveries) == (0, 0)
        assert len(job.results()) == 1
        assert job.lease_execution is not None
    later = Queue('pool', connection=conn).enqueue_in(timedelta(seconds=2), 'tests.jobs.add', 3, 4)
    wait_for(lambda: later.get_status(refresh=True) == JobStatus.FINISHED, 30, what='scheduled job after restart')
    assert pool.proc.poll() is None


def test_a_sigkilled_worker_pool_is_a_counted_stall(conn, start_pool, tmp_path: Path) -> None:
    queue = Queue('poolkill', connection=conn)
    job = queue.enqueue('tests.jobs.sleep_and_record', str(tmp_path / 'log'), 'k', 60, max_stalled=2)
    pool = start_pool('poolkill', workers=1)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 60, what='job running')
    wait_for(lambda: conn.zcard(keys.leases_key('poolkill')) == 1, 10, what='lease granted')
    pool.kill()
    report = wait_for(
        lambda: (r := Sweeper(conn, restart_grace=0).sweep(['poolkill'])).total and r, 20, what='lease expiry'
    )
    assert [(v.job_id, v.verdict, v.stalled) for v in report.verdicts] == [(job.id, 'recovered', 1)]


@pytest.mark.parametrize(
    ('flavour', 'strategy'),
    [
        ('rq_epoch.Worker', 'round_robin'),
        ('rq_epoch.Worker', 'random'),
        ('rq_epoch.SimpleWorker', 'round_robin'),
        ('rq_epoch.SpawnWorker', 'round_robin'),
    ],
)
def test_dequeue_strategies(conn, start_worker, tmp_path: Path, flavour: str, strategy: str) -> None:
    log = tmp_path / 'log'
    first, second = Queue('first', connection=conn), Queue('second', connection=conn)
    jobs = []
    for i in range(2):
        jobs.append(first.enqueue('tests.jobs.record', str(log), f'first{i}'))
        jobs.append(second.enqueue('tests.jobs.record', str(log), f'second{i}'))
    worker = start_worker('first', 'second', worker_class=flavour, burst=True, args=['--dequeue-strategy', strategy])
    wait_for(lambda: worker.proc.poll() is not None, 60, what='burst worker exit')
    assert worker.proc.returncode == 0, worker.output()
    for job in jobs:
        assert job.get_status(refresh=True) == JobStatus.FINISHED
        assert conn.hget(job.key, 'lease_execution') is not None
    order = [line.split()[0] for line in log.read_text().splitlines()]
    assert sorted(order) == ['first0', 'first1', 'second0', 'second1']
    if strategy == 'round_robin':
        assert order == ['first0', 'second0', 'first1', 'second1']
