"""Build leases in the state a worker leaves them, without running a worker."""

from __future__ import annotations

import uuid
from pathlib import Path

import redis

from rq_epoch import Job, Queue
from rq_epoch.jobs.job import StartedJobRegistry
from rq_epoch.protocol import keys, scripts
from rq_epoch.protocol.keys import KeyFamily

CURRENT = object()
OTHER_EPOCH = '0000000000000000000000000000000000000000'


def current_run_id(conn: redis.Redis) -> str:
    return str(conn.info('server')['run_id'])


def start_job(
    conn: redis.Redis,
    queue: Queue,
    *,
    epoch: object = CURRENT,
    expired: bool = True,
    func: str = 'tests.jobs.add',
    args: tuple = (1, 2),
    **enqueue_kwargs: object,
) -> tuple[Job, str]:
    """Enqueue a job, take it off the queue and give it a lease as a worker would.

    ``epoch``: CURRENT stamps the server's run_id (through the real grant script); None
    leaves no stamp; any string is written as the stamp. ``expired`` moves the deadline
    into the past (server time). Returns the job and its lease member (the job id); the
    execution that holds the lease is the job's ``lease_execution``.
    """
    job = queue.enqueue(func, *args, **enqueue_kwargs)
    conn.lrem(queue.key, 0, job.id)
    execution_id = uuid.uuid4().hex
    registry = StartedJobRegistry(queue.name, connection=conn)
    _record_execution(conn, queue.name, job.id, execution_id, 'test-worker')
    scripts.grant()(conn, [registry.leases_key, job.key], [job.id, 60, execution_id])
    if epoch is None:
        conn.hdel(job.key, 'lease_epoch')
    elif epoch is not CURRENT:
        conn.hset(job.key, 'lease_epoch', str(epoch))
    if expired:
        expire(conn, queue.name, job.id)
    return Job.fetch(job.id, connection=conn), job.id


def _record_execution(conn: redis.Redis, queue_name: str, job_id: str, execution_id: str, worker_name: str) -> None:
    """RQ's records of a started execution: its registry entry (no expiry, as rq-epoch's
    registry writes it), its hash, the job's and the worker's executions; the job started."""
    member = f'{job_id}:{execution_id}'
    conn.zadd(keys.wip_key(queue_name), {member: '+inf'})
    conn.hset(keys.execution_key(member), mapping={'id': execution_id, 'job_id': job_id, 'worker_name': worker_name})
    conn.zadd(keys.job_executions_key(job_id), {execution_id: '+inf'})
    conn.sadd(keys.worker_executions_key(worker_name), member)
    conn.hset(keys.job_key(job_id), mapping={'status': 'started', 'worker_name': worker_name})


def execution_of(job: Job) -> str:
    """RQ's name of the execution that holds a job's lease, ``<job_id>:<execution_id>``."""
    return f'{job.id}:{job.lease_execution}'


def expire(conn: redis.Redis, queue_name: str, member: str, key: KeyFamily = keys.leases_key) -> None:
    """Move a lease's deadline one second into the past (server clock)."""
    seconds, micros = conn.time()
    conn.zadd(key(queue_name), {member: seconds + micros / 1e6 - 1}, xx=True)


# -- rq-epoch 0.2.0, as its workers and cron sweepers still run during an upgrade ----------------

LEGACY_SCRIPTS = Path(__file__).parent / 'rq_epoch_0_2_0'


def legacy_script(name: str) -> str:
    """The source of a script of the released 0.2.0, its includes pasted as its loader did."""
    lines = []
    for line in (LEGACY_SCRIPTS / f'{name}.lua').read_text().splitlines():
        if line.strip().startswith('-- @include '):
            lines.append(legacy_script(line.strip()[len('-- @include ') :].removesuffix('.lua')))
        else:
            lines.append(line)
    return '\n'.join(lines)


def legacy_start_job(
    conn: redis.Redis, queue: Queue, *, worker_name: str = 'old-worker', **enqueue_kwargs: object
) -> tuple[Job, str]:
    """A job started by a 0.2.0 worker: RQ's records of its execution, and the lease its grant
    script wrote (member ``<job_id>:<execution_id>`` in ``<prefix>:epoch:leases:<queue>``).

    Returns the job and the lease member (which is also RQ's name of the execution).
    """
    job = queue.enqueue('tests.jobs.add', 1, 2, **enqueue_kwargs)
    conn.lrem(queue.key, 0, job.id)
    execution_id = uuid.uuid4().hex
    member = f'{job.id}:{execution_id}'
    _record_execution(conn, queue.name, job.id, execution_id, worker_name)
    legacy_grant(conn, queue.name, job.id, execution_id)
    return Job.fetch(job.id, connection=conn), member


def legacy_grant(conn: redis.Redis, queue_name: str, job_id: str, execution_id: str, ttl: int = 60) -> list:
    """0.2.0's grant script, as a 0.2.0 worker runs it."""
    return conn.eval(
        legacy_script('grant'),
        2,
        keys.legacy_leases_key(queue_name),
        keys.job_key(job_id),
        f'{job_id}:{execution_id}',
        ttl,
        execution_id,
    )


def legacy_sweep(conn: redis.Redis, queue_name: str, *, max_stalled: int = 3) -> list[tuple[str, str]]:
    """One call of 0.2.0's sweep script on a queue, as a 0.2.0 cron sweeper runs it (no restart
    grace); returns its verdicts as (member, verdict)."""
    reply = conn.eval(
        legacy_script('sweep'),
        5,
        keys.legacy_leases_key(queue_name),
        keys.wip_key(queue_name),
        keys.finishing_key(),
        keys.stats_key(queue_name),
        keys.limbo_key(queue_name),
        keys.PREFIX,
        queue_name,
        100,
        max_stalled,
        0,
        86400,
        '0',
        0,
        0,
    )
    records = reply[5 : 5 + 7 * int(reply[4])]
    return [(records[i].decode(), records[i + 2].decode()) for i in range(0, len(records), 7)]
