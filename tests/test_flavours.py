"""rq_epoch.SimpleWorker and rq_epoch.SpawnWorker as real ``rq worker --worker-class ...``
processes: the lease is kept while a job runs, a SIGKILL is a counted stall, a server restart
is ridden through, and a lease lost to a sweep ends with the stale outcome refused."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from rq.job import JobStatus

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.protocol import keys
from tests.conftest import wait_for
from tests.test_restart_ride_through import executions

FLAVOURS = ['rq_epoch.SimpleWorker', 'rq_epoch.SpawnWorker', 'rq_epoch.HerokuWorker']


def lease_of(conn, queue: str, job_id: str) -> bytes | None:
    """The job's lease member (its id), once the job holds a lease."""
    return job_id.encode() if conn.zscore(keys.leases_key(queue), job_id) is not None else None


def server_time(conn) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


@pytest.mark.parametrize('flavour', FLAVOURS)
def test_the_lease_is_kept_while_the_job_runs_longer_than_the_lease(
    conn, server, start_worker, tmp_path: Path, flavour: str
) -> None:
    """Sweeps run all along; nobody takes the lease of a job that is still running (a worker
    that runs jobs in-process without heartbeating would lose it after 3 s and run it twice)."""
    queue = Queue('keep', connection=conn)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'k', str(release))
    worker = start_worker('keep', worker_class=flavour)
    member = wait_for(lambda: lease_of(conn, 'keep', job.id), 30, what='lease granted')
    assert conn.hget(job.key, 'lease_epoch') == server.run_id().encode()
    granted = conn.zscore(keys.leases_key('keep'), member)
    verdicts: list[str] = []

    def sweep_past_two_leases() -> bool:
        verdicts.extend(v.verdict for v in Sweeper(conn, restart_grace=0).sweep(['keep']).verdicts)
        return server_time(conn) > granted + 6  # two lease lengths (1 s heartbeat + 2 s margin)

    wait_for(sweep_past_two_leases, 20, interval=0.2, what='two lease lengths of sweeping')
    assert verdicts == []
    assert conn.zscore(keys.leases_key('keep'), member) > granted  # extended, by heartbeats
    assert conn.hget(job.key, 'status') == b'started'
    release.touch()
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='job finished')
    wait_for(lambda: conn.zcard(keys.leases_key('keep')) == 0, 10, what='lease removed by the commit')
    assert executions(log, 'k') == (1, 1)
    assert len(job.results()) == 1
    assert worker.proc.poll() is None


@pytest.mark.parametrize('flavour', FLAVOURS)
def test_a_sigkilled_worker_is_a_counted_stall(conn, start_worker, tmp_path: Path, flavour: str) -> None:
    queue = Queue('kill', connection=conn)
    job = queue.enqueue('tests.jobs.sleep_and_record', str(tmp_path / 'log'), 'x', 60, max_stalled=2)
    worker = start_worker('kill', worker_class=flavour)
    wait_for(lambda: lease_of(conn, 'kill', job.id), 30, what='lease granted')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 10, what='job running')
    worker.kill()  # the worker and its work-horse, if any
    report = wait_for(lambda: (r := Sweeper(conn, restart_grace=0).sweep(['kill'])).total and r, 20, what='expiry')
    assert [(v.job_id, v.verdict, v.stalled) for v in report.verdicts] == [(job.id, 'recovered', 1)]
    job = Job.fetch(job.id, connection=conn)
    assert (job.get_status(), job.stalled) == (JobStatus.QUEUED, 1)
    assert queue.get_job_ids() == [job.id]


