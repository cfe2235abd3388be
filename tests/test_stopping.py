"""The stop mark, the verdict ``stopping`` and the hand-back, on real servers.

A worker told to stop marks its lease (``stopmark.lua``); a sweep requeues a marked lease that
ran out within the stop window uncounted, verdict ``stopping``, and judges any other as before
(``sweep.lua``). A worker that stopped its job hands it back (``handback.lua``): fenced, so
that of its own outcome and its hand-back exactly one lands, and a lease a sweep took cannot
be handed back. The worker-side scenarios are in ``tests/test_deploys.py``.
"""

from __future__ import annotations

import logging
import uuid

import pytest
import redis
from rq.executions import Execution
from rq.job import JobStatus

from rq_epoch import Job, Queue, Sweeper, Worker
from rq_epoch.protocol import keys, scripts, verbs
from rq_epoch.worker.stopping import hand_back, mark_stopping
from tests.conftest import wait_for
from tests.leases import OTHER_EPOCH, execution_of, start_job

QUEUE = 'default'


def sweep(conn: redis.Redis, **kwargs: object):
    return Sweeper(conn, restart_grace=0, **kwargs).sweep([QUEUE])


def server_now(conn: redis.Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def execution(conn: redis.Redis, job: Job) -> Execution:
    """The execution that holds the job's lease, as its worker has it."""
    return Execution(str(job.lease_execution), job.id, connection=conn)


def run_out_after(conn: redis.Redis, job: Job, at: float) -> None:
    """The lease's last heartbeat ran out at server time ``at`` (which must be past): its deadline."""
    wait_for(lambda: server_now(conn) > at, 5, interval=0.005, what='the server clock to pass the deadline')
    conn.zadd(keys.leases_key(QUEUE), {job.id: at}, xx=True)


def marked_job(conn: redis.Redis, window: int, **start: object) -> tuple[Job, verbs.StopMarkReply]:
    job, _ = start_job(conn, Queue(QUEUE, connection=conn), expired=False, **start)
    reply = mark_stopping(conn, job, execution(conn, job), window)
    assert reply.marked
    return Job.fetch(job.id, connection=conn), reply


# -- the stop mark ------------------------------------------------------------------------


def test_the_mark_is_written_with_server_time_and_the_window(conn) -> None:
    before = server_now(conn)
    job, reply = marked_job(conn, 30)
    after = server_now(conn)
    assert before <= reply.marked_at <= after
    assert reply.until == pytest.approx(reply.marked_at + 30)
    written = f'{job.lease_execution} {reply.marked_at:.6f} {reply.until:.6f}'
    assert conn.hget(job.key, keys.STOP_MARK_FIELD).decode() == written


def test_a_lease_that_is_not_held_or_already_ran_out_is_not_marked(conn) -> None:
    queue = Queue(QUEUE, connection=conn)
    expired, _ = start_job(conn, queue)  # its deadline is in the past already
    assert not mark_stopping(conn, expired, execution(conn, expired), 30).marked
    held, _ = start_job(conn, queue, expired=False)
    stale = Execution(uuid.uuid4().hex, held.id, connection=conn)
    assert not mark_stopping(conn, held, stale, 30).marked
    assert conn.hget(expired.key, keys.STOP_MARK_FIELD) is None
    assert conn.hget(held.key, keys.STOP_MARK_FIELD) is None


# -- the verdict stopping ----------------------------------------------------------------------


def test_a_marked_lease_that_runs_out_within_the_window_is_requeued_uncounted(conn) -> None:
    queue = Queue(QUEUE, connection=conn)
    waiting = queue.enqueue('tests.jobs.add', 1, 1)
    job, mark = marked_job(conn, 30)
    run_out_after(conn, job, mark.marked_at + 0.01)
    report = sweep(conn)
    assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job.id, 'stopping')]
    assert queue.get_job_ids() == [job.id, waiting.id]
    job = Job.fetch(job.id, connection=conn)
    assert (job.get_status(), job.stalled, job.exempt_recoveries) == (JobStatus.QUEUED, 0, 0)
    assert conn.hget(job.key, 'stopping_recoveries') == b'1'
    assert conn.hget(job.key, keys.STOP_MARK_FIELD) is None
    assert conn.hget(job.key, keys.taken_field(str(job.lease_execution))) == b'stopping'
    assert conn.hget(keys.stats_key(QUEUE), 'stopping') == b'1'
    assert conn.zcard(keys.leases_key(QUEUE)) == 0
    assert not conn.zscore(keys.wip_key(QUEUE), execution_of(job))


