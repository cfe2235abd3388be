"""Any job class derived from RQ's Job gets the epoch behaviour: on the worker (argument, class
attribute, CLI), in the sweep and in the ``rq-epoch`` command; and every job object the worker
starts holds a lease, whatever its class."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from rq import Queue as StockQueue
from rq.job import Job as StockJob
from rq.results import Result

import rq_epoch
from rq_epoch import ConfigurationError, EpochJobMixin, Queue, Sweeper, Worker, epoch_job_class
from rq_epoch.ops.cli import main
from rq_epoch.protocol import keys
from tests.conftest import wait_for
from tests.jobclasses import NotAJob, TracedJob, TracedWorker
from tests.leases import start_job


def test_the_epoch_variant_of_a_job_class_keeps_its_name_and_is_made_once() -> None:
    variant = epoch_job_class(TracedJob)
    assert issubclass(variant, TracedJob) and issubclass(variant, EpochJobMixin)
    assert variant is not TracedJob
    assert (variant.__name__, variant.__qualname__) == ('TracedJob', 'TracedJob')
    assert variant.__module__ == 'tests.jobclasses'
    assert repr(variant) == repr(TracedJob)
    assert epoch_job_class(TracedJob) is variant
    assert epoch_job_class('tests.jobclasses.TracedJob') is variant
    assert epoch_job_class(variant) is variant
    assert pickle.loads(pickle.dumps(variant)) is variant  # RQ 3's spawn worker pickles the job class


def test_rq_job_means_rq_epoch_job_and_other_classes_are_refused() -> None:
    assert epoch_job_class(StockJob) is rq_epoch.Job
    assert epoch_job_class('rq.job.Job') is rq_epoch.Job
    assert epoch_job_class(None) is rq_epoch.Job
    assert epoch_job_class(rq_epoch.Job) is rq_epoch.Job
    with pytest.raises(ConfigurationError, match='must derive from rq.job.Job'):
        epoch_job_class(NotAJob)
    with pytest.raises(ConfigurationError, match='cannot import'):
        epoch_job_class('tests.jobclasses.Missing')


def test_a_job_of_the_variant_equals_a_job_of_the_class_with_the_same_id(conn: redis.Redis) -> None:
    job = StockQueue('default', connection=conn, job_class=TracedJob).enqueue('tests.jobs.add', 1, 2)
    fetched = epoch_job_class(TracedJob).fetch(job.id, connection=conn)
    assert fetched == job and job == fetched
    assert hash(fetched) == hash(job)
    assert rq_epoch.Job.fetch(job.id, connection=conn) == StockJob.fetch(job.id, connection=conn)


def test_the_worker_uses_the_variant_of_the_class_asked_for(conn: redis.Redis) -> None:
    variant = epoch_job_class(TracedJob)
    assert Worker(['default'], connection=conn, job_class=TracedJob).job_class is variant
    assert Worker(['default'], connection=conn, job_class='tests.jobclasses.TracedJob').job_class is variant
    assert Worker(['default'], connection=conn, job_class=StockJob).job_class is rq_epoch.Job
    assert Worker(['default'], connection=conn).job_class is rq_epoch.Job


def test_a_worker_subclass_job_class_attribute_is_respected(conn: redis.Redis) -> None:
    """Also when RQ's default job class is passed explicitly, as the rq CLI always does."""
    variant = epoch_job_class(TracedJob)
    assert TracedWorker(['default'], connection=conn).job_class is variant
    assert TracedWorker(['default'], connection=conn, job_class=StockJob).job_class is variant
    assert TracedWorker(['default'], connection=conn, job_class='rq.job.Job').job_class is variant
    worker = TracedWorker([StockQueue('default', connection=conn)], connection=conn)
    assert worker.queues[0].job_class is StockJob  # the caller's queue object is left alone


class TracedSweeper(Sweeper):
    job_class = TracedJob


class BadWorker(Worker):
    job_class = NotAJob  # type: ignore[assignment]


class BadSweeper(Sweeper):
    job_class = NotAJob  # type: ignore[assignment]


@pytest.mark.parametrize('asked', [None, StockJob, 'rq.job.Job'])
def test_the_sweeper_and_the_worker_resolve_a_job_class_alike(conn: redis.Redis, asked: Any) -> None:
    """A subclass's ``job_class`` attribute rules unless another class is asked for, for both."""
    variant = epoch_job_class(TracedJob)
    assert TracedSweeper(conn, job_class=asked).job_class is variant
    assert TracedWorker(['default'], connection=conn, job_class=asked).job_class is variant
    assert Sweeper(conn, job_class=asked).job_class is rq_epoch.Job
    assert Worker(['default'], connection=conn, job_class=asked).job_class is rq_epoch.Job


@pytest.mark.parametrize('bad', [NotAJob, 'tests.jobclasses.NotAJob', 'tests.jobclasses.Missing'])
def test_the_sweeper_refuses_a_wrong_job_class_as_the_worker_does(conn: redis.Redis, bad: Any) -> None:
    with pytest.raises(ConfigurationError):
        Worker(['default'], connection=conn, job_class=bad)
    with pytest.raises(ConfigurationError):
        Sweeper(conn, job_class=bad)


