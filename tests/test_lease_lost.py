"""A worker that could not heartbeat for longer than its lease finds its lease gone:
it does not bring the lease back, stops its work-horse, and records no outcome."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from rq_epoch import Job, Queue, Sweeper
from rq_epoch.protocol import keys
from tests.conftest import thaw, wait_for


def test_frozen_worker_loses_its_lease_and_stands_down(conn, start_worker, tmp_path: Path) -> None:
    queue = Queue('frozen', connection=conn)
    log = tmp_path / 'log'
    release = tmp_path / 'release'
    job = queue.enqueue('tests.jobs.wait_for_file_then_record', str(log), 'f', str(release), max_stalled=3)
    worker = start_worker('frozen')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.STARTED, 30, what='job running')
    horses = wait_for(worker.horse_pids, 10, what='work-horse')
    (member,) = conn.zrange(keys.leases_key('frozen'), 0, -1)
    frozen_execution = conn.hget(job.key, 'lease_execution')
    frozen = [worker.pid, *horses]
    for pid in frozen:  # a frozen machine: worker and horse stop together
        os.kill(pid, signal.SIGSTOP)
    try:
        report = wait_for(
            lambda: (r := Sweeper(conn, restart_grace=0).sweep(['frozen'])).total and r, 20, what='lease expiry'
        )
        assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job.id, 'recovered')]
    finally:
        thaw(frozen)
    wait_for(lambda: 'lease of job' in worker.output(), 20, what='the worker noticing its lease is gone')
    wait_for(lambda: not any(Path(f'/proc/{pid}').exists() for pid in horses), 20, what='horse stopped')
    with conn.pipeline() as pipe:  # one read of the lease and of its holder
        lease, holder = pipe.zscore(keys.leases_key('frozen'), member).hget(job.key, 'lease_execution').execute()
    # Not brought back: no lease, or a lease of a later execution (the thawed worker took the job again).
    assert lease is None or holder != frozen_execution
    job = Job.fetch(job.id, connection=conn)
    assert job.get_status() in (JobStatus.QUEUED, JobStatus.STARTED)  # requeued; no outcome from the frozen run
    assert job.stalled == 1
    assert job.id not in FailedJobRegistry('frozen', connection=conn)
    release.touch()
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='the same worker, thawed, runs it')
    assert log.read_text().count('end f') == 1
    assert len(job.results()) == 1
    assert f'not failing job {job.id}, whose lease a sweep took' in worker.output()