def test_a_marked_lease_that_runs_out_after_the_window_is_counted(conn) -> None:
    job, mark = marked_job(conn, 0)  # the window ends at the mark
    run_out_after(conn, job, mark.until + 0.01)
    assert [v.verdict for v in sweep(conn).verdicts] == ['recovered']
    assert Job.fetch(job.id, connection=conn).stalled == 1


def test_a_lease_that_ran_out_before_its_mark_is_counted(conn) -> None:
    job, mark = marked_job(conn, 30)
    run_out_after(conn, job, mark.marked_at - 0.5)
    assert [v.verdict for v in sweep(conn).verdicts] == ['recovered']


def test_an_unmarked_lease_is_counted(conn) -> None:
    job, _ = start_job(conn, Queue(QUEUE, connection=conn))
    assert [v.verdict for v in sweep(conn).verdicts] == ['recovered']
    assert conn.hget(keys.stats_key(QUEUE), 'stopping') is None


def test_a_mark_of_an_earlier_execution_does_not_cover_the_newer_one(conn) -> None:
    job, mark = marked_job(conn, 30)
    newer = uuid.uuid4().hex
    scripts.grant()(conn, [keys.leases_key(QUEUE), job.key], [job.id, 60, newer])
    run_out_after(conn, job, mark.marked_at + 0.01)
    assert [v.verdict for v in sweep(conn).verdicts] == ['recovered']


def test_a_marked_lease_of_another_server_process_is_stopping_after_the_grace(conn) -> None:
    job, mark = marked_job(conn, 30, epoch=OTHER_EPOCH)
    run_out_after(conn, job, mark.marked_at + 0.01)
    assert [v.verdict for v in Sweeper(conn, restart_grace=3600).sweep([QUEUE]).verdicts] == ['deferred']
    assert [v.verdict for v in sweep(conn).verdicts] == ['stopping']


def test_a_dry_run_reports_stopping_and_writes_nothing(conn) -> None:
    job, mark = marked_job(conn, 30)
    run_out_after(conn, job, mark.marked_at + 0.01)
    before = conn.hgetall(job.key)
    report = Sweeper(conn, restart_grace=0).sweep([QUEUE], dry_run=True)
    assert report.counts()['stopping'] == 1
    assert conn.hgetall(job.key) == before
    assert conn.zscore(keys.leases_key(QUEUE), job.id) is not None


# -- the hand-back ------------------------------------------------------------------------------


def test_a_held_lease_is_handed_back_to_the_front_uncounted(conn) -> None:
    queue = Queue(QUEUE, connection=conn)
    waiting = queue.enqueue('tests.jobs.add', 1, 1)
    job, _ = start_job(conn, queue, expired=False)
    run = execution(conn, job)
    reply = hand_back(conn, job, run)
    assert reply.handed_back and reply.at > 0
    assert queue.get_job_ids() == [job.id, waiting.id]
    job = Job.fetch(job.id, connection=conn)
    assert (job.get_status(), job.stalled, job.exempt_recoveries) == (JobStatus.QUEUED, 0, 0)
    assert conn.hget(job.key, 'handed_back') == b'1'
    assert conn.hget(keys.stats_key(QUEUE), 'handed_back') == b'1'
    assert conn.zscore(keys.leases_key(QUEUE), job.id) is None
    assert conn.zscore(keys.wip_key(QUEUE), execution_of(job)) is None
    assert not conn.exists(keys.execution_key(execution_of(job)))
    assert conn.sismember(keys.worker_executions_key('test-worker'), execution_of(job)) == 0
    # Sent again (a retry after a connection error): refused as this execution's own hand-back.
    again = hand_back(conn, job, run)
    assert (again.handed_back, again.landed_before) == (False, True)
    assert queue.get_job_ids() == [job.id, waiting.id]
    assert conn.hget(keys.stats_key(QUEUE), 'refused') is None


