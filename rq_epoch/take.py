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

A script cannot block, so the worker waits for a job without popping it, with the
server's client tracking (Redis 6+, Valkey): a connection of its own (RESP3) reads the
queues (``EXISTS``), and the next write to any of them, by any client (stock RQ enqueuers
included), makes the server push one invalidation message on that connection.

Idle workers on the same queues do not all wait that way: one of them is the *watcher*
of that set of queues (it holds ``<prefix>:epoch:watch:<set>``, with a TTL it refreshes
while it waits), and only the watcher keeps tracking armed. The others block in
``BLPOP <prefix>:epoch:baton:<set>`` on their main connection. An enqueue wakes the
watcher alone; it takes the job, then hands the watch on (``watch.lua``: its key
deleted, one token pushed on the baton list), and the one waiter that pops the token
claims the watch and arms tracking. A waiter whose ``BLPOP`` times out tries to claim the
watch, so a watcher that died is replaced within its TTL plus one wait; and every idle
worker still takes once per dequeue timeout (at most one sweep interval), so a job
waits no longer than that even then. An enqueue thus wakes at most two workers (the
watcher, and the waiter it hands on to), however many wait.

No server configuration is needed. A server or proxy that refuses ``CLIENT TRACKING``
gets a short poll instead (one take every :attr:`Taker.poll_interval` seconds), announced
by one warning.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.exceptions
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.utils import get_version

from . import keys, scripts
from .compat import text
from .errors import RqEpochError
from .failover import is_outage

if TYPE_CHECKING:
    from redis import Redis
    from redis.connection import AbstractConnection, ConnectionPool
    from rq.job import Job as RQJob
    from rq.queue import Queue

__all__ = ['Taker', 'TakerCounters', 'TrackingRefused', 'Waker']

logger = logging.getLogger('rq_epoch')


def _dedicated_connection(pool: ConnectionPool) -> AbstractConnection:
    """A connection outside the pool, made as the pool makes its own, speaking RESP3.

    RESP3 lets the server push the invalidations on the connection that reads the queues
    (RESP2 would need a second, subscribed connection). For a Sentinel pool the connection
    asks the sentinels for the primary, as the pool's do.
    """
    kwargs = dict(pool.connection_kwargs)
    kwargs['protocol'] = 3
    kwargs['health_check_interval'] = 0  # a PING would be read among the pushes
    if 'maint_notifications_config' in kwargs:  # redis-py 8: nothing but the invalidations here
        kwargs['maint_notifications_config'] = None
    connection: AbstractConnection = pool.connection_class(**kwargs)
    return connection


def _outage_as_connection_error(exc: redis.exceptions.ResponseError) -> None:
    """Raise an answer that means "no writes here for now" as a connection error.

    A demoted primary, too few replicas, a primary lost by its replica, a dataset loading
    (see :data:`rq_epoch.failover.OUTAGE_CODES`): RQ's dequeue loop rides a connection
    error out with backoff, where any other error would end the worker.
    """
    if is_outage(exc):
        raise redis.exceptions.ConnectionError(f'the server cannot give out jobs now: {exc}') from exc


class TrackingRefused(RqEpochError):
    """The server (or a proxy in front of it) refused client tracking: an ACL, an old server."""


