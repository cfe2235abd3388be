"""The take: a job is never off every list without a lease, on one queue or many.

A worker on several queues takes a job into that queue's intermediate list in one atomic
step (the ``take`` script); the grant removes the entry once the lease exists; the sweep
recovers a job stranded there, uncounted. An idle worker waits for the next job with the
server's client tracking, not by polling. (Real workers killed, or cut off, right after
the take: ``test_take_kill.py`` and ``test_take_cut.py``.)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from rq.exceptions import DequeueTimeout
from rq.job import JobStatus
from rq.queue import Queue as StockQueue

from rq_epoch import Job, Queue, Sweeper, Worker
from rq_epoch.protocol import keys, scripts
from rq_epoch.worker import take as take_module
from rq_epoch.worker.take import Taker
from tests.takes import names


class OwnFetch(Job):
    """A job class that reads its jobs its own way."""

    @classmethod
    def fetch(cls, id, connection=None, serializer=None):  # type: ignore[no-untyped-def]
        job = super().fetch(id, connection=connection, serializer=serializer)
        job.meta['fetched_by'] = 'OwnFetch'
        return job


# -- the scripts ----------------------------------------------------------------------------


def test_take_moves_the_first_job_in_the_given_order_into_its_intermediate_list(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(3)]
    taker = Taker(conn)
    assert taker.take(queues) is None
    third = queues[2].enqueue('tests.jobs.add', 1, 2)
    second = queues[1].enqueue('tests.jobs.add', 1, 2)
    assert taker.take(queues) == (queues[1], second.id, None)
    assert conn.lrange(queues[1].intermediate_queue_key, 0, -1) == [second.id.encode()]
    assert taker.take(list(reversed(queues))) == (queues[2], third.id, None)
    assert conn.lrange(queues[2].intermediate_queue_key, 0, -1) == [third.id.encode()]
    assert [q.count for q in queues] == [0, 0, 0]


def test_take_reads_the_moved_jobs_hash_in_the_same_step(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(2)]
    job = queues[1].enqueue('tests.jobs.add', 1, 2)
    taken = Taker(conn).take(queues, job_key_prefix=Job.redis_job_namespace_prefix)
    assert taken is not None
    assert taken.job_hash == conn.hgetall(job.key)
    gone = queues[0].enqueue('tests.jobs.add', 1, 2)
    conn.delete(gone.key)
    taken = Taker(conn).take(queues, job_key_prefix=Job.redis_job_namespace_prefix)
    assert taken is not None and taken.job_id == gone.id
    assert taken.job_hash == {}


def test_a_job_class_that_fetches_its_own_way_is_fetched_so(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(2)]
    assert take_module._job_key_prefix(None, queues) == Job.redis_job_namespace_prefix
    assert take_module._job_key_prefix(OwnFetch, queues) == ''
    job = queues[1].enqueue('tests.jobs.add', 1, 2)
    fetched = Taker(conn).dequeue_any(queues, None, job_class=OwnFetch)
    assert fetched is not None
    assert fetched[0].id == job.id and fetched[0].meta.get('fetched_by') == 'OwnFetch'


def test_the_grant_removes_the_intermediate_entry_and_its_first_sighting(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(2)]
    job = queues[1].enqueue('tests.jobs.add', 1, 2)
    Taker(conn).take(queues)
    Sweeper(conn, restart_grace=0).sweep([q.name for q in queues])  # sees it there: first sighting
    assert conn.hexists(keys.limbo_key(queues[1].name), job.id)
    registry = job.started_job_registry
    scripts.grant()(conn, registry.grant_keys(job.id), [job.id, 30, 'e1'])
    assert conn.llen(queues[1].intermediate_queue_key) == 0
    assert not conn.hexists(keys.limbo_key(queues[1].name), job.id)
    assert conn.zscore(registry.leases_key, job.id) is not None


def test_a_stranded_take_is_rescued_uncounted_after_one_lease(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(2)]
    job = queues[1].enqueue('tests.jobs.add', 1, 2)
    Taker(conn).take(queues)  # the taker dies here
    sweeper = Sweeper(conn, restart_grace=0, rescue_intermediate=True)
    assert sweeper.sweep([q.name for q in queues]).total == 0  # first sighting
    conn.hset(keys.limbo_key(queues[1].name), job.id, 0)  # seen long ago
    report = sweeper.sweep([q.name for q in queues])
    assert [(v.job_id, v.verdict) for v in report.verdicts] == [(job.id, 'exempt')]
    assert queues[1].get_job_ids() == [job.id]
    assert conn.llen(queues[1].intermediate_queue_key) == 0


def test_a_deleted_job_is_skipped_and_leaves_nothing_behind(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(2)]
    gone = queues[0].enqueue('tests.jobs.add', 1, 2)
    kept = queues[1].enqueue('tests.jobs.add', 3, 4)
    conn.delete(gone.key)
    job, queue = Taker(conn).dequeue_any(queues, None, job_class=Job)
    assert (job.id, queue.name) == (kept.id, queues[1].name)
    assert conn.llen(queues[0].intermediate_queue_key) == 0


# -- waiting --------------------------------------------------------------------------------


def _push_later(queue: StockQueue, delay: float) -> threading.Thread:
    def push() -> None:
        time.sleep(delay)
        queue.enqueue('tests.jobs.add', 1, 2)

    thread = threading.Thread(target=push, daemon=True)
    thread.start()
    return thread


def test_an_idle_taker_wakes_at_a_stock_enqueue_without_polling(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(3)]
    taker = Taker(conn, watch_ttl=10)  # no refresh of the watch within these 1 s waits
    scripts.load_all(conn)
    before = conn.info('commandstats')
    with pytest.raises(DequeueTimeout):
        taker.dequeue_any(queues, 1, job_class=Job)
    after = conn.info('commandstats')

    def calls(name: str) -> int:
        return int(after[f'cmdstat_{name}']['calls']) - int(before.get(f'cmdstat_{name}', {}).get('calls', 0))

    # One take (which claims the watch), one read of the queues (the wake-up), then nothing
    # until the timeout.
    assert (calls('evalsha'), calls('exists')) == (1, 1)

    # A write that leaves no job wakes it: it takes, finds nothing, and reads the queues again.
    def push_and_pop() -> None:
        time.sleep(0.3)
        with conn.pipeline() as pipe:  # one transaction: the list is empty again at once
            pipe.rpush(queues[1].key, 'x').lpop(queues[1].key).execute()

    thread = threading.Thread(target=push_and_pop, daemon=True)
    thread.start()
    before = conn.info('commandstats')
    with pytest.raises(DequeueTimeout):
        taker.dequeue_any(queues, 1, job_class=Job)
    thread.join(5)
    after = conn.info('commandstats')
    # The wake-up: a take (it finds nothing, and refreshes the watch), then a read of the
    # queues that arms tracking again.
    assert (calls('evalsha'), calls('exists')) == (2, 2)

    thread = _push_later(StockQueue(queues[2].name, connection=conn), 0.3)
    job, queue = taker.dequeue_any(queues, 10, job_class=Job)
    thread.join(5)
    assert queue.name == queues[2].name
    assert conn.llen(queues[2].intermediate_queue_key) == 1
    taker.close()


def test_without_client_tracking_the_taker_polls(conn, server, caplog) -> None:
    # '-client' and not '-client|tracking': a rule that denies one subcommand is Redis 7's, and
    # Redis 6.2 refuses it. The taker sends no other CLIENT command (redis-py's CLIENT SETINFO
    # at connect may be refused).
    conn.acl_setuser(
        'notrack', enabled=True, passwords=['+pw'], keys=['*'], channels=['*'], commands=['+@all', '-client']
    )
    try:
        limited = redis.Redis(host='127.0.0.1', port=server.port, username='notrack', password='pw')
        queues = [Queue(name, connection=limited) for name in names(2)]
        taker = Taker(limited)
        thread = _push_later(StockQueue(queues[1].name, connection=conn), 0.3)
        job, queue = taker.dequeue_any(queues, 10, job_class=Job)
        thread.join(5)
        assert queue.name == queues[1].name
        assert 'refused client tracking' in caplog.text
    finally:
        conn.acl_deluser('notrack')


# -- real workers -------------------------------------------------------------------------------


def test_the_take_follows_rqs_dequeue_order(conn, start_worker, tmp_path: Path) -> None:
    """Burst workers of both kinds run the same jobs in the same order, for each strategy."""
    queue_names = names(3)
    orders: dict[tuple[str, str], list[str]] = {}
    for strategy in ('default', 'round_robin'):
        for side, worker_class in (('stock', None), ('rq-epoch', 'rq_epoch.Worker')):
            conn.flushall()
            log = tmp_path / f'{strategy}-{side}'
            for i in range(2):
                for name in queue_names:
                    Queue(name, connection=conn).enqueue('tests.jobs.record', str(log), f'{name}-{i}')
            worker = start_worker(
                *queue_names, worker_class=worker_class, burst=True, args=['--dequeue-strategy', strategy]
            )
            if worker_class is None:
                worker.stock_burst_done()
            else:
                worker.proc.wait(60)
            orders[strategy, side] = [line.split()[0] for line in log.read_text().splitlines()]
    for strategy in ('default', 'round_robin'):
        assert orders[strategy, 'rq-epoch'] == orders[strategy, 'stock']
        assert len(orders[strategy, 'stock']) == 6
    assert orders['default', 'stock'] != orders['round_robin', 'stock']


def test_an_in_process_worker_on_several_queues_takes_through_the_take(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(2)]
    job = queues[1].enqueue('tests.jobs.add', 2, 3)
    worker = Worker(queues, connection=conn)
    original = worker.queue_class
    taken: list[str] = []

    class Recording(Taker):
        def taken(self, queue, job_id: str) -> None:
            taken.append(job_id)

    worker.taker_class = Recording
    assert worker.work(burst=True)
    assert taken == [job.id]
    assert job.get_status(refresh=True) == JobStatus.FINISHED
    assert worker.queue_class is original  # the stand-in only serves the dequeue


def test_a_server_that_takes_no_writes_is_an_outage_to_ride_out(conn) -> None:
    queues = [Queue(name, connection=conn) for name in names(2)]
    job = queues[1].enqueue('tests.jobs.add', 1, 2)
    conn.config_set('min-replicas-to-write', 1)
    try:
        with pytest.raises(redis.exceptions.ConnectionError, match='NOREPLICAS'):
            Taker(conn).take(queues)
        assert queues[1].get_job_ids() == [job.id]
    finally:
        conn.config_set('min-replicas-to-write', 0)
    assert Taker(conn).take(queues) == (queues[1], job.id, None)
