"""The dependents of a batch of dead letters: enqueued together, ending as RQ's own
``enqueue_dependents`` job by job would leave them."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from rq.job import Dependency, JobStatus

from rq_epoch import Job, Queue, Sweeper, compat
from rq_epoch.sweep.dependents import BatchDependents
from tests.leases import start_job

TWO_STEPS = hasattr(Queue, 'move_dependents_to_ready')  # RQ 3: made ready, then pushed


class JobByJobQueue(Queue):
    """A queue class with its own ``enqueue_dependents``: the sweep calls it for each dead letter."""

    def enqueue_dependents(self, job, *args, **kwargs):  # type: ignore[no-untyped-def]
        return super().enqueue_dependents(job, *args, **kwargs)


class JobByJobSweeper(Sweeper):
    queue_class = JobByJobQueue


def _dead(conn: redis.Redis, queue: Queue) -> Job:
    return start_job(conn, queue, max_stalled=1)[0]


def _dependent(queue: Queue, *parents: Any, allow_failure: bool = True, at_front: bool = False) -> str:
    depends_on = Dependency(jobs=list(parents), allow_failure=allow_failure, enqueue_at_front=at_front)
    return queue.enqueue('tests.jobs.add', 1, 1, depends_on=depends_on).id


def _cases(conn: redis.Redis, name: str) -> dict[str, str]:
    """Dead letters of queue ``name`` and dependents of every kind RQ's rule tells apart."""
    queue = Queue(name, connection=conn)
    elsewhere = Queue(f'{name}-other', connection=conn)
    a, b, c, d = (_dead(conn, queue) for _ in range(4))
    unfinished = queue.enqueue('tests.jobs.add', 2, 2)
    finished = queue.enqueue('tests.jobs.add', 3, 3)
    finished.set_status(JobStatus.FINISHED)
    conn.delete(queue.key)  # only dependents in the queue: 'at front' must come first
    canceled = _dependent(queue, c)
    Job.fetch(canceled, connection=conn).set_status(JobStatus.CANCELED)
    return {
        'allowed': _dependent(queue, a),
        'not allowed': _dependent(queue, a, allow_failure=False),
        'two dead parents': _dependent(queue, a, b),
        'one parent unfinished': _dependent(queue, b, unfinished),
        'other parent finished': _dependent(queue, c, finished),
        'canceled': canceled,
        'other queue': _dependent(elsewhere, d),
        'at front': _dependent(queue, d, at_front=True),
    }


def _state(conn: redis.Redis, name: str, cases: dict[str, str]) -> dict[str, Any]:
    """Where each dependent ended, with its queue's lists and registries, in names of cases."""
    label = {job_id: case for case, job_id in cases.items()}
    queue, elsewhere = Queue(name, connection=conn), Queue(f'{name}-other', connection=conn)

    def names(ids: list[str]) -> list[str]:
        return sorted(label[i] for i in ids if i in label)

    ready = [r(q.name, connection=conn) for q in (queue, elsewhere) for r in compat.MAINTAINED_REGISTRIES]
    return {
        'status': {case: Job.fetch(i, connection=conn).get_status() for case, i in cases.items()},
        'queued': names(queue.get_job_ids()),
        'queued elsewhere': names(elsewhere.get_job_ids()),
        'first in queue': label.get(queue.get_job_ids()[0]) if queue.get_job_ids() else None,
        'registries': {r.key.replace(name, 'Q'): names(r.get_job_ids()) for r in ready},
    }


def test_dependents_of_a_batch_end_as_rq_leaves_them_job_by_job(conn) -> None:
    batched, job_by_job = _cases(conn, 'batched'), _cases(conn, 'jobbyjob')
    assert len(Sweeper(conn, restart_grace=0).sweep(['batched']).finished) == 4
    assert len(JobByJobSweeper(conn, restart_grace=0).sweep(['jobbyjob']).finished) == 4
    got, expected = _state(conn, 'batched', batched), _state(conn, 'jobbyjob', job_by_job)
    assert got == expected
    # What RQ's rule gives, spelled out, so that both sides agreeing on nothing cannot pass:
    assert got['queued'] == ['allowed', 'at front', 'other parent finished', 'two dead parents']
    assert got['queued elsewhere'] == ['other queue']
    assert got['first in queue'] == 'at front'
    assert got['status']['not allowed'] == got['status']['one parent unfinished'] == JobStatus.DEFERRED
    assert got['status']['canceled'] == JobStatus.CANCELED