@pytest.mark.parametrize('flavour', FLAVOURS)
def test_a_server_restart_mid_job_is_ridden_through_uncounted(
    conn, server, start_worker, tmp_path: Path, flavour: str
) -> None:
    queue = Queue('ride', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.sleep_and_record', str(log), 'r', 8)
    worker = start_worker('ride', worker_class=flavour)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    old = server.run_id()
    server.restart(down_for=3)
    conn = server.client()
    new = server.run_id()
    assert new != old
    wait_for(
        lambda: conn.hget(job.key, 'lease_epoch') == new.encode() and conn.hget(job.key, 'status') == b'started',
        15,
        what='lease re-stamped by the new server process while the job runs',
    )
    wait_for(lambda: conn.hget(job.key, 'status') == b'finished', 30, what='job finished')
    job = Job.fetch(job.id, connection=conn)
    assert worker.proc.poll() is None
    assert executions(log, 'r') == (1, 1)
    assert (job.stalled, job.exempt_recoveries) == (0, 0)
    assert len(job.results()) == 1
    assert conn.zcard(keys.leases_key('ride')) == 0


def test_simple_worker_frozen_past_its_lease_finishes_the_job_and_its_outcome_is_refused(
    conn, start_worker, tmp_path: Path
) -> None:
    """The job runs in the worker process, so it cannot be stopped when a sweep takes its lease:
    it runs to its end and the fence refuses its outcome. The run that took over records it."""
    queue = Queue('frozen', connection=conn)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'f', str(release), max_stalled=3)
    worker = start_worker('frozen', worker_class='rq_epoch.SimpleWorker')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    stale = wait_for(lambda: conn.hget(job.key, 'lease_execution'), 10, what='lease holder').decode()
    wait_for(lambda: executions(log, 'f')[0] == 1, 30, what='job function running')  # not just started
    os.kill(worker.pid, signal.SIGSTOP)  # a frozen machine: the keeper thread stops too
    try:
        report = wait_for(
            lambda: (r := Sweeper(conn, restart_grace=0).sweep(['frozen'])).total and r, 20, what='lease expiry'
        )
        assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job.id, 'recovered')]
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    wait_for(lambda: 'cannot be stopped' in worker.output(), 20, what='the keeper learning its lease was taken')
    release.touch()  # the stale run ends; then the same worker takes the requeued job and runs it again
    wait_for(lambda: f'refused the success of job {job.id} from execution {stale}' in worker.output(), 20)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='the new run finished')
    job = Job.fetch(job.id, connection=conn)
    assert executions(log, 'f') == (2, 2)
    assert len(job.results()) == 1  # only the newer run's outcome landed
    assert (job.stalled, job.stale_outcomes) == (1, 1)
    assert conn.hget(job.key, 'lease_execution').decode() != stale


def test_heroku_worker_warns_the_job_at_sigterm_and_hands_it_back_uncounted(conn, start_worker, tmp_path: Path) -> None:
    """As RQ's HerokuWorker: SIGTERM, then ShutDownImminentException in the job; the job is not
    failed but handed back to the front of its queue by the work-horse, uncounted, with no result."""
    queue = Queue('heroku', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'h', str(tmp_path / 'never'))
    worker = start_worker('heroku', worker_class='rq_epoch.HerokuWorker', env={'RQ_EPOCH_SHUTDOWN_TIMEOUT': '60'})
    wait_for(lambda: executions(log, 'h')[0] == 1, 30, what='job function running')
    os.kill(worker.pid, signal.SIGTERM)
    wait_for(lambda: worker.proc.poll() is not None, 30, what='the worker to stop')
    assert worker.proc.returncode == 0, worker.output()
    job = Job.fetch(job.id, connection=conn)
    assert job.get_status() == JobStatus.QUEUED
    assert conn.lrange(queue.key, 0, -1) == [job.id.encode()]
    assert job.latest_result() is None
    assert (job.stalled, job.exempt_recoveries, job.stale_outcomes) == (0, 0, 0), worker.output()
    assert conn.hget(job.key, 'handed_back') == b'1'
    assert conn.zscore(keys.leases_key('heroku'), job.id) is None
    assert 'Imminent shutdown, raising ShutDownImminentException in 6 seconds' in worker.output()
    assert executions(log, 'h') == (1, 0)
