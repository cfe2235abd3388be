"""One lease per job, named by the job id, and an upgrade from 0.2.0 (whose leases are named
``<job_id>:<execution_id>`` in another key) with workers and sweepers of both versions at once.

The 0.2.0 side runs the released 0.2.0 scripts (``tests/rq_epoch_0_2_0/``), as its workers and
cron sweepers still do during a rolling deploy.
"""

from __future__ import annotations

import pytest
import redis
from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from rq_epoch import Fence, Job, OutcomeRefused, Queue, Sweeper
from rq_epoch.jobs.job import StartedJobRegistry
from rq_epoch.protocol import keys, scripts, verbs
from tests.leases import (
    OTHER_EPOCH,
    execution_of,
    expire,
    legacy_grant,
    legacy_start_job,
    legacy_sweep,
    start_job,
)


def _extend(conn: redis.Redis, job: Job, execution_id: str) -> verbs.ExtendReply:
    return verbs.extend(conn, [keys.leases_key(job.origin), job.key], [job.id, 30, execution_id])


def _commit_status(conn: redis.Redis, job: Job, execution_id: str) -> None:
    """An outcome of the execution, fenced as the worker fences it."""
    from rq_epoch.worker.fence import arm

    with conn.pipeline() as pipeline:
        pipeline.hset(job.key, 'status', 'finished')
        pipeline.zrem(keys.leases_key(job.origin), job.id)
        arm(pipeline, Fence(job.origin, job.id, execution_id))
        pipeline.execute()


def _rq_records(conn: redis.Redis, member: str, worker_name: str) -> dict[str, bool]:
    job_id, execution_id = member.split(':')
    queue = Job.fetch(job_id, connection=conn).origin
    return {
        'wip': conn.zscore(keys.wip_key(queue), member) is not None,
        'execution': bool(conn.exists(keys.execution_key(member))),
        'job executions': conn.zscore(keys.job_executions_key(job_id), execution_id) is not None,
        'worker executions': bool(conn.sismember(keys.worker_executions_key(worker_name), member)),
    }


def test_a_lease_member_is_the_job_id_and_a_second_grant_replaces_the_first(conn) -> None:
    queue = Queue('one', connection=conn)
    job, member = start_job(conn, queue, expired=False)
    assert member == job.id
    older = job.lease_execution
    assert conn.zrange(keys.leases_key('one'), 0, -1) == [job.id.encode()]

    assert conn.zscore(keys.wip_key('one'), execution_of(job)) is not None
    scripts.grant()(conn, StartedJobRegistry('one', connection=conn).grant_keys(job.id), [job.id, 60, 'newer'])
    assert conn.zrange(keys.leases_key('one'), 0, -1) == [job.id.encode()]  # still one lease
    assert conn.zscore(keys.wip_key('one'), execution_of(job)) is None  # RQ's entry of the older one went
    assert conn.hget(job.key, 'lease_execution') == b'newer'
    deadline = conn.zscore(keys.leases_key('one'), job.id)

    # The older execution's heartbeat is told its lease is gone, and extends nothing.
    lost = _extend(conn, job, older)
    assert (lost.extended, lost.taken) == (False, '')
    assert conn.zscore(keys.leases_key('one'), job.id) == deadline
    # Its outcome is refused; the newer execution's lands.
    with pytest.raises(OutcomeRefused) as refused:
        _commit_status(conn, job, older)
    assert (refused.value.reason, refused.value.detail) == ('superseded', 'newer')
    assert conn.hget(job.key, 'status') == b'started'
    assert _extend(conn, job, 'newer').extended
    _commit_status(conn, job, 'newer')
    assert conn.hget(job.key, 'status') == b'finished'
    assert conn.zcard(keys.leases_key('one')) == 0


def test_the_new_version_writes_nothing_to_the_key_0_2_0_reads(conn) -> None:
    """Grant, extend, commit and sweep of this version leave ``<prefix>:epoch:leases:<queue>`` alone,
    and 0.2.0's own sweep, run beside them, finds nothing to judge: it cannot drop a lease it
    does not know the shape of."""
    queue = Queue('apart', connection=conn)
    job, _ = start_job(conn, queue, max_stalled=1)  # expired, counted: a dead letter if judged
    live, _ = start_job(conn, queue, expired=False)
    assert _extend(conn, live, live.lease_execution).extended
    _commit_status(conn, live, live.lease_execution)

    assert legacy_sweep(conn, 'apart', max_stalled=1) == []
    assert conn.exists(keys.legacy_leases_key('apart')) == 0
    assert conn.zscore(keys.leases_key('apart'), job.id) is not None  # still the new sweep's to judge
    assert conn.hget(job.key, 'status') == b'started'

    (verdict,) = Sweeper(conn, restart_grace=0).sweep(['apart']).verdicts
    assert (verdict.member, verdict.job_id, verdict.verdict) == (job.id, job.id, 'dead')
    assert conn.exists(keys.legacy_leases_key('apart')) == 0


