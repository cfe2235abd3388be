"""End to end: real ``rq worker --worker-class rq_epoch.Worker`` processes, real signals,
real server restarts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rq.job import JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.protocol import keys
from tests.conftest import ROOT, wait_for


def lease_of(conn, queue: str, job_id: str) -> bytes | None:
    """The job's lease member (its id), once the job holds a lease."""
    return job_id.encode() if conn.zscore(keys.leases_key(queue), job_id) is not None else None


def lease_expired(conn, queue: str) -> bool:
    seconds, _ = conn.time()
    return bool(conn.zrangebyscore(keys.leases_key(queue), '-inf', seconds))


def wait_started(conn, queue: str, job: Job, timeout: float = 30) -> bytes:
    return wait_for(lambda: lease_of(conn, queue, job.id), timeout, what=f'lease of {job.id}')


def test_worker_stamps_lease_with_the_server_epoch(conn, server, start_worker, tmp_path: Path) -> None:
    queue = Queue('e2e', connection=conn)
    release = tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(tmp_path / 'log'), 'a', str(release))
    start_worker('e2e')
    member = wait_started(conn, 'e2e', job)
    job = Job.fetch(job.id, connection=conn)
    assert conn.zscore(keys.wip_key('e2e'), f'{job.id}:{job.lease_execution}') == float('inf')
    assert job.lease_epoch == server.run_id()
    first = conn.zscore(keys.leases_key('e2e'), member)
    wait_for(lambda: (conn.zscore(keys.leases_key('e2e'), member) or 0) > first, 10, what='a heartbeat extend')
    release.touch()
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 20, what='job finished')
    wait_for(lambda: conn.zcard(keys.leases_key('e2e')) == 0, 10, what='lease removed at the end')
    assert conn.zcard(keys.wip_key('e2e')) == 0


def _kill_running(conn, queue: str, job: Job, start_worker) -> None:
    worker = start_worker(queue)
    wait_started(conn, queue, job)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 10, what='job running')
    worker.kill()
    wait_for(lambda: lease_expired(conn, queue), 20, what='lease expiry')


@pytest.mark.parametrize(
    'max_stalled, verdict, status',
    [(2, 'recovered', JobStatus.QUEUED), (1, 'dead', JobStatus.FAILED)],
    ids=['budget-left-recovered', 'budget-one-dead'],
)
def test_sigkilled_worker_is_a_counted_stall(
    conn, start_worker, tmp_path: Path, max_stalled: int, verdict: str, status: JobStatus
) -> None:
    queue = Queue('kill', connection=conn)
    job = queue.enqueue('tests.jobs.sleep_and_record', str(tmp_path / 'log'), 'k', 60, max_stalled=max_stalled)
    _kill_running(conn, 'kill', job, start_worker)
    report = Sweeper(conn, restart_grace=0).sweep(['kill'])
    assert [(v.verdict, v.stalled) for v in report.verdicts] == [(verdict, 1)]
    job = Job.fetch(job.id, connection=conn)
    assert (job.get_status(), job.stalled) == (status, 1)
    if verdict == 'recovered':
        assert queue.get_job_ids() == [job.id]
    else:
        assert job.id in FailedJobRegistry('kill', connection=conn)
        assert queue.get_job_ids() == []


def test_restart_while_worker_gone_is_exempt_and_finished_by_a_new_worker(
    conn, server, start_worker, tmp_path: Path
) -> None:
    queue = Queue('restart', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.sleep_and_record', str(log), 'r', 8, max_stalled=1)
    other = queue.enqueue('tests.jobs.add', 2, 3)
    worker = start_worker('restart', args=['--max-jobs', '1'])
    wait_started(conn, 'restart', job)
    worker.kill()
    old = server.run_id()
    server.restart()
    conn = server.client()
    assert server.run_id() != old
    assert Job.fetch(job.id, connection=conn).lease_epoch == old  # the data survived
    wait_for(lambda: lease_expired(conn, 'restart'), 20, what='lease expiry')
    report = Sweeper(conn, restart_grace=0).sweep(['restart'])
    assert [(v.job_id, v.verdict, v.stalled) for v in report.verdicts] == [(job.id, 'exempt', 0)]
    assert queue.get_job_ids()[0] == job.id  # back at the front
    job = Job.fetch(job.id, connection=conn)
    assert (job.stalled, job.exempt_recoveries) == (0, 1)
    start_worker('restart', burst=True)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='job finished by a new worker')
    wait_for(lambda: other.get_status(refresh=True) == JobStatus.FINISHED, 20, what='the other job finished')
    assert log.read_text().count('end r') == 1


def test_poison_pill_is_dead_after_exactly_max_stalled_while_healthy_jobs_finish(
    conn, start_worker, tmp_path: Path
) -> None:
    queue = Queue('poison', connection=conn)
    log = tmp_path / 'log'
    pill = queue.enqueue('tests.jobs.poison_pill', str(log), 'pill', max_stalled=3)
    healthy = [queue.enqueue('tests.jobs.sleep_and_record', str(log), f'h{i}', 0.1) for i in range(6)]
    workers = []
    for _ in range(10):  # bounded: each pill attempt takes one worker down
        if pill.get_status(refresh=True) == JobStatus.FAILED:
            break
        workers.append(start_worker('poison'))
        wait_for(
            lambda: workers[-1].proc.poll() is not None or pill.get_status(refresh=True) == JobStatus.FAILED,
            40,
            what='worker taken down or pill dead',
        )
    wait_for(lambda: pill.get_status(refresh=True) == JobStatus.FAILED, 40, what='pill dead-lettered')
    pill = Job.fetch(pill.id, connection=conn)
    assert pill.stalled == 3
    assert log.read_text().count('start pill') == 3
    assert pill.id in FailedJobRegistry('poison', connection=conn)
    if not any(w.proc.poll() is None for w in workers):
        workers.append(start_worker('poison'))
    wait_for(lambda: all(j.get_status(refresh=True) == JobStatus.FINISHED for j in healthy), 60, what='healthy jobs')
    finished = FinishedJobRegistry('poison', connection=conn).get_job_ids()
    assert sorted(finished) == sorted(j.id for j in healthy)


def test_stock_rq_info_leaves_managed_expired_leases_alone(conn, server, start_worker, tmp_path: Path) -> None:
    queue = Queue('info', connection=conn)
    job = queue.enqueue('tests.jobs.sleep_and_record', str(tmp_path / 'log'), 'i', 60)
    _kill_running(conn, 'info', job, start_worker)
    out = subprocess.run(
        [sys.executable, '-m', 'rq.cli', 'info', '--url', server.url, 'info'],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    from rq.queue import Queue as StockQueue

    stock = StockQueue('info', connection=conn)
    assert stock.started_job_registry.count == 1
    assert stock.started_job_registry.get_job_ids() == [job.id]
    job = Job.fetch(job.id, connection=conn)
    assert (job.get_status(), job.stalled) == (JobStatus.STARTED, 0)
    assert job.id not in FailedJobRegistry('info', connection=conn)
    report = Sweeper(conn, restart_grace=0, max_stalled=3).sweep(['info'])
    assert [v.verdict for v in report.verdicts] == ['recovered']
