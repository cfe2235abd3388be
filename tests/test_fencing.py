"""The newer lease wins: an execution whose lease was taken can never write the job's outcome.

The stale execution's commit is held *in flight* by a loopback proxy: the worker has sent
it, after every check the worker itself makes, and the server has not applied it. While
it is held, the worker is frozen (SIGSTOP: no heartbeats), a sweep takes the lease, and a
newer execution runs the job (or the sweep dead-letters it). Then the commit is released.
With rq-epoch the server refuses it whole; with stock RQ, beside it, it lands.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner
from rq import Callback, Retry
from rq.job import JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.registry import StartedJobRegistry as StockStartedJobRegistry
from rq.results import Result

from rq_epoch import Job, Queue
from rq_epoch.ops.cli import main
from rq_epoch.protocol import keys
from tests.conftest import thaw, wait_for

QUEUE = 'fence'


def _enqueue(conn, tmp_path: Path, first_run: str, **kwargs: object) -> tuple[Job, Path, Path]:
    log, release = tmp_path / 'runs', tmp_path / 'release'
    job = Queue(QUEUE, connection=conn).enqueue(
        'tests.jobs.gated',
        str(log),
        'f',
        str(release),
        first_run,
        on_success=Callback('tests.jobs.on_success_record'),
        on_failure=Callback('tests.jobs.on_failure_record'),
        **kwargs,
    )
    return job, log, release


def _hold_the_outcome_of_a_frozen_worker(conn, proxy, worker, job, release: Path) -> None:
    """Freeze the worker (not its horse), let the horse finish, hold its commit in the proxy."""
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    wait_for(worker.horse_pids, 10, what='work-horse')
    proxy.hold(f'{keys.PREFIX}:results:{job.id}'.encode())
    os.kill(worker.pid, signal.SIGSTOP)
    release.touch()
    assert proxy.held.wait(30), 'the work-horse never sent its outcome'


@pytest.mark.parametrize(
    ('first_run', 'max_stalled', 'newer'),
    [
        ('return', 3, 'finished'),  # B reruns and finishes first
        ('return', 1, 'dead'),  # the sweep dead-letters the job first
        ('retry', 3, 'finished'),  # the stale run returns rq.Retry
        ('raise', 3, 'finished'),  # the stale run raises
    ],
)
def test_a_stale_commit_in_flight_is_refused_whole(
    server, conn, proxy, start_worker, tmp_path: Path, first_run: str, max_stalled: int, newer: str
) -> None:
    job, log, release = _enqueue(conn, tmp_path, first_run, max_stalled=max_stalled)
    stale = start_worker(QUEUE, url=proxy.url)
    _hold_the_outcome_of_a_frozen_worker(conn, proxy, stale, job, release)
    try:
        start_worker(QUEUE)  # B: sweeps every second, takes the lease, reruns the job
        if newer == 'finished':
            wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='B finishing the job')
        else:
            wait_for(lambda: job.id in FailedJobRegistry(QUEUE, connection=conn), 40, what='dead letter')
            wait_for(lambda: len(job.results()) == 1, 20, what="the dead letter's failure result")
        before = [(r.type, r.id) for r in job.results()]
        proxy.release()
        stats = keys.stats_key(QUEUE)
        wait_for(lambda: conn.hget(stats, 'refused') == b'1', 20, what='the server refusing the stale commit')
        what = {'return': 'success', 'retry': 'retry', 'raise': 'failure'}[first_run]
        line = f'refused the {what} of job {job.id}'
        wait_for(lambda: line in stale.output(), 20, what='the stale work-horse reporting the refusal')
    finally:
        os.kill(stale.pid, signal.SIGCONT)

    # Nothing of the stale outcome landed: the job is as the newer holder left it.
    job = Job.fetch(job.id, connection=conn)
    assert [(r.type, r.id) for r in job.results()] == before
    assert job.stale_outcomes == 1
    assert Queue(QUEUE, connection=conn).count == 0
    if newer == 'finished':
        assert job.get_status() == JobStatus.FINISHED
        assert [r.type for r in job.results()] == [Result.Type.SUCCESSFUL]
        assert job.id not in FailedJobRegistry(QUEUE, connection=conn)
        assert log.read_text().count('start f') == 2  # A's run and B's, no third
    else:
        assert job.get_status() == JobStatus.FAILED
        assert [r.type for r in job.results()] == [Result.Type.FAILED]
        assert job.id not in FinishedJobRegistry(QUEUE, connection=conn)
        assert log.read_text().count('start f') == 1
    assert stale.output().count(line) == 1
    status = CliRunner().invoke(main, ['status', '--url', server.url, QUEUE], catch_exceptions=False)
    assert 'stale outcomes    1 refused' in status.output


def test_a_frozen_execution_runs_no_callback_once_its_lease_is_taken(conn, start_worker, tmp_path: Path) -> None:
    job, log, release = _enqueue(conn, tmp_path, 'return', max_stalled=3)
    stale = start_worker(QUEUE)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    horses = wait_for(stale.horse_pids, 10, what='work-horse')
    frozen = [stale.pid, *horses]
    for pid in frozen:  # worker and horse frozen together
        os.kill(pid, signal.SIGSTOP)
    try:
        release.touch()
        start_worker(QUEUE)
        wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='B finishing the job')
        for pid in horses:  # the horse first: it returns while its worker is still frozen
            os.kill(pid, signal.SIGCONT)
        # Its lease is known to be gone when its callback would run.
        wait_for(lambda: 'not running its on_success callback' in stale.output(), 20, what='callback skipped')
        wait_for(lambda: f'refused the success of job {job.id}' in stale.output(), 20, what='outcome refused')
    finally:
        thaw(frozen)
    assert conn.lrange(f'test:on_success:{job.id}', 0, -1) == [b'f']  # B's callback only
    assert [r.type for r in Job.fetch(job.id, connection=conn).results()] == [Result.Type.SUCCESSFUL]


def test_stock_rq_lets_the_stale_commit_land(conn, proxy, start_worker, tmp_path: Path) -> None:
    """Stock RQ, the same held commit: the newer holder comes from stock's own abandoned-job
    cleanup (as after its lease ran out) and a second stock worker reruns the job."""
    job, log, release = _enqueue(conn, tmp_path, 'return', retry=Retry(max=1))
    stale = start_worker(QUEUE, worker_class=None, url=proxy.url)
    _hold_the_outcome_of_a_frozen_worker(conn, proxy, stale, job, release)
    try:
        StockStartedJobRegistry(QUEUE, connection=conn).cleanup(timestamp=10**10)  # abandoned: retried
        start_worker(QUEUE, worker_class=None)
        wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='B finishing the job')
        proxy.release()
        wait_for(lambda: len(job.results()) == 2, 20, what='the stale commit landing')
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    assert [r.type for r in job.results()] == [Result.Type.SUCCESSFUL, Result.Type.SUCCESSFUL]
    assert log.read_text().count('start f') == 2
