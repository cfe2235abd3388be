"""The commit script and the armed pipeline, against a real server: the check and the write
are one step, a refused commit writes nothing of the outcome, and the heartbeat tells its
own commit from a sweep by the execution's identity."""

from __future__ import annotations

import pytest
import redis

from rq_epoch import Fence, Job, OutcomeInterrupted, OutcomeRefused, PrimaryWatch, Queue, ServerOutageError
from rq_epoch.protocol import keys, scripts, verbs
from rq_epoch.worker.fence import arm
from tests.leases import execution_of, start_job


def _fence(job: Job) -> Fence:
    """The fence of the execution that holds the job's lease."""
    return Fence('default', job.id, job.lease_execution)


def _outcome(conn: redis.Redis, fence: Fence, *, with_script: bool = False, dependents: int = 2) -> list:
    """An outcome transaction as RQ builds one, armed as the worker arms it."""
    with conn.pipeline() as pipeline:
        pipeline.hset(keys.job_key(fence.job_id), 'status', 'finished')
        pipeline.zrem(keys.leases_key('default'), fence.member)
        pipeline.sadd('test:dependents', *(f'd{i}' for i in range(dependents)))
        if with_script:  # a transaction that already carries a script call
            conn.register_script("return redis.call('RPUSH', KEYS[1], ARGV[1])")(
                keys=['test:pushed'], args=['x'], client=pipeline
            )
        pipeline.xadd(f'{keys.PREFIX}:results:{fence.job_id}', {'type': '1'})
        arm(pipeline, fence)
        return pipeline.execute()


@pytest.mark.parametrize(
    ('with_script', 'dependents'), [(False, 2), (True, 2), (False, 20_000)], ids=['scripted', 'watched', 'long']
)
def test_the_holder_commits_and_replies_come_back_as_redis_py_gives_them(
    conn, with_script: bool, dependents: int
) -> None:
    job, member = start_job(conn, Queue('default', connection=conn), expired=True)
    replies = _outcome(conn, _fence(job), with_script=with_script, dependents=dependents)
    assert replies[:3] == [0, 1, dependents]  # HSET of an existing field, ZREM of the lease, SADD
    assert isinstance(replies[-1], str | bytes)  # the stream entry id
    assert conn.hget(job.key, 'status') == b'finished'
    assert conn.xlen(f'{keys.PREFIX}:results:{job.id}') == 1
    assert conn.lrange('test:pushed', 0, -1) == ([b'x'] if with_script else [])


@pytest.mark.parametrize('with_script', [False, True], ids=['scripted', 'watched'])
def test_after_a_sweep_took_the_lease_nothing_of_the_outcome_lands(conn, with_script: bool) -> None:
    from rq_epoch import Sweeper

    job, member = start_job(conn, Queue('default', connection=conn), expired=True)
    (verdict,) = Sweeper(conn, restart_grace=0).sweep(['default']).verdicts
    assert verdict.verdict == 'recovered'
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, _fence(job), with_script=with_script)
    assert (refused.value.reason, refused.value.detail) == ('taken', 'recovered')
    assert conn.hget(job.key, 'status') == b'queued'
    assert conn.exists(f'{keys.PREFIX}:results:{job.id}', 'test:pushed', 'test:dependents') == 0
    assert conn.hget(job.key, 'stale_outcomes') == b'1'
    assert conn.hget(keys.stats_key('default'), 'refused') == b'1'


def test_a_newer_grant_supersedes_the_old_execution(conn) -> None:
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    scripts.grant()(conn, [keys.leases_key('default'), job.key], [job.id, 60, 'newer'])
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, _fence(job))
    assert (refused.value.reason, refused.value.detail) == ('superseded', 'newer')
    assert conn.hget(job.key, 'status') == b'started'


def test_the_commit_script_is_loaded_again_after_a_restart(server, conn) -> None:
    job, member = start_job(conn, Queue('default', connection=conn), expired=False)
    conn.script_flush()  # what a restart does to the script cache
    assert conn.script_exists(scripts.commit().sha) == [False]
    _outcome(conn, _fence(job))
    assert conn.hget(job.key, 'status') == b'finished'


