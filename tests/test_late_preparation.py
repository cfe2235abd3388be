"""A work-horse whose preparation arrives after a sweep took its lease writes nothing and does not run the job.

RQ's work-horse marks its job "started" (status, ``started_at``, ``worker_name``, the key's
expiry removed) in one transaction before it calls the function. A work-horse can send that
transaction late: its worker was frozen, a server outage outlasted the lease, a spawned
work-horse was slow to start. By then a sweep may have taken the lease and another worker
may have finished the job; the late transaction used to land on the finished job, which then
stayed "started" for good, with no lease for any sweep to recover, and ran a second time.

A loopback proxy holds the work-horse's preparation on its way to the server (the first
write that sets the job's status to "started") while the worker is frozen; a sweep takes the lease,
another worker runs the job; then the write goes on.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from rq.job import JobStatus

from rq_epoch import Job, Queue, Sweeper
from tests.conftest import thaw, wait_for

#: The status field set to "started", as it travels in RQ's ``HSET`` (or in the arguments
#: of the script that carries it).
STARTED = b'$6\r\nstatus\r\n$7\r\nstarted\r\n'


@pytest.mark.parametrize('worker_class', ['rq_epoch.Worker', 'rq_epoch.SpawnWorker'])
def test_a_late_preparation_is_refused_and_the_finished_job_stays_finished(
    conn, proxy, start_worker, tmp_path: Path, worker_class: str
) -> None:
    queue = Queue('late', connection=conn)
    log = tmp_path / 'log'
    job = queue.enqueue('tests.jobs.record', str(log), 'ran', result_ttl=600)
    proxy.hold(STARTED)
    late = start_worker('late', worker_class=worker_class, url=proxy.url)
    assert proxy.held.wait(30), f'the work-horse never sent its preparation:\n{late.output()}'
    late_execution = conn.hget(job.key, 'lease_execution')
    assert late_execution, 'the job was not granted before its preparation'
    horses = late.horse_pids()
    frozen = [late.pid, *horses]
    for pid in frozen:  # the worker stops heartbeating; its work-horse waits on the held write
        os.kill(pid, signal.SIGSTOP)
    try:
        report = wait_for(
            lambda: (r := Sweeper(conn, restart_grace=0).sweep(['late'])).total and r, 20, what='the lease to run out'
        )
        # Never marked started: requeued uncounted.
        assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job.id, 'exempt')]
        other = start_worker('late')
        wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='another worker to finish it')
        other.stop()
        # The held preparation goes on; the work-horse runs again before its worker (which
        # would stop it on its next heartbeat, the lease being gone).
        proxy.release()
        thaw(horses)
        wait_for(
            lambda: 'preparation refused' in late.output() or log.read_text().count('ran ') > 1,
            30,
            what='the late work-horse to refuse the job or run it',
        )
    finally:
        proxy.release()
        thaw(frozen)
    finished = Job.fetch(job.id, connection=conn)
    output = late.output()
    assert finished.get_status() == JobStatus.FINISHED, output
    late_name = re.search(r'Worker (\w+): started with PID', output)
    assert late_name, output
    assert finished.worker_name != late_name.group(1) and finished.started_at <= finished.ended_at, output
    assert conn.ttl(job.key) > 0, "the late preparation removed the finished job key's expiry"
    assert log.read_text().count('ran ') == 1, output
    assert len(finished.results()) == 1
    assert f'job {job.id} not run, its preparation refused: a sweep took its lease' in output, output
    assert int(conn.hget(job.key, 'stale_outcomes') or 0) == 0  # a refused preparation is not an outcome