class Waker:
    """Waits, without polling and without popping, until one of some queues may have a job.

    :meth:`arm` reads the queues on a connection of its own with client tracking on; the
    server then pushes one invalidation on that connection at the next write to any of
    those lists, by any client. :meth:`wait` blocks on the connection until that message
    or the timeout. Arming again after a wake-up re-arms it, and says whether the write
    left a job.
    """

    def __init__(self, connection: Redis) -> None:
        self._pool = connection.connection_pool
        self._connection: AbstractConnection | None = None

    def _connect(self) -> AbstractConnection:
        connection = _dedicated_connection(self._pool)
        try:
            try:
                connection.connect()  # HELLO 3
                connection.send_command('CLIENT', 'TRACKING', 'ON')
                connection.read_response()
            except redis.exceptions.ResponseError as exc:
                if is_outage(exc):
                    raise
                raise TrackingRefused(str(exc)) from exc
        except BaseException:
            connection.disconnect()
            raise
        self._connection = connection
        return connection

    def arm(self, queue_keys: Sequence[str]) -> bool:
        """Ask to be woken at the next write to any of ``queue_keys``; say whether one has jobs.

        Wake-ups received so far are dropped first: any write after this read sends a new
        one, so none that matters is lost. Then one ``EXISTS`` of every queue (a list
        exists while it has a job) is both the answer and the arming read. Returns True
        when a queue has jobs (there is no reason to wait).

        Raises:
            TrackingRefused: the server refused RESP3 or client tracking (the connection is closed).
            redis.exceptions.ConnectionError: the connection failed (it is closed).
        """
        try:
            connection = self._connection
            if connection is None:
                connection = self._connect()
            else:
                self._drain(connection)
            connection.send_command('EXISTS', *queue_keys)
            existing = self._reply(connection)
        except BaseException:
            self.close()
            raise
        return existing > 0

    def wait(self, seconds: float) -> bool:
        """Block up to ``seconds`` for a wake-up; True when one came (it is consumed)."""
        connection = self._connection
        if connection is None:
            return False
        try:
            if not connection.can_read(timeout=seconds):
                return False
            connection.read_response(push_request=True)
            return True
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _reply(connection: AbstractConnection) -> int:
        """The integer reply of the last command, past any invalidation pushed before it."""
        for _ in range(10_000):
            reply = connection.read_response(push_request=True)
            if isinstance(reply, int):
                return reply
        raise redis.exceptions.ConnectionError('no reply among the invalidations')

    @staticmethod
    def _drain(connection: AbstractConnection) -> None:
        for _ in range(10_000):
            if not connection.can_read(timeout=0):
                return
            connection.read_response(push_request=True)

    def close(self) -> None:
        """Close the connection (the next :meth:`arm` opens a new one)."""
        if self._connection is not None:
            try:
                self._connection.disconnect()
            except Exception:  # noqa: S110 - closing a broken socket
                pass
        self._connection = None


