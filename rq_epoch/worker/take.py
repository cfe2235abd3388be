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
of that set of queues (it holds ``<prefix>:epoch:watch:<set>``, with a TTL of half a sweep
interval that it refreshes while it waits), and only the watcher keeps tracking armed.
The others block in ``BLPOP <prefix>:epoch:baton:<set>`` on their main connection. The
place goes with the take, in the same script: a take that finds no job claims the watch
when nobody holds it, and a take that moves a job hands the watch on (its key deleted,
one token pushed on the baton list). An enqueue wakes the watcher alone; its take moves
the job and wakes the one waiter that pops the token. That waiter claims the free watch
with one ``SET NX``, sent together with its first read of the queues as the watcher on its
tracking connection (no take: the read, which arms tracking, says whether a job waits; when
another worker claimed the watch first, it takes again, which gives it its turn). An
enqueue thus makes at most two workers read the queues (the watcher, and the waiter it
hands on to), however many wait.

A watcher that dies stops refreshing its key, and the key expires after its TTL (half a
sweep interval). The waiters take turns to look: the take that leaves a worker waiting
gives it a turn (``<prefix>:epoch:turns:<set>``), :attr:`Taker.turn_gap` after the last
one given out (a quarter of the interval), and it blocks until then, or until a token
comes, and takes again, which claims the watch if nobody holds it. One waiter wakes per
gap, however many wait; a waiter keeps its turn until it comes. A job enqueued right
after the watcher was killed starts within one sweep interval, also when the waiter
whose turn came next was killed with it.

Waiters take nothing else and sweep nothing, and go back to RQ's loop (which heartbeats)
only when RQ's dequeue timeout has passed (the worker's TTL less 15 s, 405 s by default),
as a stock idle worker does. The watcher goes back to RQ's loop once per sweep
interval, so that RQ's loop heartbeats and sweeps the queues (with their sweep tickets)
for the idle fleet. A worker alone on one queue blocks in RQ's ``BLMOVE`` (which wakes one
worker per job) and goes back to RQ's loop once per sweep interval when it won the queue's
sweep ticket last time, else at its turn to ask for it again, which the ticket script gives
one interval after the last turn given (one such worker wakes per interval however many
wait, and a sweeper that died is replaced within about two intervals: a dead worker's job
is still detected within the lease and two sweep intervals, 40 s with the defaults). A worker that polls goes
back once per sweep interval.

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
from typing import TYPE_CHECKING, Any, NamedTuple

import redis.exceptions
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.utils import get_version

from ..adapters import rq as rq_adapter
from ..errors import RqEpochError
from ..protocol import keys, verbs
from ..protocol.verbs import Role
from .failover import is_outage

if TYPE_CHECKING:
    from redis import Redis
    from redis.connection import AbstractConnection, ConnectionPool
    from rq.job import Job as RQJob
    from rq.queue import Queue

__all__ = ['Role', 'Taken', 'Taker', 'TakerCounters', 'TrackingRefused', 'Waker']

logger = logging.getLogger('rq_epoch')


class Taken(NamedTuple):
    """A job the take moved into its queue's intermediate list."""

    queue: Queue
    job_id: str
    #: The job's hash as ``HGETALL`` gives it, read in the same step as the take (empty: the
    #: hash is gone); None when the take was not asked to read it.
    job_hash: dict[bytes, bytes] | None = None