def test_the_heartbeat_tells_its_own_commit_from_a_sweep_by_identity(conn) -> None:
    """Own commit, then a newer grant: the old execution's extend says "gone", not "taken"."""
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    _outcome(conn, _fence(job))
    scripts.grant()(conn, [keys.leases_key('default'), job.key], [job.id, 60, 'newer'])
    extend = [keys.leases_key('default'), job.key]
    reply = verbs.extend(conn, extend, [job.id, 30, job.lease_execution])
    assert (reply.extended, reply.taken) == (False, '')


def _unleased(conn: redis.Redis, queue: Queue) -> Fence:
    """A job started by an execution that was never granted a lease (no holder recorded)."""
    job = queue.enqueue('tests.jobs.add', 1, 2)
    conn.lrem(queue.key, 0, job.id)
    conn.hset(job.key, 'status', 'started')
    return Fence(queue.name, job.id, 'unleased')


@pytest.mark.parametrize('with_script', [False, True], ids=['scripted', 'watched'])
def test_an_unleased_execution_commits_once_and_its_retry_is_refused_as_gone(conn, with_script: bool) -> None:
    fence = _unleased(conn, Queue('default', connection=conn))
    assert fence.check(conn) is None  # nobody took over: its callbacks may run
    _outcome(conn, fence, with_script=with_script)
    assert conn.hget(keys.job_key(fence.job_id), 'status') == b'finished'
    assert conn.exists(keys.committed_key(fence.composite_key)) == 1
    # The worker sends the same commit again when it could not tell whether the first landed.
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, fence, with_script=with_script)
    assert refused.value.reason == 'gone'
    assert conn.xlen(f'{keys.PREFIX}:results:{fence.job_id}') == 1
    assert conn.lrange('test:pushed', 0, -1) == ([b'x'] if with_script else [])
    assert conn.hget(keys.stats_key('default'), 'refused') is None  # a retry is not a stale outcome


def test_an_unleased_execution_is_refused_once_a_newer_one_holds_the_job(conn) -> None:
    fence = _unleased(conn, Queue('default', connection=conn))
    scripts.grant()(conn, [keys.leases_key('default'), keys.job_key(fence.job_id)], [fence.job_id, 60, 'newer'])
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, fence)
    assert (refused.value.reason, refused.value.detail) == ('superseded', 'newer')
    assert conn.hget(keys.job_key(fence.job_id), 'status') == b'started'
    assert conn.exists(keys.committed_key(fence.composite_key)) == 0


def test_an_unleased_execution_whose_entry_a_sweep_requeued_is_refused(conn) -> None:
    """RQ's own registry entry, with a real deadline (as a worker without a grant leaves it): the
    sweep requeues the job and records it, and the execution's outcome is refused."""
    from rq_epoch import Sweeper

    fence = _unleased(conn, Queue('default', connection=conn))
    seconds, _ = conn.time()
    conn.zadd(keys.wip_key('default'), {fence.composite_key: seconds - 5})
    (verdict,) = Sweeper(conn, restart_grace=0).sweep(['default']).verdicts
    assert verdict.verdict == 'exempt'
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, fence)
    assert (refused.value.reason, refused.value.detail) == ('taken', 'exempt')
    assert conn.hget(keys.job_key(fence.job_id), 'status') == b'queued'
    assert conn.xlen(f'{keys.PREFIX}:results:{fence.job_id}') == 0


