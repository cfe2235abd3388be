"""rq-epoch beside stock RQ: stock cleanup never touches managed leases, and leases
left by stock workers are swept as exempt."""

from __future__ import annotations

from pathlib import Path

from rq.job import JobStatus
from rq.queue import Queue as StockQueue
from rq.registry import FailedJobRegistry
from rq.registry import StartedJobRegistry as StockStartedJobRegistry
from rq.worker import Worker as StockWorker

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.protocol import keys
from tests.conftest import wait_for
from tests.leases import start_job


def test_stock_registry_views_and_maintenance_leave_managed_leases_alone(conn) -> None:
    queue = Queue('mixed', connection=conn)
    job, member = start_job(conn, queue)  # expired, stamped by this server process
    stock_registry = StockStartedJobRegistry('mixed', connection=conn)
    assert stock_registry.count == 1
    assert stock_registry.get_job_ids() == [job.id]
    stock_registry.cleanup()
    StockWorker([StockQueue('mixed', connection=conn)], connection=conn).clean_registries()
    job = Job.fetch(job.id, connection=conn)
    assert (job.get_status(), job.stalled) == (JobStatus.STARTED, 0)
    assert job.id not in FailedJobRegistry('mixed', connection=conn)
    assert conn.zscore(keys.leases_key('mixed'), member) is not None


def test_lease_left_by_a_killed_stock_worker_is_exempt(conn, start_worker, tmp_path: Path) -> None:
    queue = StockQueue('stock', connection=conn)
    job = queue.enqueue('tests.jobs.sleep_and_record', str(tmp_path / 'log'), 's', 60)
    worker = start_worker('stock', worker_class=None)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='stock worker running the job')
    worker.kill()
    ((member, score),) = conn.zrange(keys.wip_key('stock'), 0, -1, withscores=True)
    assert score != float('inf')
    conn.zadd(keys.wip_key('stock'), {member: 1})  # as if its deadline had passed
    report = Sweeper(conn, restart_grace=0, max_stalled=1).sweep(['stock'])
    assert [(v.job_id, v.verdict, v.stalled) for v in report.verdicts] == [(job.id, 'exempt', 0)]
    assert queue.get_job_ids() == [job.id]
    assert conn.zcard(keys.wip_key('stock')) == 0


def test_verdict_clears_rqs_execution_records(conn, start_worker, tmp_path: Path) -> None:
    queue = Queue('books', connection=conn)
    job = queue.enqueue('tests.jobs.sleep_and_record', str(tmp_path / 'log'), 'b', 60, max_stalled=5)
    worker = start_worker('books')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    (lease,) = conn.zrange(keys.leases_key('books'), 0, -1)
    assert lease.decode() == job.id  # the job's lease; its lease_execution names the execution
    job_id, execution_id = job.id, Job.fetch(job.id, connection=conn).lease_execution
    member = f'{job_id}:{execution_id}'.encode()  # RQ's name of the execution
    worker_names = [k.decode() for k in conn.keys('rq:worker:*:executions')]
    worker.kill()
    assert conn.exists(f'rq:execution:{member.decode()}')
    seconds, _ = conn.time()
    conn.zadd(keys.leases_key('books'), {lease: seconds - 1})
    report = Sweeper(conn, restart_grace=0).sweep(['books'])
    assert [v.verdict for v in report.verdicts] == ['recovered']
    assert not conn.exists(f'rq:execution:{member.decode()}')
    assert conn.zscore(f'rq:executions:{job_id}', execution_id) is None
    for key in worker_names:  # RQ 3's per-worker execution index
        assert not conn.sismember(key, member)
    assert conn.zscore(keys.wip_key('books'), member) is None


def test_idle_worker_sweeps_a_dead_workers_lease_within_seconds(conn, start_worker, tmp_path: Path) -> None:
    queue = Queue('timely', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.sleep_and_record', str(log), 't', 3, max_stalled=3)
    first = start_worker('timely')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    first.kill()
    start_worker('timely')  # idle in its dequeue wait; its own sweep must find the lease
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='job recovered and finished')
    assert Job.fetch(job.id, connection=conn).stalled == 1
    assert conn.hget(keys.stats_key('timely'), 'recovered') == b'1'


def test_busy_worker_sweeps_while_monitoring_its_horse(conn, start_worker, tmp_path: Path) -> None:
    long_queue = Queue('busy', connection=conn)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    long_job = long_queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'long', str(release))
    busy = start_worker('busy')
    wait_for(lambda: long_job.get_status(refresh=True) == JobStatus.STARTED, 30, what='long job running')
    # the busy worker must keep sweeping while its horse runs: plant an expired lease
    victim, _ = start_job(conn, long_queue, max_stalled=3)
    wait_for(lambda: victim.get_status(refresh=True) == JobStatus.QUEUED, 20, what='sweep by the busy worker')
    assert Job.fetch(victim.id, connection=conn).stalled == 1
    release.touch()
    wait_for(lambda: long_job.get_status(refresh=True) == JobStatus.FINISHED, 20, what='long job finished')
    busy.stop()
