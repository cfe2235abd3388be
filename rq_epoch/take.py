"""The take: a job leaves its queue only into a list that the sweep recovers from.

RQ's worker takes a job from several queues with ``BLPOP``. From that moment until the
grant of its lease, the job is in no list at all: a worker killed in between, or a
connection that drops after the server sent the popped id, loses it for good. (On a
single queue RQ uses ``BLMOVE`` into the queue's intermediate list, which is safe.)

rq-epoch's worker takes with the ``take`` script instead: in one atomic step it pops the
first job of its queues, in the worker's dequeue order (``default``, ``round_robin``,
``random``: RQ orders the queues, the script follows that order), and pushes it onto that
queue's intermediate list. The sweep already rescues a job that sits there, still
"queued" and without a live lease, for one lease length: it is requeued at the front,
uncounted (verdict exempt). The grant script removes the entry once the lease exists, so
the job is always either in a queue, in an intermediate list, or under a lease.

A script cannot block, so the worker waits for a job without popping it: with the
server's client tracking (Redis 6+, Valkey), a dedicated connection reads the queues
(``EXISTS``), and the next write to any of them, by any client (stock RQ enqueuers
included), makes the server push one invalidation message to a second connection
subscribed to ``__redis__:invalidate``. The worker blocks reading that connection; on the
message it reads the queues again (which re-arms the wake-up) and runs the take only if
one of them has a job. Every idle worker on a queue wakes at an enqueue, but only those
that see the job run the take. An idle wait sends nothing until the dequeue timeout; no
server configuration is needed. A server or proxy that refuses ``CLIENT TRACKING`` gets a
short poll instead (one take every :attr:`Taker.poll_interval` seconds), announced by one
warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.exceptions
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.utils import get_version

from . import scripts
from .compat import text

if TYPE_CHECKING:
    from redis import Redis
    from redis.connection import AbstractConnection, ConnectionPool
    from rq.job import Job as RQJob
    from rq.queue import Queue

__all__ = ['INVALIDATE_CHANNEL', 'Taker', 'TrackingRefused', 'Waker']

logger = logging.getLogger('rq_epoch')

#: The channel on which the server sends client-tracking invalidations (RESP2).
INVALIDATE_CHANNEL = '__redis__:invalidate'

#: Error replies that mean "no writes here for now" (a demoted primary, too few replicas,
#: a primary lost by its replica, a dataset loading): the take becomes a connection error,
#: which RQ's dequeue loop rides out with backoff, instead of an error that ends the worker.
_OUTAGE_REPLIES = frozenset({'READONLY', 'NOREPLICAS', 'MASTERDOWN', 'LOADING'})


def _dedicated_connection(pool: ConnectionPool) -> AbstractConnection:
    """A connection outside the pool, made as the pool makes its own, speaking RESP2.

    RESP2 keeps the invalidations on a subscribed connection of their own, whatever the
    protocol of the pool (redis-py 8 speaks RESP3 by default). For a Sentinel pool the
    connection asks the sentinels for the primary, as the pool's do.
    """
    kwargs = dict(pool.connection_kwargs)
    kwargs['protocol'] = 2
    kwargs['health_check_interval'] = 0  # a PING on a subscribed RESP2 connection is answered differently
    if 'maint_notifications_config' in kwargs:  # redis-py 8: a RESP3-only feature
        kwargs['maint_notifications_config'] = None
    connection: AbstractConnection = pool.connection_class(**kwargs)
    return connection


class TrackingRefused(Exception):
    """The server (or a proxy in front of it) refused client tracking: an ACL, an old server."""


class Waker:
    """Waits, without polling and without popping, until one of some queues may have a job.

    :meth:`arm` reads the queues on a connection with client tracking on (its
    invalidations redirected to a second, subscribed connection); the server then sends
    one message at the next write to any of those lists, by any client. :meth:`wait`
    blocks on the subscribed connection until that message or the timeout. Arming again
    after a wake-up re-arms it, and says whether the write left a job.
    """

    def __init__(self, connection: Redis) -> None:
        self._pool = connection.connection_pool
        self._reader: AbstractConnection | None = None
        self._listener: AbstractConnection | None = None

    def _connect(self) -> tuple[AbstractConnection, AbstractConnection]:
        listener = _dedicated_connection(self._pool)
        reader = _dedicated_connection(self._pool)
        try:
            listener.connect()
            reader.connect()
            try:
                listener.send_command('CLIENT', 'ID')
                client_id = listener.read_response()
                listener.send_command('SUBSCRIBE', INVALIDATE_CHANNEL)
                listener.read_response()
                reader.send_command('CLIENT', 'TRACKING', 'ON', 'REDIRECT', client_id)
                reader.read_response()
            except redis.exceptions.ResponseError as exc:
                raise TrackingRefused(str(exc)) from exc
        except BaseException:
            listener.disconnect()
            reader.disconnect()
            raise
        self._listener, self._reader = listener, reader
        return listener, reader

    def arm(self, queue_keys: Sequence[str]) -> bool:
        """Ask to be woken at the next write to any of ``queue_keys``; say whether one has jobs.

        Wake-ups received so far are dropped first: any write after this read sends a new
        one, so none that matters is lost. Then one ``EXISTS`` of every queue (a list
        exists while it has a job) is both the answer and the arming read. Returns True
        when a queue has jobs (there is no reason to wait).

        Raises:
            TrackingRefused: the server refused client tracking (both connections are closed).
            redis.exceptions.ConnectionError: a connection failed (both are closed).
        """
        try:
            if self._reader is None or self._listener is None:
                listener, reader = self._connect()
            else:
                listener, reader = self._listener, self._reader
                self._drain(listener)
            reader.send_command('EXISTS', *queue_keys)
            existing = reader.read_response()
        except BaseException:
            self.close()
            raise
        return int(existing) > 0

    def wait(self, seconds: float) -> bool:
        """Block up to ``seconds`` for a wake-up; True when one came."""
        listener = self._listener
        if listener is None:
            return False
        try:
            return bool(listener.can_read(timeout=seconds))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _drain(listener: AbstractConnection) -> None:
        for _ in range(10_000):
            if not listener.can_read(timeout=0):
                return
            listener.read_response()

    def close(self) -> None:
        """Close both connections (the next :meth:`arm` opens new ones)."""
        for connection in (self._listener, self._reader):
            if connection is not None:
                try:
                    connection.disconnect()
                except Exception:  # noqa: S110 - closing a broken socket
                    pass
        self._listener = self._reader = None


class Taker:
    """Takes jobs for one worker: the atomic take, and the wait for the next job.

    :meth:`stand_in` gives the worker a queue class whose ``dequeue_any`` is
    :meth:`dequeue_any` (RQ's dequeue loop calls it), so RQ's loop keeps doing everything
    else: heartbeats, maintenance, the idle timeout, retries on connection errors, and
    the reordering of the queues after each job.
    """

    #: Seconds between two takes while waiting, when the server refuses client tracking.
    poll_interval: float = 0.2
    #: Wait with client tracking (False: poll every :attr:`poll_interval` seconds).
    tracking: bool = True

    def __init__(self, connection: Redis, log: logging.Logger | None = None) -> None:
        self.connection = connection
        self.log = log or logger
        self._waker: Waker | None = None
        self._polling = not self.tracking
        self._reconnect = False
        self._stand_ins: dict[type, type] = {}

    # -- the take ------------------------------------------------------------------------

    def take(self, queues: Sequence[Queue]) -> tuple[Queue, str] | None:
        """Move the first job of ``queues`` (in this order) into its intermediate list.

        One script call, one round trip. Returns the queue and the job id, or None when
        every queue is empty.

        Raises:
            redis.exceptions.ConnectionError: also when the server answers that it takes no
                writes for now (READONLY, NOREPLICAS, MASTERDOWN, LOADING): an outage.
        """
        script_keys = [queue.key for queue in queues] + [queue.intermediate_queue_key for queue in queues]
        try:
            reply = scripts.take()(self.connection, script_keys, [])
        except redis.exceptions.ResponseError as exc:
            if str(exc).split(' ', 1)[0] in _OUTAGE_REPLIES:
                raise redis.exceptions.ConnectionError(f'the server cannot give out jobs now: {exc}') from exc
            raise
        index = int(reply[0])
        if index == 0:
            return None
        queue, job_id = queues[index - 1], text(reply[1])
        self.taken(queue, job_id)
        return queue, job_id

    def taken(self, queue: Queue, job_id: str) -> None:
        """Called right after the take script moved ``job_id``, before anything else.

        Nothing by default; the tests kill a worker here.
        """

    # -- RQ's dequeue ----------------------------------------------------------------------

    def stand_in(self, queue_class: type[Queue]) -> type[Queue]:
        """``queue_class`` with :meth:`dequeue_any` in place of RQ's (made once per class)."""
        stand_in = self._stand_ins.get(queue_class)
        if stand_in is None:
            taker = self

            def dequeue_any(cls: type[Queue], *args: Any, **kwargs: Any) -> tuple[RQJob, Queue] | None:
                # A plain function: classmethod() of a bound method binds differently by
                # Python version (3.10 passes no class to it).
                return taker._dequeue_any_of(cls, *args, **kwargs)

            stand_in = type(
                queue_class.__name__,
                (queue_class,),
                {
                    '__module__': queue_class.__module__,
                    '__doc__': queue_class.__doc__,
                    'dequeue_any': classmethod(dequeue_any),
                },
            )
            self._stand_ins[queue_class] = stand_in
        return stand_in

    def _dequeue_any_of(
        self,
        queue_class: type[Queue],
        queues: Sequence[Queue],
        timeout: int | None,
        connection: Redis | None = None,
        job_class: type[RQJob] | None = None,
        serializer: Any = None,
        death_penalty_class: Any = None,
    ) -> tuple[RQJob, Queue] | None:
        queues = list(queues)
        if len(queues) == 1 and get_version(self.connection) >= (6, 2, 0):
            # RQ moves the job into the intermediate list itself (BLMOVE), and blocks.
            base: Any = queue_class.__mro__[1]
            return base.dequeue_any(
                queues,
                timeout,
                connection=connection or self.connection,
                job_class=job_class,
                serializer=serializer,
                death_penalty_class=death_penalty_class,
            )
        return self.dequeue_any(queues, timeout, job_class=job_class, serializer=serializer)

    def dequeue_any(
        self,
        queues: Sequence[Queue],
        timeout: int | None,
        *,
        job_class: type[RQJob] | None = None,
        serializer: Any = None,
    ) -> tuple[RQJob, Queue] | None:
        """RQ's ``Queue.dequeue_any``, with the take: the next job of ``queues``, in order.

        ``timeout`` None takes once and returns None when the queues are empty; otherwise
        it waits up to ``timeout`` seconds for a job, then raises RQ's DequeueTimeout.
        """
        queues = list(queues)
        queue_keys = [queue.key for queue in queues]
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(1_000_000):  # each turn takes a job, or waits, or ends
            found = self.take(queues)
            if found is not None:
                queue, job_id = found
                job = self._fetch(queue, job_id, job_class, serializer)
                if job is None:
                    continue
                return job, queue
            if deadline is None:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.wait(queue_keys, remaining):
                break  # no take at the deadline: RQ's loop heartbeats, then dequeues again
        raise DequeueTimeout(timeout, queue_keys)

    def _fetch(self, queue: Queue, job_id: str, job_class: type[RQJob] | None, serializer: Any) -> RQJob | None:
        cls: Any = job_class or queue.job_class
        try:
            return cls.fetch(job_id, connection=self.connection, serializer=serializer)  # type: ignore[no-any-return]
        except NoSuchJobError:
            # Deleted while queued: RQ skips such ids; leave nothing behind for the sweep.
            self.connection.lrem(queue.intermediate_queue_key, 1, job_id)
            return None
        except Exception as exc:
            exc.job_id = job_id  # type: ignore[attr-defined]  # as RQ reports it
            exc.queue = queue  # type: ignore[attr-defined]
            raise

    # -- waiting ---------------------------------------------------------------------------

    def wait(self, queue_keys: Sequence[str], seconds: float) -> bool:
        """Until one of ``queue_keys`` has a job (True), or ``seconds`` have passed (False).

        A wake-up whose write left no job (another worker took it, or it was a write
        that adds none) goes back to waiting after one ``EXISTS``, without a take: so
        every idle worker wakes at an enqueue, but only those that see the job run the
        take. While polling, it returns True after :attr:`poll_interval` seconds.
        """
        deadline = time.monotonic() + seconds
        if self._reconnect and self._waker is not None:
            self._waker.close()
            self._waker = None
        self._reconnect = False
        if not self._polling:
            try:
                if self._waker is None:
                    self._waker = Waker(self.connection)
                for _ in range(1_000_000):
                    if self._waker.arm(queue_keys):
                        return True
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._waker.wait(remaining):
                        return False
                return False
            except redis.exceptions.RedisError:
                self._waker = None  # closed: the next wait connects again
                raise
            except TrackingRefused as exc:
                self._waker = None
                self._polling = True
                self.log.warning(
                    'rq-epoch: the server refused client tracking (%s); waiting for jobs by taking every %ss instead',
                    exc,
                    self.poll_interval,
                )
        time.sleep(max(0.0, min(self.poll_interval, deadline - time.monotonic())))
        return True

    def reconnect(self) -> None:
        """Open new wake-up connections at the next wait (the primary moved: see
        :class:`~rq_epoch.failover.PrimaryWatch`). Safe from any thread: it only sets a flag."""
        self._reconnect = True

    def close(self) -> None:
        """Close the wake-up connections, if any."""
        if self._waker is not None:
            self._waker.close()
            self._waker = None