@pytest.mark.parametrize('with_script', [False, True], ids=['scripted', 'watched'])
@pytest.mark.parametrize('where', ['queue', 'intermediate'])
def test_an_unleased_execution_whose_job_can_still_be_taken_is_refused_and_counted(
    conn, with_script: bool, where: str
) -> None:
    """What a failover that lost the take and the grant leaves: the job back in its queue (or
    in the intermediate list, when only the grant was lost), no lease, no holder. The outcome
    must not land beside the one the job's next execution will write: it is refused whole,
    counted as a stale outcome, and the job stays where it can be taken."""
    queue = Queue('default', connection=conn)
    fence = _unleased(conn, queue)
    where_key = queue.key if where == 'queue' else keys.intermediate_key(queue.name)
    conn.rpush(where_key, 'another-job', fence.job_id, 'a-third-job')
    refusal = fence.check(conn)  # its callbacks do not run either
    assert refusal is not None and refusal.reason == 'queued'
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, fence, with_script=with_script)
    assert (refused.value.reason, refused.value.detail) == ('queued', where_key)
    assert 'waits in' in refused.value.describe()
    assert conn.hget(keys.job_key(fence.job_id), 'status') == b'started'
    assert conn.exists(f'{keys.PREFIX}:results:{fence.job_id}', 'test:pushed', 'test:dependents') == 0
    assert conn.exists(keys.committed_key(fence.composite_key)) == 0
    assert conn.lrange(where_key, 0, -1) == [b'another-job', fence.job_id.encode(), b'a-third-job']
    assert conn.hget(keys.job_key(fence.job_id), 'stale_outcomes') == b'1'
    assert conn.hget(keys.stats_key('default'), 'refused') == b'1'
    # Once the job's next execution took it from the list and was granted, the old one is superseded.
    conn.lrem(where_key, 0, fence.job_id)
    scripts.grant()(conn, [keys.leases_key('default'), keys.job_key(fence.job_id)], [fence.job_id, 60, 'next'])
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, fence, with_script=with_script)
    assert (refused.value.reason, refused.value.detail) == ('superseded', 'next')


def test_a_retried_commit_of_an_outcome_that_requeued_the_job_is_gone_not_queued(conn) -> None:
    """A leased execution's retry outcome puts the job back in its queue; the same commit sent
    again (the reply was lost) finds its own lease gone: "gone", not counted as stale."""
    queue = Queue('default', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    fence = _fence(job)
    with conn.pipeline() as pipeline:
        pipeline.zrem(keys.leases_key('default'), member)
        pipeline.rpush(queue.key, job.id)
        arm(pipeline, fence)
        pipeline.execute()
    with conn.pipeline() as pipeline:
        pipeline.zrem(keys.leases_key('default'), member)
        pipeline.rpush(queue.key, job.id)
        arm(pipeline, fence)
        with pytest.raises(OutcomeRefused) as refused:
            pipeline.execute()
    assert refused.value.reason == 'gone'
    assert conn.lrange(queue.key, 0, -1) == [job.id.encode()]
    assert conn.hget(keys.stats_key('default'), 'refused') is None


def test_an_unleased_execution_of_a_deleted_job_writes_nothing(conn) -> None:
    fence = _unleased(conn, Queue('default', connection=conn))
    conn.delete(keys.job_key(fence.job_id))
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, fence)
    assert refused.value.reason == 'gone'
    assert conn.exists(keys.job_key(fence.job_id), f'{keys.PREFIX}:results:{fence.job_id}') == 0


@pytest.mark.parametrize('with_script', [False, True], ids=['scripted', 'watched'])
def test_a_leased_execution_commits_once_and_its_retry_is_refused_as_gone(conn, with_script: bool) -> None:
    job, member = start_job(conn, Queue('default', connection=conn), expired=False)
    fence = _fence(job)
    _outcome(conn, fence, with_script=with_script)
    with pytest.raises(OutcomeRefused) as refused:
        _outcome(conn, fence, with_script=with_script)
    assert refused.value.reason == 'gone'
    assert conn.xlen(f'{keys.PREFIX}:results:{job.id}') == 1
    assert conn.exists(keys.committed_key(execution_of(job))) == 0  # a leased commit needs no record


def test_a_commit_rebuilt_after_the_script_was_loaded_is_still_fenced_and_cleans_up(conn) -> None:
    """RQ's success path WATCHes the job's dependents, so a commit that finds the script
    missing (the server restarted) makes RQ build the transaction again. The rebuilt one must
    still remove the execution and its lease, under the same fence (RQ 2 lets go of the
    execution on the first attempt)."""
    from rq_epoch import Worker

    queue = Queue('default', connection=conn)
    job = queue.enqueue('tests.jobs.add', 2, 3)
    worker = Worker([queue], connection=conn)
    scripts.load_all(conn)
    execution = worker.prepare_execution(job)
    conn.script_flush()  # what a restart does to the script cache
    worker.perform_job(job, queue, execution) if _perform_takes_execution() else worker.perform_job(job, queue)
    assert conn.hget(job.key, 'status') == b'finished'
    assert conn.zcard(keys.leases_key('default')) == 0
    assert conn.exists(f'{keys.PREFIX}:execution:{job.id}:{execution.id}') == 0
    assert conn.xlen(f'{keys.PREFIX}:results:{job.id}') == 1