def test_a_wrong_job_class_attribute_is_refused_by_both(conn: redis.Redis) -> None:
    with pytest.raises(ConfigurationError):
        BadWorker(['default'], connection=conn)
    with pytest.raises(ConfigurationError):
        BadSweeper(conn)


def test_the_sweep_and_the_cli_use_the_variant(server, conn: redis.Redis) -> None:
    variant = epoch_job_class(TracedJob)
    assert Sweeper(conn, job_class=TracedJob).job_class is variant
    start_job(conn, Queue('mail', connection=conn), max_stalled=1)
    result = CliRunner().invoke(
        main, ['sweep', '-u', server.url, '-q', 'mail', '-j', 'tests.jobclasses.TracedJob', '--json'], env={}
    )
    assert result.exit_code == 0, result.output
    assert '"dead": 1' in result.stdout
    bad = CliRunner().invoke(main, ['sweep', '-u', server.url, '-q', 'mail', '-j', 'tests.jobclasses.NotAJob'])
    assert bad.exit_code == 2
    assert 'must derive from rq.job.Job' in bad.output


def test_a_stock_job_object_handed_to_the_worker_holds_a_lease_and_its_outcome_lands(conn: redis.Redis) -> None:
    queue = StockQueue('default', connection=conn)
    job = queue.enqueue('tests.jobs.add', 2, 3)
    assert type(job) is StockJob
    worker = Worker([queue], connection=conn)
    worker.execute_job(job, queue)  # forks a work-horse, as the work loop does
    assert conn.hget(job.key, 'status') == b'finished'
    holder = conn.hget(job.key, 'lease_execution')
    assert holder is not None  # the execution was granted a lease
    result = Result.fetch_latest(job, serializer=job.serializer)
    assert result is not None and result.return_value == 5
    if result.execution_id is not None:  # RQ 3 records the execution on its result
        assert result.execution_id == holder.decode()
    assert conn.zcard(keys.leases_key('default')) == 0
    assert conn.hget(job.key, 'stale_outcomes') is None
    assert isinstance(job, StockJob) and isinstance(job, EpochJobMixin)


def test_the_worker_runs_a_job_of_the_class_given_on_the_command_line(conn: redis.Redis, start_worker) -> None:
    queue = StockQueue('default', connection=conn, job_class=TracedJob)
    job = queue.enqueue('tests.jobs.describe_current_job')
    worker = start_worker('default', burst=True, args=['--job-class', 'tests.jobclasses.TracedJob'])
    wait_for(lambda: worker.proc.poll() is not None, 60, what='burst worker exit')
    assert job.latest_result() is not None, worker.output()
    assert job.latest_result().return_value == 'tests.jobclasses.TracedJob epoch=True traced=True'
    assert conn.lrange(f'test:traced:{job.id}', 0, -1) == [b'TracedJob']
    assert conn.hget(job.key, 'lease_execution') is not None


def test_the_worker_subclass_class_attribute_holds_under_the_rq_cli(conn: redis.Redis, start_worker) -> None:
    job = StockQueue('default', connection=conn).enqueue('tests.jobs.describe_current_job')
    worker = start_worker('default', burst=True, worker_class='tests.jobclasses.TracedWorker')
    wait_for(lambda: worker.proc.poll() is not None, 60, what='burst worker exit')
    assert job.latest_result() is not None, worker.output()
    assert job.latest_result().return_value == 'tests.jobclasses.TracedJob epoch=True traced=True'


def test_rq_epoch_queue_gives_a_job_class_of_yours_the_stall_budget(conn: redis.Redis) -> None:
    class TracedQueue(Queue):
        job_class = TracedJob

    for queue in (Queue('q', connection=conn, job_class=TracedJob), TracedQueue('q', connection=conn)):
        assert queue.job_class is epoch_job_class(TracedJob)
        job = queue.enqueue('tests.jobs.add', 1, 2, max_stalled=1)
        assert isinstance(job, TracedJob)
        assert conn.hget(job.key, 'max_stalled') == b'1'


def test_a_job_reads_its_epoch_fields_from_a_hash_with_bytes_or_text_keys(conn: redis.Redis) -> None:
    job = Queue('q', connection=conn).enqueue('tests.jobs.add', 1, 2, max_stalled=4)
    epoch = 'a' * 40
    conn.hset(
        job.key,
        mapping={
            'status': 'failed',
            'lease_epoch': epoch,
            'lease_execution': 'e1',
            'stalled': '3',
            'stall_dead': '1',
            'exempt_recoveries': '2',
            'stale_outcomes': '5',
        },
    )
    raw = conn.hgetall(job.key)
    for fields in (raw, {name.decode(): value for name, value in raw.items()}):
        restored = rq_epoch.Job(job.id, connection=conn)
        restored.restore(fields)
        read = (
            restored.lease_epoch,
            restored.lease_execution,
            restored.stalled,
            restored.exempt_recoveries,
            restored.stale_outcomes,
            restored.max_stalled,
        )
        assert read == (epoch, 'e1', 3, 2, 5, 4), type(next(iter(fields)))
