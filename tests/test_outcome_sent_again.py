"""An outcome sent again after an outage spends a job's retry (or repeat) once.

RQ's outcome paths change the job in memory before they commit: ``Job.retry`` spends one of
``retries_left`` (a job enqueued with ``retry=Retry(max=N)`` that fails), a job that returns
``rq.Retry`` gets ``number_of_retries + 1``. A loopback proxy drops the connection on the outcome's commit, before the
server sees it (``HoldingProxy.drop``); the worker sends the outcome again once it reconnects,
and the job's counters must say one retry (or repeat) was spent, not two.

RQ's failure paths also catch every error around their commit and log it as a failure to
persist: without rq-epoch's handling the outcome was lost there, the job stayed started, and a
sweep counted the outage as a stall (``stalled 1``) and ran it again with its retry unspent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rq import Retry
from rq.job import JobStatus

from rq_epoch import Job, Queue
from rq_epoch.protocol import scripts
from tests.conftest import wait_for

#: (how the first run ends, what the worker records, the job field its commit carries, the
#: options of the enqueue, the runs expected in all, that field at the end)
CASES = {
    'failure with Retry(max=3)': ('raise', 'failure', 'retries_left', {'retry': Retry(max=3)}, 2, 2),
    'rq.Retry returned': ('retry', 'retry', 'number_of_retries', {}, 2, 1),
}


@pytest.mark.parametrize('case', list(CASES))
def test_an_outcome_whose_commit_the_connection_dropped_is_sent_again_and_spends_one_retry(
    conn, proxy, start_worker, tmp_path: Path, case: str
) -> None:
    first_run, what, field, options, runs, left = CASES[case]
    log, release = tmp_path / 'runs', tmp_path / 'release'
    job = Queue('again', connection=conn).enqueue('tests.jobs.gated', str(log), 'r', str(release), first_run, **options)
    worker = start_worker('again', url=proxy.url)
    wait_for(lambda: log.exists(), 30, what='the first run under way')
    # On a loaded machine a sweep may requeue the job, uncounted, before its first run (it sat
    # taken but not yet granted for a whole lease): what the outage does is counted from here.
    exempt_before = Job.fetch(job.id, connection=conn).exempt_recoveries
    proxy.drop(field.encode())  # the outcome's commit saves the job, this field included
    release.touch()
    assert proxy.drop_done.wait(30), f'the {what} of the first run was never sent'
    wait_for(lambda: log.read_text().count('end r') == runs, 60, what=f'{runs} runs')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, what='the job finished')
    done = Job.fetch(job.id, connection=conn)
    out = worker.output()
    assert f'server unreachable while recording the {what} of job {job.id}' in out, out
    assert f'{what} of job {job.id} recorded after 2 attempt(s)' in out, out
    assert getattr(done, field) == left, out
    assert (done.stalled, done.exempt_recoveries) == (0, exempt_before), out  # the outage counted nothing
    assert log.read_text().count('start r') == runs
    assert worker.proc.poll() is None


def test_a_success_that_landed_before_its_reply_was_lost_is_recorded_once_not_refused(
    conn, proxy, start_worker, tmp_path: Path
) -> None:
    """The success's commit reaches the server, its reply is lost with the connection
    (``HoldingProxy.cut``). RQ 3 commits a success under WATCH, so redis-py reports the lost
    connection as a WatchError; the worker must take it for the connection error it is, find
    its own commit landed, and say so: no refusal, one result, nothing counted."""
    log, release = tmp_path / 'runs', tmp_path / 'release'
    job = Queue('again', connection=conn).enqueue('tests.jobs.gated', str(log), 'r', str(release), 'return')
    worker = start_worker('again', url=proxy.url)
    wait_for(lambda: log.exists(), 30, what='the run under way')
    exempt_before = Job.fetch(job.id, connection=conn).exempt_recoveries  # see the test above
    proxy.cut(scripts.commit().sha.encode())
    release.touch()
    assert proxy.cut_done.wait(30), 'the success was never committed'
    wait_for(
        lambda: f'success of job {job.id} was recorded before the outage' in worker.output(), 30, what='the log line'
    )
    out = worker.output()
    assert 'refused' not in out, out
    done = Job.fetch(job.id, connection=conn)
    assert done.get_status() == JobStatus.FINISHED
    assert len(done.results()) == 1
    assert (done.stalled, done.exempt_recoveries) == (0, exempt_before)
    assert log.read_text().count('start r') == 1
    assert worker.proc.poll() is None
