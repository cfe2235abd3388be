"""Build leases in the state a worker leaves them, without running a worker."""

from __future__ import annotations

import uuid

import redis

from rq_epoch import Job, Queue, keys, scripts
from rq_epoch.registry import StartedJobRegistry

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
    into the past (server time). Returns the job and its lease member.
    """
    job = queue.enqueue(func, *args, **enqueue_kwargs)
    conn.lrem(queue.key, 0, job.id)
    execution_id = uuid.uuid4().hex
    member = f'{job.id}:{execution_id}'
    registry = StartedJobRegistry(queue.name, connection=conn)
    conn.zadd(registry.key, {member: '+inf'})
    conn.hset(job.key, mapping={'status': 'started', 'worker_name': 'test-worker'})
    scripts.grant()(conn, [registry.leases_key, job.key], [member, 60, execution_id])
    if epoch is None:
        conn.hdel(job.key, 'lease_epoch')
    elif epoch is not CURRENT:
        conn.hset(job.key, 'lease_epoch', str(epoch))
    if expired:
        expire(conn, queue.name, member)
    return Job.fetch(job.id, connection=conn), member


def expire(conn: redis.Redis, queue_name: str, member: str) -> None:
    """Move a lease's deadline one second into the past (server clock)."""
    seconds, micros = conn.time()
    conn.zadd(keys.leases_key(queue_name), {member: seconds + micros / 1e6 - 1}, xx=True)
