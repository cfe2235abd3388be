"""A dependent enqueued while the connection drops is pushed once, however its dependency ends meanwhile.

RQ registers a job that waits for an unfinished dependency in a transaction under ``WATCH``,
and sends it again on a ``WatchError``. redis-py raises that error too when the connection
drops while keys are watched, as in a server restart. If the registration had landed and the
dependency finished before the second attempt, the dependency pushed the job, and RQ's second
attempt found the dependency finished and pushed it again: the job ran twice (seen in a chaos
run: a dependent enqueued at the moment of a ``SHUTDOWN``).

A loopback proxy forwards the registration and closes the connection when its reply comes;
it holds the reconnection until the test has finished the dependency (status finished, its
dependents enqueued, as a worker's success does).
"""

from __future__ import annotations

import threading

import redis
from rq.job import JobStatus
from rq.queue import Queue as StockQueue

import rq_epoch
from tests.proxy import HoldingProxy

#: The registration sets the dependent's status to "deferred".
DEFERRED = b'$8\r\ndeferred\r\n'


def _checkout(pool: redis.ConnectionPool) -> redis.connection.Connection:
    """A connection of the pool (redis-py before 5.3 asks for the command it is for)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection('PING')


def _enqueue_across_a_dropped_reply(conn: redis.Redis, proxy: HoldingProxy, queue_class: type) -> list[bytes]:
    """Enqueue a dependent through the proxy while its dependency finishes; the queue's ids after."""
    queue = queue_class('dependent-once', connection=conn)
    parent = queue.enqueue('tests.jobs.add', 1, 2)
    producer = redis.Redis(port=proxy.port)
    pool = producer.connection_pool
    opened = [_checkout(pool) for _ in range(3)]  # open before anything is armed:
    for connection in opened:  # the only connection made later is the one after the cut
        connection.send_command('PING')
        connection.read_response()
    for connection in opened:
        pool.release(connection)
    proxy.cut(DEFERRED)
    proxy.hold(b'SETINFO')
    finished: list[str] = []

    def finish_parent() -> None:
        try:
            if not proxy.held.wait(30):
                return
            conn.lrem(queue.key, 0, parent.id)
            parent.set_status(JobStatus.FINISHED)
            queue.enqueue_dependents(parent)
            finished.append(parent.id)
        finally:
            proxy.release()

    thread = threading.Thread(target=finish_parent)
    thread.start()
    try:
        child = queue_class('dependent-once', connection=producer).enqueue('tests.jobs.add', 3, 4, depends_on=parent.id)
    finally:
        thread.join(40)
        producer.close()
    assert proxy.cut_done.is_set() and finished, 'the registration was not cut, or the dependency not finished'
    ids = conn.lrange(queue.key, 0, -1)
    assert child.id.encode() in ids
    return [i for i in ids if i == child.id.encode()]


def test_a_dependent_whose_registration_reply_was_lost_is_pushed_once(conn, proxy) -> None:
    assert len(_enqueue_across_a_dropped_reply(conn, proxy, rq_epoch.Queue)) == 1


def test_stock_rq_pushes_the_same_dependent_twice(conn, proxy) -> None:
    assert len(_enqueue_across_a_dropped_reply(conn, proxy, StockQueue)) == 2
