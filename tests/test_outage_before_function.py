"""A server outage in RQ's step before the job function neither fails nor retries the job.

RQ 2's ``Job.perform`` removes the job key's expiry (``PERSIST``) before it calls the
function. A connection error there used to reach RQ's failure handling: the ``on_failure``
callback ran and a retry was spent (or, without one, the job failed), for a job that never
ran: a server restart cost the job what a crash of its own would. A loopback proxy forwards
that command to the server and closes the connection instead of forwarding the reply, so the
cut lands in that step and nowhere else. Stock RQ beside it, the same cut: the job's retry is
spent and its callback runs. A connection error of the job's own (its function's, or its job
class's code in ``perform``) still fails it as in RQ.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import rq
from rq import Callback, Retry
from rq.job import JobStatus
from rq.queue import Queue as StockQueue

from rq_epoch import Job, Queue
from tests.conftest import wait_for
from tests.jobclasses import TracedJob

#: RQ 2's Job.perform begins with PERSIST of the job key (RQ 3's does not).
PERSISTS_IN_PERFORM = rq.__version__.startswith('2.')
ON_FAILURE = Callback('tests.jobs.on_failure_record')


def _ran_once_unharmed(conn, job_id: str, log: Path, worker_output: str) -> None:
    """The job finished, its function ran once, no failure callback, its retry unspent."""
    job = Job.fetch(job_id, connection=conn)
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='the job finished')
    job = Job.fetch(job_id, connection=conn)
    assert log.read_text().count('ran ') == 1
    assert conn.lrange(f'test:on_failure:{job_id}', 0, -1) == []
    assert job.retries_left == 1
    assert len(job.results()) == 1 and job.latest_result().type.name == 'SUCCESSFUL'
    assert f'server unreachable before job {job_id} started' in worker_output, worker_output


@pytest.mark.skipif(not PERSISTS_IN_PERFORM, reason="RQ 3's Job.perform calls no server before the function")
@pytest.mark.parametrize('job_class', [None, 'tests.jobclasses.TracedJob'])
def test_a_connection_cut_at_rqs_persist_neither_fails_nor_retries_the_job(
    conn, proxy, start_worker, tmp_path: Path, job_class: str | None
) -> None:
    # With TracedJob, whose perform pushes to test:traced:<id> before it runs RQ's: perform
    # runs again from the start (a second push), the function still once.
    log = tmp_path / 'log'
    queue = Queue('before', connection=conn, job_class=TracedJob if job_class else Job)
    job = queue.enqueue('tests.jobs.record', str(log), 'ran', retry=Retry(max=1), on_failure=ON_FAILURE)
    proxy.cut(b'PERSIST')
    worker = start_worker('before', url=proxy.url, args=['--job-class', job_class] if job_class else [])
    assert proxy.cut_done.wait(30), 'the work-horse never sent PERSIST'
    wait_for(lambda: log.exists(), 40, what='the job function ran')
    _ran_once_unharmed(conn, job.id, log, worker.output())
    assert worker.proc.poll() is None
    assert conn.llen(f'test:traced:{job.id}') == (2 if job_class else 0)


@pytest.mark.skipif(not PERSISTS_IN_PERFORM, reason="RQ 3's Job.perform calls no server before the function")
def test_stock_rq_spends_a_retry_and_runs_the_failure_callback_for_the_same_cut(
    conn, proxy, start_worker, tmp_path: Path
) -> None:
    log = tmp_path / 'log'
    job = StockQueue('before-stock', connection=conn).enqueue(
        'tests.jobs.record', str(log), 'ran', retry=Retry(max=1), on_failure=ON_FAILURE
    )
    proxy.cut(b'PERSIST')
    start_worker('before-stock', worker_class=None, url=proxy.url)
    assert proxy.cut_done.wait(30), 'the stock work-horse never sent PERSIST'
    wait_for(lambda: conn.lrange(f'test:on_failure:{job.id}', 0, -1), 30, what='the failure callback')
    wait_for(lambda: log.exists(), 40, what='the job function ran, on the retry')
    assert conn.lrange(f'test:on_failure:{job.id}', 0, -1)[0].startswith(b'ConnectionError')
    assert StockQueue('before-stock', connection=conn).fetch_job(job.id).retries_left == 0


def test_a_connection_error_of_a_job_classs_own_perform_is_the_jobs_as_in_rq(
    conn, proxy, start_worker, tmp_path: Path
) -> None:
    # The cut lands in TracedJob's own push, before RQ's perform: the job class's code, not
    # RQ's step, so it is not tried again: RQ's failure handling spends the retry.
    log = tmp_path / 'log'
    queue = Queue('traced-own', connection=conn, job_class=TracedJob)
    job = queue.enqueue('tests.jobs.record', str(log), 'ran', retry=Retry(max=1), on_failure=ON_FAILURE)
    proxy.cut(f'test:traced:{job.id}'.encode())
    worker = start_worker('traced-own', url=proxy.url, args=['--job-class', 'tests.jobclasses.TracedJob'])
    assert proxy.cut_done.wait(30), 'the work-horse never called the server in perform'
    wait_for(lambda: conn.lrange(f'test:on_failure:{job.id}', 0, -1), 30, what='the failure callback')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='the job finished, on its retry')
    assert conn.lrange(f'test:on_failure:{job.id}', 0, -1)[0].startswith(b'ConnectionError')
    assert Job.fetch(job.id, connection=conn).retries_left == 0
    assert log.read_text().count('ran ') == 1
    assert 'before job' not in worker.output()


def test_a_connection_error_raised_by_the_job_function_fails_it_as_in_rq(conn, start_worker, tmp_path: Path) -> None:
    job = Queue('raising', connection=conn).enqueue('tests.jobs.raise_connection_error', on_failure=ON_FAILURE)
    worker = start_worker('raising')
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FAILED, 40, what='the job failed')
    assert conn.lrange(f'test:on_failure:{job.id}', 0, -1) == [b'ConnectionError: raised by the job function']
    assert 'raised by the job function' in Job.fetch(job.id, connection=conn).latest_result().exc_string
    assert 'before job' not in worker.output()  # not taken for an outage before the function
