"""What the take tests share: queue names, and where a job can be."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from rq.job import JobStatus

from rq_epoch import Job, Sweeper
from rq_epoch.protocol import keys
from tests.conftest import wait_for

STRATEGIES = ['default', 'round_robin', 'random']
#: The take tests' lease: heartbeat 1 s + margin 1 s, so a stranded job is rescued after 2 s.
FAST = {'RQ_EPOCH_LEASE_MARGIN': '1'}


def names(n: int, suffix: str = '') -> list[str]:
    return [f'take{i}{suffix}' for i in range(1, n + 1)]


def nowhere(conn: redis.Redis, queue_names: list[str], job_id: str) -> bool:
    """The job is in no queue, no intermediate list, no lease and no started registry."""
    for name in queue_names:
        if job_id.encode() in conn.lrange(keys.queue_key(name), 0, -1):
            return False
        if job_id.encode() in conn.lrange(keys.intermediate_key(name), 0, -1):
            return False
        if any(m.decode().startswith(job_id) for m in conn.zrange(keys.leases_key(name), 0, -1)):
            return False
        if any(m.decode().startswith(job_id) for m in conn.zrange(keys.wip_key(name), 0, -1)):
            return False
    return True


def ran_once_uncounted(conn: redis.Redis, queue_names: list[str], job: Job, log: Path) -> None:
    """The job finished after one uncounted recovery, ran once, and nothing can run it again."""
    wait_for(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 40, what='the job finished')
    job = Job.fetch(job.id, connection=conn)
    assert (job.stalled, job.exempt_recoveries) == (0, 1)
    assert log.read_text().count('start') == 1
    assert nowhere(conn, queue_names, job.id)
    assert all(conn.llen(keys.intermediate_key(name)) == 0 for name in queue_names)


def stock_lost(conn: redis.Redis, queue_names: list[str], job_id: str, log: Path, start_worker: Callable) -> None:
    """The job is queued, in no list anything runs from; a stock worker's maintenance and
    an rq-epoch sweep find nothing to recover."""
    assert conn.hget(keys.job_key(job_id), 'status') == b'queued'
    assert nowhere(conn, queue_names, job_id)
    stock = start_worker(*queue_names, worker_class=None, burst=True)  # runs its maintenance first
    stock.stock_burst_done()
    assert Sweeper(conn, restart_grace=0).sweep(queue_names).total == 0
    assert conn.hget(keys.job_key(job_id), 'status') == b'queued'
    assert nowhere(conn, queue_names, job_id)
    assert not log.exists()