def _exec_calls(conn: redis.Redis) -> int:
    return int(conn.info('commandstats').get('cmdstat_exec', {}).get('calls', 0))


def _transactions_to_finish(conn: redis.Redis, sweeper: type[Sweeper], name: str, parents: int) -> int:
    """Transactions (EXEC) a sweep takes to dead-letter ``parents`` jobs with a dependent each."""
    queue = Queue(name, connection=conn)
    dead = [_dead(conn, queue) for _ in range(parents)]
    dependents = [_dependent(queue, parent) for parent in dead]
    before = _exec_calls(conn)
    report = sweeper(conn, restart_grace=0).sweep([name])
    spent = _exec_calls(conn) - before
    assert sorted(report.finished) == sorted(job.id for job in dead)
    assert sorted(queue.get_job_ids()) == sorted(dependents)
    return spent


def test_the_dependents_of_a_batch_take_as_many_transactions_whatever_their_number(conn) -> None:
    few = _transactions_to_finish(conn, Sweeper, 'few', 10)
    many = _transactions_to_finish(conn, Sweeper, 'many', 40)
    job_by_job = _transactions_to_finish(conn, JobByJobSweeper, 'jobbyjob', 10)
    assert few == many
    # RQ's functions job by job: at least a transaction per dead letter (RQ 3: and one more
    # per dependent), where the batch takes a few for all of them.
    assert job_by_job >= few + 10


class LateWriter(BatchDependents):
    """Writes to a key the batch watches while the batch reads (once): a dependent added to a
    parent, or a ready dependent canceled, by someone else between the read and the write."""

    def __init__(self, queue: Queue, write: Any) -> None:
        super().__init__(queue)
        self.write = write
        self.reads = 0

    def _read(self, commands: Any) -> list[Any]:
        replies = super()._read(commands)
        self.reads += 1
        if self.write is not None:
            self.write()
            self.write = None
        return replies


def _failed_parents(conn: redis.Redis, queue: Queue, n: int) -> tuple[list[Job], list[str]]:
    """``n`` failed jobs of ``queue``, each with a dependent (``allow_failure``) still deferred."""
    parents = [queue.enqueue('tests.jobs.add', i, i) for i in range(n)]
    dependents = [_dependent(queue, parent) for parent in parents]
    for parent in parents:
        conn.lrem(queue.key, 0, parent.id)
        parent.set_status(JobStatus.FAILED)
    return parents, dependents


def test_a_dependent_added_while_the_batch_reads_is_made_ready_too(conn) -> None:
    queue = Queue('late', connection=conn)
    parents, dependents = _failed_parents(conn, queue, 3)
    late = dependents.pop()  # deferred, but not yet among the first parent's dependents
    conn.srem(parents[-1].dependents_key, late)
    batch = LateWriter(queue, lambda: conn.sadd(parents[0].dependents_key, late))
    moved = batch.move_to_ready(parents)
    assert batch.write is None  # written after the batch's first read
    if TWO_STEPS:
        assert sorted(moved['late']) == sorted([*dependents, late])
    assert conn.exists(parents[0].dependents_key) == 0
    batch.enqueue_ready(moved)
    assert sorted(queue.get_job_ids()) == sorted([*dependents, late])


@pytest.mark.skipif(not TWO_STEPS, reason='RQ 2 enqueues dependents in one step: nothing is pushed later')
def test_a_ready_dependent_canceled_while_the_batch_reads_is_not_pushed(conn) -> None:
    queue = Queue('cancel', connection=conn)
    parents, dependents = _failed_parents(conn, queue, 3)
    moved = BatchDependents(queue).move_to_ready(parents)
    assert sorted(moved['cancel']) == sorted(dependents)
    batch = LateWriter(queue, lambda: Job.fetch(dependents[1], connection=conn).set_status(JobStatus.CANCELED))
    batch.enqueue_ready(moved)
    assert batch.reads == 1 and batch.write is None
    assert sorted(queue.get_job_ids()) == sorted([dependents[0], dependents[2]])
    assert queue.ready_job_registry.get_job_ids() == []  # type: ignore[attr-defined]
    assert Job.fetch(dependents[1], connection=conn).get_status() == JobStatus.CANCELED