@dataclass
class TakerCounters:
    """What one worker's waiting did, counted since it started (read by tests and benchmarks)."""

    #: Woken by the server: an invalidation (as the watcher) or a baton (as a waiter).
    wakeups: int = 0
    #: Takes that found every queue empty.
    empty_takes: int = 0
    #: Times it became the watcher of its queues.
    watch_terms: int = 0
    #: Times it handed the watch on after taking a job.
    handoffs: int = 0


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

    def __init__(
        self,
        connection: Redis,
        log: logging.Logger | None = None,
        *,
        name: str | None = None,
        watch_ttl: float = 10.0,
    ) -> None:
        self.connection = connection
        self.log = log or logger
        #: This taker's token in the watch and baton keys (the worker's name).
        self.name = name or uuid.uuid4().hex
        #: Seconds the watch is held without a refresh; a waiter's ``BLPOP`` lasts no longer.
        self.watch_ttl = watch_ttl
        self.counters = TakerCounters()
        self._waker: Waker | None = None
        self._polling = not self.tracking
        self._reconnect = False
        self._stand_ins: dict[type, type] = {}
        #: The set of queues (:func:`rq_epoch.keys.queue_set_id`) this taker watches, if any,
        #: and when it last claimed or refreshed the watch (``time.monotonic()``).
        self._watching: str | None = None
        self._claimed_at = 0.0

    # -- the take ------------------------------------------------------------------------

    def take(self, queues: Sequence[Queue]) -> tuple[Queue, str] | None:
        """Move the first job of ``queues`` (in this order) into its intermediate list.

        One script call, one round trip. Returns the queue and the job id, or None when
        every queue is empty.

        Raises:
            redis.exceptions.ConnectionError: also when the server answers that it takes no
                writes for now (:data:`rq_epoch.failover.OUTAGE_CODES`): an outage.
        """
        script_keys = [queue.key for queue in queues] + [queue.intermediate_queue_key for queue in queues]
        try:
            reply = scripts.take()(self.connection, script_keys, [])
        except redis.exceptions.ResponseError as exc:
            _outage_as_connection_error(exc)
            raise
        index = int(reply[0])
        if index == 0:
            self.counters.empty_takes += 1
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
                self._hand_on()
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

        The watcher of these queues (see the module's docstring) waits for an invalidation;
        a wake-up whose write left no job (another worker took it, or it was a write that
        adds none) goes back to waiting after one ``EXISTS``, without a take. Any other
        worker waits for the baton, then claims the watch. While polling, it returns True
        after :attr:`poll_interval` seconds.
        """
        deadline = time.monotonic() + seconds
        if self._reconnect and self._waker is not None:
            self._waker.close()
            self._waker = None
        self._reconnect = False
        if not self._polling:
            try:
                return self._wait_watched(queue_keys, deadline)
            except redis.exceptions.RedisError:
                if self._waker is not None:
                    self._waker.close()  # the next wait connects again
                    self._waker = None
                raise
            except TrackingRefused as exc:
                self._waker = None
                self._polling = True
                self._hand_on()
                self.log.warning(
                    'rq-epoch: the server refused client tracking (%s); waiting for jobs by taking every %ss instead',
                    exc,
                    self.poll_interval,
                )
        time.sleep(max(0.0, min(self.poll_interval, deadline - time.monotonic())))
        return True

    def _wait_watched(self, queue_keys: Sequence[str], deadline: float) -> bool:
        set_id = keys.queue_set_id(queue_keys)
        armed = False
        for _ in range(1_000_000):  # each turn waits until a job, a baton, a refresh or the deadline
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if not self._watch(set_id):
                armed = False
                if self._wait_for_baton(set_id, min(remaining, self.watch_ttl)):
                    self.counters.wakeups += 1
                continue
            if self._waker is None:
                self._waker = Waker(self.connection)
            if not armed:
                if self._waker.arm(queue_keys):
                    return True
                armed = True
            until_refresh = self._claimed_at + self.watch_ttl / 3 - time.monotonic()
            if self._waker.wait(max(0.0, min(remaining, until_refresh))):
                self.counters.wakeups += 1
                armed = False  # read the queues again: that says whether the write left a job
        return False

    def _watch(self, set_id: str) -> bool:
        """Whether this taker watches ``set_id`` now: claims the watch when nobody holds it,
        refreshes it once a third of its TTL has passed (``watch.lua``)."""
        now = time.monotonic()
        if self._watching == set_id and now - self._claimed_at < self.watch_ttl / 3:
            return True
        ttl_ms = max(1, int(self.watch_ttl * 1000))
        try:
            if self._watching is not None and self._watching != set_id:
                self._hand_on()  # the worker's queues changed
            if self._watching == set_id:
                watching = self._watch_script('claim', set_id, ttl_ms)
            else:  # a plain SET NX: the common case of a taker that finds the watch taken
                watching = bool(self.connection.set(keys.watch_key(set_id), self.name, nx=True, px=ttl_ms))
        except redis.exceptions.ResponseError as exc:
            _outage_as_connection_error(exc)
            raise
        if not watching:
            self._watching = None
            return False
        if self._watching != set_id:
            self._watching = set_id
            self.counters.watch_terms += 1
        self._claimed_at = now
        return True

    def _watch_script(self, action: str, set_id: str, ttl_ms: int) -> bool:
        """Call ``watch.lua``; its reply is whether this taker holds (claim) or held (pass) the watch."""
        script_keys = [keys.watch_key(set_id), keys.baton_key(set_id)]
        return int(scripts.watch()(self.connection, script_keys, [action, self.name, ttl_ms])) == 1

    def _wait_for_baton(self, set_id: str, seconds: float) -> bool:
        """Block on the baton list up to ``seconds`` (``BLPOP`` on the main connection); True when
        a token came."""
        timeout = max(0.01, round(seconds, 2))  # 0 would wait forever
        try:
            # (redis-py's blpop() is typed for whole seconds before 6.0; the server takes decimals)
            return self.connection.execute_command('BLPOP', keys.baton_key(set_id), timeout) is not None
        except redis.exceptions.ResponseError as exc:
            _outage_as_connection_error(exc)
            raise

    def _hand_on(self) -> None:
        """When this taker watches: give up the watch and wake one waiter to take it over.

        Called after a take found a job (the worker is busy from now on), and when the taker
        stops. A failure only delays the handover: the watch key expires by its TTL.
        """
        set_id, self._watching = self._watching, None
        if set_id is None:
            return
        try:
            if self._watch_script('pass', set_id, max(1, int(self.watch_ttl * 1000))):
                self.counters.handoffs += 1
        except redis.exceptions.RedisError as exc:
            self.log.debug('rq-epoch: could not hand the watch on (%s); it expires by itself', exc)

    def reconnect(self) -> None:
        """Open a new wake-up connection at the next wait (the primary moved: see
        :class:`~rq_epoch.failover.PrimaryWatch`). Safe from any thread: it only sets a flag."""
        self._reconnect = True

    def close(self) -> None:
        """Hand the watch on, if this taker holds it, and close the wake-up connection, if any."""
        self._hand_on()
        if self._waker is not None:
            self._waker.close()
            self._waker = None