@pytest.mark.parametrize('verdict', ['exempt', 'recovered', 'dead', 'settled'])
def test_a_0_2_0_lease_is_judged_by_the_new_sweep_and_rqs_records_of_its_execution_are_dropped(
    conn, verdict: str
) -> None:
    queue = Queue('legacy', connection=conn)
    job, member = legacy_start_job(conn, queue, max_stalled=1 if verdict == 'dead' else 3)
    assert conn.zrange(keys.legacy_leases_key('legacy'), 0, -1) == [member.encode()]
    if verdict == 'exempt':
        conn.hset(job.key, 'lease_epoch', OTHER_EPOCH)
    elif verdict == 'settled':
        conn.hset(job.key, 'status', 'finished')
    expire(conn, 'legacy', member, key=keys.legacy_leases_key)
    assert all(_rq_records(conn, member, 'old-worker').values())

    report = Sweeper(conn, restart_grace=0).sweep(['legacy'])

    assert [(v.member, v.job_id, v.verdict) for v in report.verdicts] == [(member, job.id, verdict)]
    assert conn.exists(keys.legacy_leases_key('legacy')) == 0
    assert not any(_rq_records(conn, member, 'old-worker').values())
    job = Job.fetch(job.id, connection=conn)
    execution_id = member.split(':')[1]
    if verdict == 'settled':
        assert job.get_status() == JobStatus.FINISHED
        assert conn.hget(job.key, f'taken:{execution_id}') is None
        return
    assert conn.hget(job.key, f'taken:{execution_id}') == verdict.encode()
    assert job.stalled == (0 if verdict == 'exempt' else 1)
    if verdict == 'dead':
        assert job.get_status() == JobStatus.FAILED
        assert job.id in FailedJobRegistry('legacy', connection=conn)
    else:
        assert job.get_status() == JobStatus.QUEUED
        assert queue.get_job_ids() == [job.id]


def test_a_0_2_0_grant_after_a_new_one_keeps_its_own_lease_and_records(conn) -> None:
    """A 0.2.0 worker started the job again while an older execution of this version held it:
    the newer (0.2.0) lease wins. The new sweep settles the stale job-id lease without touching
    the 0.2.0 execution's records, and judges the 0.2.0 lease once it expires."""
    queue = Queue('mixed', connection=conn)
    job, _ = start_job(conn, queue, expired=False)
    older = job.lease_execution
    newer = 'from-a-0-2-0-worker'
    member = f'{job.id}:{newer}'
    conn.zadd(keys.wip_key('mixed'), {member: '+inf'})
    conn.hset(keys.execution_key(member), mapping={'id': newer, 'job_id': job.id, 'worker_name': 'old-worker'})
    legacy_grant(conn, 'mixed', job.id, newer)
    lost = _extend(conn, job, older)
    assert (lost.extended, lost.taken) == (False, '')  # the older execution has lost its lease
    expire(conn, 'mixed', job.id)

    report = Sweeper(conn, restart_grace=0).sweep(['mixed'])
    assert [(v.member, v.verdict) for v in report.verdicts] == [(job.id, 'settled')]
    assert conn.zscore(keys.wip_key('mixed'), member) is not None
    assert conn.exists(keys.execution_key(member)) == 1
    assert conn.hget(job.key, 'status') == b'started'

    expire(conn, 'mixed', member, key=keys.legacy_leases_key)
    report = Sweeper(conn, restart_grace=0, max_stalled=3).sweep(['mixed'])
    assert [(v.member, v.verdict) for v in report.verdicts] == [(member, 'recovered')]
    assert conn.zscore(keys.wip_key('mixed'), member) is None
    assert conn.hget(job.key, f'taken:{newer}') == b'recovered'


def test_status_metrics_and_history_read_0_2_0_leases(conn) -> None:
    from rq_epoch.ops.history import job_history
    from rq_epoch.ops.metrics import read_snapshot
    from rq_epoch.ops.status import read_status

    queue = Queue('both', connection=conn)
    new, _ = start_job(conn, queue, expired=False)
    old, member = legacy_start_job(conn, queue)
    run_id = str(conn.info('server')['run_id'])
    assert read_status(conn, ['both']).queues['both']['live_leases'] == 2
    (metrics,) = read_snapshot(conn, queues=['both']).queues
    assert metrics.leases['live'] == 2
    lease = job_history(conn, old.id, run_id=run_id, default_max_stalled=3)['lease']
    assert lease is not None and lease['member'] == member
    lease = job_history(conn, new.id, run_id=run_id, default_max_stalled=3)['lease']
    assert lease is not None and lease['member'] == new.id
    assert execution_of(new) == f'{new.id}:{new.lease_execution}'