def test_a_lease_a_sweep_took_cannot_be_handed_back(conn) -> None:
    queue = Queue(QUEUE, connection=conn)
    job, _ = start_job(conn, queue)
    run = execution(conn, job)
    assert [v.verdict for v in sweep(conn).verdicts] == ['recovered']
    reply = hand_back(conn, job, run)
    assert (reply.handed_back, reply.reason, reply.detail) == (False, 'taken', 'recovered')
    assert queue.get_job_ids() == [job.id]  # once, as the sweep requeued it
    assert conn.hget(keys.stats_key(QUEUE), 'refused') == b'1'
    assert conn.hget(keys.stats_key(QUEUE), 'handed_back') is None
    assert conn.hget(job.key, 'handed_back') is None


def test_a_lease_a_newer_execution_holds_cannot_be_handed_back(conn) -> None:
    job, _ = start_job(conn, Queue(QUEUE, connection=conn), expired=False)
    run = execution(conn, job)
    newer = uuid.uuid4().hex
    scripts.grant()(conn, [keys.leases_key(QUEUE), job.key], [job.id, 60, newer])
    reply = hand_back(conn, job, run)
    assert (reply.handed_back, reply.reason, reply.detail, reply.holder) == (False, 'superseded', newer, newer)


def _commit_outcome(conn: redis.Redis, job: Job, run: Execution) -> verbs.CommitReply:
    """The execution's outcome, through the commit script as the worker's fence sends it: the job
    finished, its lease removed (RQ's transaction, reduced to the two writes that matter here)."""
    commands = [
        ['HSET', job.key, 'status', JobStatus.FINISHED.value],
        ['ZREM', keys.leases_key(QUEUE), job.id],
    ]
    args: list[object] = [job.id, run.id, '1', len(commands), keys.COMMITTED_RECORD_TTL]
    for command in commands:
        args += [len(command), *command]
    return verbs.commit(
        conn,
        [keys.leases_key(QUEUE), job.key, keys.stats_key(QUEUE), keys.committed_key(f'{job.id}:{run.id}')],
        args,
    )


@pytest.mark.parametrize('first', ['outcome', 'hand-back'])
def test_of_an_outcome_and_a_hand_back_exactly_one_lands(conn, first: str) -> None:
    """The race of a work-horse that commits its outcome while its worker hands the job back."""
    queue = Queue(QUEUE, connection=conn)
    job, _ = start_job(conn, queue, expired=False)
    run = execution(conn, job)
    if first == 'outcome':
        assert _commit_outcome(conn, job, run).lands
        reply = hand_back(conn, job, run)
        assert (reply.handed_back, reply.reason, reply.landed_before) == (False, 'gone', False)
        assert Job.fetch(job.id, connection=conn).get_status() == JobStatus.FINISHED
        assert queue.get_job_ids() == []
    else:
        assert hand_back(conn, job, run).handed_back
        refused = _commit_outcome(conn, job, run)
        assert (refused.lands, refused.reason, refused.detail) == (False, 'taken', 'handed_back')
        assert Job.fetch(job.id, connection=conn).get_status() == JobStatus.QUEUED
        assert queue.get_job_ids() == [job.id]


def test_a_worker_whose_lease_a_sweep_took_logs_the_refused_hand_back(conn, caplog: pytest.LogCaptureFixture) -> None:
    queue = Queue(QUEUE, connection=conn)
    job, _ = start_job(conn, queue)
    run = execution(conn, job)
    assert [v.verdict for v in sweep(conn).verdicts] == ['recovered']
    worker = Worker([QUEUE], connection=conn)
    with caplog.at_level(logging.WARNING):
        reply = worker.hand_back(job, run)
    assert reply is not None and (reply.handed_back, reply.reason) == (False, 'taken')
    assert f'job {job.id} was not handed back' in caplog.text
    assert 'taken recovered' in caplog.text
    assert conn.hget(keys.stats_key(QUEUE), 'refused') == b'1'