def _perform_takes_execution() -> bool:
    import inspect

    from rq.worker import Worker as StockWorker

    return 'execution' in inspect.signature(StockWorker.perform_job).parameters


@pytest.mark.parametrize(
    ('with_script', 'dependents'), [(False, 2), (True, 2), (False, 20_000)], ids=['scripted', 'watched', 'long']
)
def test_a_commit_the_server_refuses_for_want_of_replicas_is_an_outage_and_lands_once_when_sent_again(
    server, conn, with_script: bool, dependents: int
) -> None:
    """``min-replicas-to-write`` unmet: the server runs the commit script but refuses its writes.

    That must reach the worker as an outage (:class:`ServerOutageError`, carried by
    :class:`OutcomeInterrupted` across RQ's ``except Exception`` blocks; the worker rides it
    out by sending the commit again), not as a failure of the job; nothing of the outcome
    lands, and the commit sent again once the server takes writes lands once.
    """
    conn = redis.Redis(host='127.0.0.1', port=server.port)  # the fixture emptied the server
    PrimaryWatch(conn, interval=1).install()  # as the worker's connection has it
    job, member = start_job(conn, Queue('default', connection=conn), expired=False)
    fence = _fence(job)
    conn.config_set('min-replicas-to-write', 1)  # no replica: every write is refused (NOREPLICAS)
    try:
        with pytest.raises(OutcomeInterrupted) as interrupted:
            _outcome(conn, fence, with_script=with_script, dependents=dependents)
        outage = interrupted.value.error
        assert isinstance(outage, ServerOutageError) and interrupted.value.__cause__ is outage
        assert isinstance(outage, redis.exceptions.ConnectionError)
        assert 'NOREPLICAS' in str(outage)
    finally:
        conn.config_set('min-replicas-to-write', 0)
    assert conn.hget(job.key, 'status') == b'started'
    assert conn.zscore(keys.leases_key('default'), member) is not None
    assert conn.exists(f'{keys.PREFIX}:results:{job.id}', 'test:pushed', 'test:dependents') == 0
    _outcome(conn, fence, with_script=with_script, dependents=dependents)
    assert conn.hget(job.key, 'status') == b'finished'
    assert conn.xlen(f'{keys.PREFIX}:results:{job.id}') == 1
    assert conn.hget(job.key, 'stale_outcomes') is None
    conn.close()


def test_a_grant_whose_take_this_server_never_saw_takes_the_job_off_its_queue(conn) -> None:
    """A failover lost the take (RQ's BLMOVE into the intermediate list), and the worker granted
    on the new primary: the job still waits in its queue there. The grant takes it off the queue
    with the lease, atomically, so that no other worker runs it beside this execution; a job
    whose take's entry is there keeps the rest of its queue as it was."""
    from rq_epoch.jobs.job import StartedJobRegistry

    queue = Queue('default', connection=conn)
    registry = StartedJobRegistry('default', connection=conn)
    lost = queue.enqueue('tests.jobs.add', 1, 2)
    other = queue.enqueue('tests.jobs.add', 3, 4)
    reply = verbs.grant(conn, registry.grant_keys(lost.id), [lost.id, 60, 'e1', keys.PREFIX])
    assert reply.granted
    assert conn.lrange(queue.key, 0, -1) == [other.id.encode()]  # off the queue, with its lease
    assert conn.zscore(keys.leases_key('default'), lost.id) is not None
    # The usual case: the take moved it into the intermediate list; the queue is not touched.
    conn.lrem(queue.key, 0, other.id)
    conn.rpush(keys.intermediate_key('default'), other.id)
    third = queue.enqueue('tests.jobs.add', 5, 6)
    verbs.grant(conn, registry.grant_keys(other.id), [other.id, 60, 'e2', keys.PREFIX])
    assert conn.lrange(keys.intermediate_key('default'), 0, -1) == []
    assert conn.lrange(queue.key, 0, -1) == [third.id.encode()]
    # The outcome of the execution that holds the lease lands; the job can be taken from nowhere.
    _outcome(conn, Fence('default', lost.id, 'e1'))
    assert conn.hget(lost.key, 'status') == b'finished'