def _job_key_prefix(job_class: type[RQJob] | None, queues: Sequence[Queue]) -> str:
    """The prefix of the job keys the take reads the moved job under: the job class's
    (``job_class``, else each queue's), when every such class fetches a job as RQ does
    (:func:`rq_epoch.adapters.rq.fetches_as_rq`) under one prefix; else '' and the job is
    fetched with the class's own ``fetch``."""
    classes = {job_class} if job_class is not None else {queue.job_class for queue in queues}
    prefixes = {cls.redis_job_namespace_prefix for cls in classes}
    if len(prefixes) != 1 or not all(rq_adapter.fetches_as_rq(cls) for cls in classes):
        return ''
    return prefixes.pop()


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
    (see :data:`rq_epoch.worker.failover.OUTAGE_CODES`): RQ's dequeue loop rides a connection
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

    def connect(self) -> None:
        """Open the connection now, if it is not open (:meth:`arm` opens it otherwise).

        Raises:
            TrackingRefused: the server refused RESP3 or client tracking (the connection is closed).
            redis.exceptions.ConnectionError: the connection failed (it is closed).
        """
        if self._connection is None:
            self._connect()

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
            connection = self._drained()
            connection.send_command('EXISTS', *queue_keys)
            existing = self._reply(connection)
        except BaseException:
            self.close()
            raise
        return existing > 0

    def claim_handed_on(
        self, watch_key: str, token: str, ttl_ms: int, queue_keys: Sequence[str]
    ) -> verbs.HandedOnClaim:
        """Claim the watch a token said was handed on, and :meth:`arm`, in one request.

        The waiter that a token woke claims the free watch with ``SET NX``
        (:func:`rq_epoch.protocol.verbs.claim_free_watch_command`) and reads the queues as the
        watcher; both go together on this connection, the read arming tracking as in
        :meth:`arm`. When another worker claimed the watch first, tracking is armed all the
        same; the next :meth:`arm` drops the invalidations that come of it.

        Raises:
            redis.exceptions.ResponseError: the server refused the claim (the connection is closed).
            redis.exceptions.ConnectionError: the connection failed (it is closed).
        """
        try:
            connection = self._drained()
            claim = verbs.claim_free_watch_command(watch_key, token, ttl_ms)
            connection.send_packed_command(connection.pack_commands([claim, ('EXISTS', *queue_keys)]))
            set_reply = connection.read_response()  # the parser passes over invalidations
            existing = self._reply(connection)
        except BaseException:
            self.close()
            raise
        return verbs.HandedOnClaim.read(set_reply, existing)

    def _drained(self) -> AbstractConnection:
        """The connection, opened now, or with the wake-ups received so far dropped."""
        if self._connection is None:
            return self._connect()
        self._drain(self._connection)
        return self._connection

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

    #: Woken to read the queues: by an invalidation (as the watcher), or by a token of the
    #: baton list (the watch handed on).
    wakeups: int = 0
    #: Takes that found every queue empty.
    empty_takes: int = 0
    #: Times it became the watcher of its queues.
    watch_terms: int = 0
    #: Times it handed the watch on after taking a job.
    handoffs: int = 0
    #: Blocking moves (RQ's ``BLMOVE``) of a worker alone on one queue.
    blocking_moves: int = 0
    #: Calls of ``watch.lua``'s claim: the watcher's refreshes (the takes claim too, uncounted here).
    claims: int = 0


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
        watch_ttl: float = 2.5,
        sweep_interval: float = 5.0,
    ) -> None:
        self.connection = connection
        self.log = log or logger
        #: This taker's token in the watch and baton keys (the worker's name).
        self.name = name or uuid.uuid4().hex
        #: Seconds the watch is held without a refresh; a waiter's ``BLPOP`` lasts no longer.
        self.watch_ttl = watch_ttl
        #: Seconds the watcher (and a worker on one queue, or a polling one) waits before it
        #: goes back to RQ's loop, which heartbeats and sweeps: the worker's sweep interval.
        self.sweep_interval = sweep_interval
        self.counters = TakerCounters()
        self._waker: Waker | None = None
        self._polling = not self.tracking
        self._reconnect = False
        self._stand_ins: dict[type, type] = {}
        #: Whether this worker won a sweep ticket at its last ask (the worker sets it): it then
        #: asks again one sweep interval later, else at its turn (:meth:`ticket_turn`), so that
        #: one other worker of its queues asks per interval, however many there are. A worker
        #: alone on one queue waits in RQ's BLMOVE until then: only the fleet's sweeper of an
        #: idle queue wakes each interval, and one other worker per interval.
        self.sweeping = True
        #: The turn to ask for the sweep tickets again of a worker that won none: server time
        #: in ms (0: none), and when it comes by this process's clock.
        self.ticket_turn_ms = 0
        self.ticket_turn_at: float | None = None
        #: The set of queues (:func:`rq_epoch.protocol.keys.queue_set_id`) this taker last claimed a
        #: place in, the place, and when (``time.monotonic()``; None: claim at the next turn).
        self._set: str | None = None
        self._role = Role.NEITHER
        self._claimed_at: float | None = None
        #: When the current :meth:`dequeue_any` call goes back to RQ's loop because this taker
        #: watches (``time.monotonic()``; None until it watches in this call).
        self._watch_deadline: float | None = None
        #: This taker's turn to take again while it waits for the baton: server time in ms (0:
        #: none), kept through RQ's loop, and when it comes by this process's clock (None: no
        #: turn to wait for, take again first).
        self._turn_set: str | None = None
        self._turn_ms = 0
        self._turn_at: float | None = None

    # -- the take ------------------------------------------------------------------------

    def take(self, queues: Sequence[Queue], *, waiting: bool = False, job_key_prefix: str = '') -> Taken | None:
        """Move the first job of ``queues`` (in this order) into its intermediate list.

        One script call, one round trip. With ``job_key_prefix`` (RQ's ``"rq:job:"``), the
        same call reads the job's hash, which :attr:`Taken.job_hash` carries. With ``waiting``
        (the worker waits for a job when there is none) and unless this taker polls, the same
        call keeps its place among the idle workers of these queues: a job taken hands the
        watch on to another idle worker (if this one held it, or nobody did); every queue
        empty, this one claims the watch if nobody holds it, or is given its turn. Returns the
        queue and the job id (and hash), or None when every queue is empty.

        Raises:
            redis.exceptions.ConnectionError: also when the server answers that it takes no
                writes for now (:data:`rq_epoch.worker.failover.OUTAGE_CODES`): an outage.
        """
        script_keys = [queue.key for queue in queues] + [queue.intermediate_queue_key for queue in queues]
        args: list[Any] = [len(queues), job_key_prefix]
        set_id = None
        if waiting and not self._polling:
            set_id = keys.queue_set_id(queue.key for queue in queues)
            if self._set is not None and self._set != set_id:
                self.hand_on()  # the worker's queues changed
            script_keys += [keys.watch_key(set_id), keys.baton_key(set_id), keys.turns_key(set_id)]
            kept = self._turn_ms if self._turn_set == set_id else 0
            args += [self.name, self._ttl_ms, max(1, int(self.turn_gap * 1000)), kept]
        try:
            reply = verbs.take(self.connection, script_keys, args)
        except redis.exceptions.ResponseError as exc:
            _outage_as_connection_error(exc)
            raise
        if reply.index is None:
            self.counters.empty_takes += 1
            if set_id is not None:
                self._placed(set_id, reply.role)
                if reply.role is not Role.WATCHER:
                    self._turn_set, self._turn_ms = set_id, reply.turn_ms
                    self._turn_at = time.monotonic() + reply.wait
            return None
        if self._role is Role.WATCHER and reply.woke:
            self.counters.handoffs += 1
        self._set, self._role, self._claimed_at = None, Role.NEITHER, None
        queue, job_id = queues[reply.index], reply.job_id
        self.taken(queue, job_id)
        return Taken(queue, job_id, reply.job_hash)

    def taken(self, queue: Queue, job_id: str) -> None:
        """Called right after the take script moved ``job_id``, before anything else.

        Nothing by default; the tests kill a worker here.
        """

    # -- RQ's dequeue ----------------------------------------------------------------------

    def stand_in(self, queue_class: type[Queue]) -> type[Queue]:
        """``queue_class`` with :meth:`dequeue_any` in place of RQ's (made once per class;
        see :func:`rq_epoch.adapters.rq.queue_class_dequeuing_with`)."""
        stand_in = self._stand_ins.get(queue_class)
        if stand_in is None:
            taker = self

            def dequeue_any(cls: type[Queue], *args: Any, **kwargs: Any) -> tuple[RQJob, Queue] | None:
                # A plain function: classmethod() of a bound method binds differently by
                # Python version (3.10 passes no class to it).
                return taker._dequeue_any_of(queue_class, *args, **kwargs)

            stand_in = rq_adapter.queue_class_dequeuing_with(queue_class, dequeue_any)
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
            # RQ moves the job into the intermediate list itself (BLMOVE), and blocks: one
            # sweep interval when this worker swept the queue last (so that RQ's loop sweeps
            # it on time), else until its turn to ask for the ticket again (another worker
            # sweeps it; if that one died, a waiter whose turn comes asks for it).
            wait = self.sweep_interval
            if not self.sweeping and self.ticket_turn_at is not None:
                wait = self.ticket_turn_at - time.monotonic()
            self.counters.blocking_moves += 1
            return queue_class.dequeue_any(
                queues,
                # (RQ types the timeout as whole seconds; BLMOVE takes decimals, and 0 would block forever)
                None if timeout is None else max(0.01, round(min(timeout, wait), 2)),  # type: ignore[arg-type]
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

        ``timeout`` None takes once and returns None when the queues are empty. Otherwise
        ``timeout`` is RQ's dequeue timeout (``Worker.dequeue_timeout``), the longest RQ's
        loop may go without a heartbeat, and the wait for a job ends, raising RQ's
        DequeueTimeout, at the first of:

        * ``timeout`` seconds: how long an idle worker that does not watch sleeps (it only
          waits for the baton, see :meth:`wait`);
        * :attr:`sweep_interval` seconds after this taker began to watch in this call (or
          after the call began, while polling): RQ's loop then heartbeats and sweeps, so an
          idle fleet's queues are swept by their watcher, not by every worker.
        """
        queues = list(queues)
        queue_keys = [queue.key for queue in queues]
        prefix = _job_key_prefix(job_class, queues)
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        self._watch_deadline = None
        for _ in range(1_000_000):  # each turn takes a job, or waits, or ends
            found = self.take(queues, waiting=deadline is not None, job_key_prefix=prefix)
            if found is not None:
                job = self._fetch(found, job_class, serializer)
                if job is None:
                    continue
                return job, found.queue
            if deadline is None:
                return None
            if self._polling:  # every poller sweeps: none watches for the others
                deadline = min(deadline, started + self.sweep_interval)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.wait(queue_keys, remaining):
                break  # no take at the deadline: RQ's loop heartbeats, then dequeues again
        raise DequeueTimeout(timeout, queue_keys)

    def _fetch(self, taken: Taken, job_class: type[RQJob] | None, serializer: Any) -> RQJob | None:
        """The job the take moved, as RQ's ``fetch`` gives it: made from the hash the take read,
        or fetched when it read none."""
        queue, job_id = taken.queue, taken.job_id
        cls: Any = job_class or queue.job_class
        try:
            if taken.job_hash is not None:
                return rq_adapter.job_from_hash(cls, job_id, taken.job_hash, self.connection, serializer)
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

        The watcher of these queues (see the module's docstring) reads them (``EXISTS``, which
        arms tracking), waits for an invalidation and returns True at one (the take follows
        at once), or returns False once :attr:`sweep_interval` has passed since it began to
        watch in the current :meth:`dequeue_any` call, so that RQ's loop heartbeats and
        sweeps. Any other worker
        sleeps: it waits for the baton until its turn (see :attr:`turn_gap`), and returns
        True (the take that follows claims the watch if nobody holds it).
        While polling, it returns True after :attr:`poll_interval` seconds.
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
                self.hand_on()
                self.log.warning(
                    'rq-epoch: the server refused client tracking (%s); waiting for jobs by taking every %ss instead',
                    exc,
                    self.poll_interval,
                )
        time.sleep(max(0.0, min(self.poll_interval, deadline - time.monotonic())))
        return True

    def _wait_watched(self, queue_keys: Sequence[str], deadline: float) -> bool:
        """:meth:`wait` with client tracking: as the watcher, or as a waiter for the baton.

        The take that came before claimed this taker's place: the watch, when nobody held it.
        """
        set_id = keys.queue_set_id(queue_keys)
        if self._waker is None:
            self._waker = Waker(self.connection)
        # Every idle worker opens its wake-up connection when it first waits, watcher or
        # not, so that taking the watch over later costs no connection in a job's path.
        self._waker.connect()
        armed = False
        for _ in range(1_000_000):  # each turn waits until a job, a baton, a refresh or the deadline
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._claim(set_id) is not Role.WATCHER:
                turn_at, self._turn_at = self._turn_at, None
                if turn_at is None:
                    return True  # the watcher's refresh found the watch taken: the take gives a turn
                if self._wait_for_baton(set_id, min(remaining, turn_at - time.monotonic())):
                    self.counters.wakeups += 1
                    claim = self._claim_handed_on(self._waker, set_id, queue_keys)
                    if claim.claimed:
                        if claim.jobs_waiting:
                            return True  # the watcher now, and a job waits: take it
                        armed = True
                        continue  # the watcher now, tracking armed by its read of the queues
                # This waiter's turn, or a token whose watch another worker claimed first: take
                # again, which claims the watch if nobody holds it (its watcher died and its
                # key expired), or gives this waiter its next turn.
                self._claimed_at = None
                return True
            if self._watch_deadline is None:
                self._watch_deadline = time.monotonic() + self.sweep_interval
            remaining = min(remaining, self._watch_deadline - time.monotonic())
            if remaining <= 0:
                return False  # the watcher's turn in RQ's loop: heartbeat and sweep
            if not armed:
                if self._waker.arm(queue_keys):
                    return True
                armed = True
            assert self._claimed_at is not None
            until_refresh = self._claimed_at + self.watch_ttl / 3 - time.monotonic()
            if self._waker.wait(max(0.0, min(remaining, until_refresh))):
                # A write to the queues: take at once (the take says whether it left a job,
                # and hands the watch on when it did); the next wait arms tracking again.
                self.counters.wakeups += 1
                return True
        return False

    @property
    def turn_gap(self) -> float:
        """Seconds between two waiters' turns to take again: half of what the sweep interval
        leaves after the watch's TTL (a quarter of the interval, by default).

        A watcher that dies stops refreshing its key, which expires within the TTL; the
        waiter whose turn comes next takes within one gap after that, or, if it died with
        the watcher, the one after it within two: a job enqueued when the watcher and one
        more idle worker were killed starts within one sweep interval. One waiter wakes per
        gap, however many wait.
        """
        return max(0.01, (self.sweep_interval - self.watch_ttl) / 2)

    def ticket_turn(self, tickets: verbs.SweepTickets) -> None:
        """Note what this worker's ask for the sweep tickets of its queues gave it: a ticket (it
        sweeps, and asks again one interval later), or its turn to ask again."""
        self.sweeping = bool(tickets.granted)
        if tickets.granted or not tickets.turn_ms:
            self.ticket_turn_at = None
        else:
            self.ticket_turn_ms, self.ticket_turn_at = tickets.turn_ms, time.monotonic() + tickets.wait

    @property
    def watching(self) -> bool:
        """Whether this taker holds the watch of its queues (last it knew): the idle fleet's
        watcher, which goes back to RQ's loop once per sweep interval to sweep for the others."""
        return self._role is Role.WATCHER

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.watch_ttl * 1000))

    def _placed(self, set_id: str, role: Role) -> None:
        """Note the place a take or a claim gave this taker among the idle workers of ``set_id``."""
        if role is Role.WATCHER and not (self._set == set_id and self._role is Role.WATCHER):
            self.counters.watch_terms += 1
        self._set, self._role, self._claimed_at = set_id, role, time.monotonic()

    def _claim(self, set_id: str) -> Role:
        """This taker's place among the idle workers of ``set_id``.

        The last take claimed it; the watcher refreshes its claim (``watch.lua`` claim) once
        a third of the watch's TTL has passed.
        """
        if self._set == set_id and self._claimed_at is not None:
            if self._role is not Role.WATCHER or time.monotonic() - self._claimed_at < self.watch_ttl / 3:
                return self._role
        role = self._watch_script('claim', set_id)
        self.counters.claims += 1
        self._placed(set_id, role)
        if role is not Role.WATCHER:
            self._turn_at = None  # the next take gives it a turn
        return role

    def _claim_handed_on(self, waker: Waker, set_id: str, queue_keys: Sequence[str]) -> verbs.HandedOnClaim:
        """Claim the watch that a token says was handed on (its key deleted by the take that
        moved a job), and read the queues as the watcher: one request on the tracking
        connection (``waker``, :meth:`Waker.claim_handed_on`), no script and no take, as that
        read says whether a job waits."""
        try:
            claim = waker.claim_handed_on(keys.watch_key(set_id), self.name, self._ttl_ms, queue_keys)
        except redis.exceptions.ResponseError as exc:
            _outage_as_connection_error(exc)
            raise
        if claim.claimed:
            self.counters.claims += 1
            self._placed(set_id, Role.WATCHER)
        return claim

    def _watch_script(self, action: str, set_id: str) -> Role:
        """Call ``watch.lua``: the watcher's refresh (claim), or the place it left (leave)."""
        script_keys = [keys.watch_key(set_id), keys.baton_key(set_id)]
        try:
            return verbs.watch(self.connection, script_keys, [action, self.name, self._ttl_ms, keys.PREFIX])
        except redis.exceptions.ResponseError as exc:
            _outage_as_connection_error(exc)
            raise

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

    def hand_on(self) -> None:
        """Give up the watch, if this taker holds it, and wake one waiter to take it.

        A take that moves a job does this itself, in the same script; this is for a taker
        that stops (or waits on other queues, or polls from now on) while it holds the
        watch. A failure only delays the handover: the key expires by its TTL.
        """
        set_id, role = self._set, self._role
        self._set, self._role, self._claimed_at = None, Role.NEITHER, None
        if set_id is None or role is not Role.WATCHER:
            return
        try:
            if self._watch_script('leave', set_id) is Role.WATCHER:
                self.counters.handoffs += 1
        except redis.exceptions.RedisError as exc:
            self.log.debug('rq-epoch: could not hand the watch on (%s); it expires by itself', exc)

    def reconnect(self) -> None:
        """Open a new wake-up connection at the next wait (the primary moved: see
        :class:`~rq_epoch.worker.failover.PrimaryWatch`). Safe from any thread: it only sets a flag."""
        self._reconnect = True

    def close(self) -> None:
        """Hand the watch on, if this taker holds it, and close the wake-up connection, if any."""
        self.hand_on()
        if self._waker is not None:
            self._waker.close()
            self._waker = None
