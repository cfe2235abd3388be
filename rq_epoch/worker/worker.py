"""RQ's Worker, with epoch-stamped leases and its own frequent epoch-aware sweep.

:class:`Worker` is RQ's worker class with its hooks filled in; the work is done by the objects
it owns, one concept each:

* :class:`~rq_epoch.worker.contact.ServerContact`: the epoch it last saw, and outages;
* :class:`~rq_epoch.worker.outcomes.OutcomeWriter`: outcomes fenced and written through an outage
  (the fence itself: :mod:`rq_epoch.worker.fence`);
* the grant and heartbeat round trips of :mod:`rq_epoch.worker.heartbeats`;
* :class:`~rq_epoch.worker.failover.PrimaryWatch`: following the primary after a failover;
* :class:`~rq_epoch.worker.take.Taker`: taking jobs and waiting for the next one;
* :class:`~rq_epoch.sweep.Sweeper`, run when the worker wins a queue's sweep ticket
  (:mod:`rq_epoch.worker.tickets`);
* its :class:`~rq_epoch.worker.stopping.StopRequest` once told to stop: the stop mark, the
  bounded wait for the job and its hand-back (:mod:`rq_epoch.worker.stopping`).
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis.exceptions
from rq.defaults import DEFAULT_JOB_MONITORING_INTERVAL, DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.job import Job as RQJob
from rq.logutils import setup_loghandlers
from rq.timeouts import JobTimeoutException
from rq.utils import now
from rq.worker import Worker as RQWorker
from rq.worker_registration import clean_worker_registry

from .. import compat
from ..adapters import redis_py
from ..adapters import rq as rq_adapter
from ..errors import CONNECTION_ERRORS, OutcomeRefused, RqEpochError
from ..jobs.job import EpochJobMixin, Job
from ..jobs.jobclass import adopt, resolve_job_class
from ..jobs.queue import HoldsReadyDependents, holding_ready_dependents
from ..protocol import keys, scripts, verbs
from ..protocol.durable import Durability
from ..protocol.report import SweepReport
from ..protocol.server import ServerEpoch, read_epoch
from ..settings import UNLIMITED, EpochSettings
from ..sweep.sweeper import Sweeper
from .contact import ServerContact
from .failover import PrimaryWatch, is_outage
from .fence import Fence, arm
from .heartbeats import confirm_grant, grant_again, heartbeat_round_trip, lease_ttl
from .outcomes import OutcomeWriter
from .reaping import HorseReaper, WaitResult
from .stopping import StopRequest, hand_back, mark_stopping
from .take import Taker
from .tickets import take_tickets

if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline, PubSub, PubSubWorkerThread
    from rq.executions import Execution
    from rq.queue import Queue as RQQueue

__all__ = ['HANDED_BACK', 'STOP_SIGNALS', 'Worker', 'wait_while_unavailable']


_T = TypeVar('_T')

#: The signals a supervisor or a terminal stops a worker with; the work-horse ignores them.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
#: The ``taken`` record of a lease its execution handed back (``lua/handback.lua``).
HANDED_BACK = 'handed_back'


def wait_while_unavailable(
    attempt: Callable[[], _T], *, limit: float, log: logging.Logger | logging.LoggerAdapter[Any], name: str
) -> _T:
    """``attempt()``, retried while the server is down or answers that it cannot serve now.

    A worker started during an outage (a deploy during a failover, a server restarting)
    would otherwise exit at once, and its supervisor would restart it into a backoff. The
    wait logs one line when it starts and one when the server is back, retries with a
    growing pause (at most 5 s) for up to ``limit`` seconds, then raises the last error.
    "Cannot serve now" is a connection error or an answer of
    :data:`rq_epoch.worker.failover.OUTAGE_CODES` (loading, read-only, too few replicas, primary
    lost); any other error is raised at once.
    """
    started = time.monotonic()
    pause = 0.5
    waiting = False
    for _ in range(1_000_000):  # each turn tries once, then pauses (the time limit ends it)
        try:
            result = attempt()
        except (*CONNECTION_ERRORS, redis.exceptions.ResponseError) as exc:
            if isinstance(exc, redis.exceptions.ResponseError) and not is_outage(exc):
                raise
            if isinstance(exc, redis.exceptions.AuthenticationError):
                raise  # a wrong password is no outage (redis-py makes it a ConnectionError)
            waited = time.monotonic() - started
            if waited >= limit:
                if waiting:
                    log.error('Worker %s: the server did not come back within %ss: %s', name, limit, exc)
                raise
            if not waiting:
                waiting = True
                log.warning(
                    'Worker %s: the server cannot serve this worker yet (%s); waiting for it, up to %ss',
                    name,
                    exc,
                    limit,
                )
            time.sleep(min(pause, limit - waited))
            pause = min(5.0, pause * 2)
            continue
        if waiting:
            log.warning('Worker %s: the server is back after %.1fs; starting', name, time.monotonic() - started)
        return result
    raise redis.exceptions.ConnectionError('the server did not come back')


class Worker(RQWorker):
    """An RQ worker whose leases carry the server epoch.

    * grants a lease stamped with the server's run_id when it starts an execution, and
      extends and re-stamps it at every heartbeat (in the same round trip as RQ's own
      heartbeat writes);
    * runs the epoch-aware sweep every ``sweep_interval`` seconds, idle or busy, instead
      of RQ's abandoned-job cleanup;
    * rides out server outages while a job runs: heartbeats that fail are retried, and the
      first one after the server returns moves the lease to the new server process.

    Settings come from the keyword arguments, else the ``RQ_EPOCH_*`` environment
    variables (see :mod:`rq_epoch.settings`), else the defaults. ``rq worker
    --worker-class rq_epoch.Worker`` needs nothing else.
    """

    job_class = Job
    #: Longest wait, in seconds, for the server to return while an outcome is unwritten (and
    #: while a job waits to start: RQ's preparation, a spawned work-horse's rebuild).
    outcome_retry_limit: float = 600.0

    def __init__(
        self,
        queues: Any,
        *args: Any,
        max_stalled: int | None = None,
        heartbeat_interval: int | None = None,
        lease_margin: int | None = None,
        sweep_interval: int | None = None,
        restart_grace: int | None = None,
        batch_size: int | None = None,
        startup_wait: int | None = None,
        shutdown_timeout: int | str | None = None,
        durable_replicas: int | None = None,
        durable_timeout: int | None = None,
        durable_fsync: int | bool | None = None,
        **kwargs: Any,
    ) -> None:
        self.epoch_settings = EpochSettings.resolve(
            durable_replicas=durable_replicas,
            durable_timeout=durable_timeout,
            durable_fsync=None if durable_fsync is None else int(durable_fsync),
            max_stalled=max_stalled,
            heartbeat_interval=heartbeat_interval,
            lease_margin=lease_margin,
            sweep_interval=sweep_interval,
            restart_grace=restart_grace,
            batch_size=batch_size,
            startup_wait=startup_wait,
            shutdown_timeout=shutdown_timeout,
        )
        kwargs['job_class'] = resolve_job_class(type(self), kwargs.get('job_class'))
        connection = kwargs.get('connection')
        if connection is not None and kwargs.get('prepare_for_work', True):
            # RQ's worker names its connection (CLIENT SETNAME) as it is made: wait for a server.
            wait_while_unavailable(
                connection.ping,
                limit=self.epoch_settings.startup_wait,
                log=logging.getLogger('rq.worker'),
                name=str(kwargs.get('name') or '(starting)'),
            )
        super().__init__(queues, *args, **kwargs)
        if (
            heartbeat_interval is None
            and not os.environ.get('RQ_EPOCH_HEARTBEAT_INTERVAL', '').strip()
            and self.job_monitoring_interval != DEFAULT_JOB_MONITORING_INTERVAL
        ):
            # RQ's job_monitoring_interval was chosen (e.g. --job-monitoring-interval): it rules.
            chosen = asdict(self.epoch_settings)
            if chosen['shutdown_timeout'] is None:
                chosen['shutdown_timeout'] = UNLIMITED
            self.epoch_settings = EpochSettings.resolve(
                environ={}, **{**chosen, 'heartbeat_interval': self.job_monitoring_interval}
            )
        self.job_monitoring_interval = self.epoch_settings.heartbeat_interval
        self._last_sweep: float | None = None
        #: Jobs whose lease this worker saw a sweep take: their failure is not this worker's to record.
        self._lost_lease_job_ids: set[str] = set()
        #: Jobs this worker handed back to their queue when told to stop: not failed either.
        self._handed_back_job_ids: set[str] = set()
        #: Set by the first stop signal that arrives while a job runs (see :meth:`request_stop`).
        self.stop_request: StopRequest | None = None
        #: True while the main thread waits for the work-horse in RQ's monitor (a stop signal
        #: then shortens the wait, see :meth:`_wake_monitor`).
        self._in_horse_wait = False
        #: The work-horse's exit as this worker reaped it when it stopped it to hand its job
        #: back; given to RQ's monitor by the next :meth:`wait_for_horse`.
        self._reaped: WaitResult | None = None
        #: Reaps the work-horse without losing its exit status to RQ's monitor alarm.
        self._reaper = HorseReaper()
        #: ``time.monotonic()`` of the last lease heartbeat sent while stopping.
        self._last_stopping_beat = float('-inf')
        #: The execution a work-horse runs (set in the work-horse, for Heroku's hand-back).
        self._horse_execution: Execution | None = None
        #: ``fence``: the fence of the job whose preparation this thread is sending (see
        #: :meth:`heartbeat`; a SimpleWorker's lease keeper thread heartbeats meanwhile).
        self._preparing = threading.local()
        self._scheduler_tried_at = float('-inf')
        self._dead_scheduler_pid: int | None = None
        self.last_sweep_report: SweepReport | None = None
        #: Follows the primary after a failover; installed at :meth:`bootstrap`.
        self.primary_watch: PrimaryWatch | None = None
        #: How this worker logs (level, date format, format), as given to :meth:`bootstrap`.
        self.log_settings: tuple[str | None, str, str] | None = None
        #: The epoch this worker last saw, and the outage under way if any.
        self.contact = ServerContact(
            log=self.log,
            name=self.name,
            announced=self._failover_announced,
            on_back=lambda: self._keep_scheduler(force=True),
            on_new_epoch=lambda: scripts.load_all(self.connection),
        )
        #: Confirms grants and outcomes with replicas (``RQ_EPOCH_DURABLE_*``; off by default).
        self.durability = Durability(
            self.epoch_settings.durable_replicas,
            self.epoch_settings.durable_timeout,
            bool(self.epoch_settings.durable_fsync),
            log=self.log,
            name=self.name,
        )
        #: Writes the outcomes of this worker's executions, fenced, through an outage.
        self.outcomes = OutcomeWriter(
            self.connection,
            log=self.log,
            name=self.name,
            max_backoff=float(min(self.max_connection_wait_time, max(1, self.epoch_settings.heartbeat_interval))),
            before_write=self._follow_primary,
            durability=self.durability,
            moved=self._primary_moved,
        )

    # -- start -----------------------------------------------------------------------

    def bootstrap(
        self,
        logging_level: str | None = 'INFO',
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        """Check that the server yields an epoch, load the scripts, then start as RQ does.

        A server that is down, loading, read-only or refusing writes (too few replicas) is
        waited for, up to ``startup_wait`` seconds (see :meth:`wait_for_server`).

        rq-epoch's own log lines (logger ``rq_epoch``: verdicts of the worker's sweeps,
        skipped callbacks) get the same handler and format as RQ's worker lines.

        Raises:
            EpochUnavailableError: INFO is refused or has no valid run_id (nothing is written).
        """
        self.log_settings = (logging_level, date_format, log_format)
        setup_loghandlers(logging_level, date_format, log_format, name='rq.worker')  # as RQ's bootstrap does first
        current = self.wait_for_server()
        self.contact.run_id = current.run_id
        self.primary_watch = self.watch_primary(current.run_id)
        super().bootstrap(logging_level, date_format, log_format)
        setup_loghandlers(logging_level, date_format, log_format, name='rq_epoch')
        s = self.epoch_settings
        self.log.info(
            'Worker %s: rq-epoch on server epoch %s; heartbeat %ss, lease margin %ss, sweep every %ss, '
            'max_stalled %s, restart grace %ss, shutdown timeout %s',
            self.name,
            current.run_id,
            s.heartbeat_interval,
            s.lease_margin,
            s.sweep_interval,
            s.max_stalled,
            s.grace,
            UNLIMITED if s.shutdown_timeout is None else f'{s.shutdown_timeout}s',
        )
        if self.durability.enabled:
            self.log.info(
                'Worker %s: grants and outcomes confirmed by %d replica(s) within %d ms%s',
                self.name,
                s.durable_replicas,
                s.durable_timeout,
                " and on the primary's disk (WAITAOF)" if s.durable_fsync else '',
            )

    def wait_for_server(self) -> ServerEpoch:
        """Read the epoch, load the scripts and check that the server takes writes; wait while it cannot.

        Whether the server takes writes is asked with a ``DEL`` of a key nobody writes
        (:func:`rq_epoch.protocol.keys.startup_probe_key`): a server refuses a write command when it
        is a replica, loading, or a primary short of replicas, before it looks at the key.
        See :func:`wait_while_unavailable` for the wait.

        Raises:
            EpochUnavailableError: INFO is refused or has no valid run_id (not waited for).
            redis.exceptions.ConnectionError: still no server after ``startup_wait`` seconds.
        """

        def ready() -> ServerEpoch:
            current = read_epoch(self.connection)
            scripts.load_all(self.connection)
            self.connection.delete(keys.startup_probe_key())
            return current

        return wait_while_unavailable(ready, limit=self.epoch_settings.startup_wait, log=self.log, name=self.name)

    def watch_primary(self, run_id: str) -> PrimaryWatch:
        """Install the :class:`~rq_epoch.worker.failover.PrimaryWatch` on this worker's connection.

        It asks the sentinels (when the connection comes from ``Sentinel.master_for``, as
        with RQ's ``SENTINEL`` settings) twice per heartbeat interval, and a non-blocking
        command gets one heartbeat interval (at least 2 s) to answer.
        """
        interval = self.epoch_settings.heartbeat_interval
        socket_timeout = self.connection.connection_pool.connection_kwargs.get('socket_timeout')
        command_timeout = float(max(2, interval))
        if socket_timeout is not None:
            command_timeout = min(command_timeout, float(socket_timeout))
        watch = PrimaryWatch(
            self.connection,
            interval=max(0.5, interval / 2),
            command_timeout=command_timeout,
            log=self.log,
            name=self.name,
            on_move=self._after_primary_moved,
        )
        return watch.install(run_id)

    def _after_primary_moved(self) -> None:
        """Load the scripts on the new primary; the idle wait's own connections follow at its next wait."""
        scripts.load_all(self.connection)
        if self._taker is not None:
            self._taker.reconnect()

    def _follow_primary(self) -> None:
        """Before an outcome is written: make sure this process talks to the current primary."""
        if self.primary_watch is not None:
            self.primary_watch.refresh()

    def _primary_moved(self) -> bool:
        """Ask the sentinels now; True when the primary moved (every connection follows it)."""
        return self.primary_watch is not None and self.primary_watch.refresh(max_age=0)

    def _failover_announced(self, run_id: str) -> bool:
        """Whether the primary watch logged the move to the server process ``run_id``."""
        return self.primary_watch is not None and self.primary_watch.announced(run_id)

    def _pubsub_exception_handler(self, exc: Exception, pubsub: PubSub, pubsub_thread: PubSubWorkerThread) -> None:
        """RQ's handler, quiet and quick when the connection was closed to follow a new primary.

        A server that did not answer in time (redis-py's ``TimeoutError``) is ridden out as
        RQ rides out a lost connection. rq-epoch gives a non-blocking command a bounded time to
        answer (:class:`~rq_epoch.worker.failover.PrimaryWatch`), so a late answer, for instance
        in the handshake of the pubsub connection as it connects again, is met here; RQ's
        handler ends the thread on any error but a connection error, and the worker would hear
        no command (shutdown, kill the work-horse, stop the job) again.
        """
        watch = self.primary_watch
        if isinstance(exc, CONNECTION_ERRORS) and watch is not None and watch.moved_recently(10):
            self.log.debug('Worker %s: pubsub reconnecting to the new primary (%s)', self.name, exc)
            time.sleep(0.1)
            return
        if isinstance(exc, redis.exceptions.TimeoutError):
            exc = redis.exceptions.ConnectionError(str(exc))
        super()._pubsub_exception_handler(exc, pubsub, pubsub_thread)

    def subscribe(self) -> None:
        """Start RQ's pubsub thread with SIGALRM blocked in it.

        The work-horse monitor waits in ``wait4`` and relies on SIGALRM to wake up for
        each heartbeat. If the kernel hands that signal to the pubsub thread instead (it
        may, for instance right after the process was stopped and continued), the main
        thread sleeps on and no heartbeat is sent until the horse exits. With the signal
        blocked in the thread, it always reaches the main thread.
        """
        blocked = {signal.SIGALRM}
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        try:
            super().subscribe()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)

    def unsubscribe(self) -> None:
        """Stop the pubsub thread and leave the worker's channel, as RQ does, without waiting a minute.

        RQ's pubsub thread reads with a 60 s timeout. RQ sends UNSUBSCRIBE, then stops the
        thread; since redis-py 8.2 that stop waits for the thread, and when the thread read
        the UNSUBSCRIBE reply before it was told to stop, it waits up to 60 s for a message
        that never comes: a worker told to stop (SIGTERM, a burst's end) took a minute to
        quit. Here the thread is told to stop first, so that the reply ends its read, and the
        wait for it stays RQ's one second.
        """
        thread = self.pubsub_thread
        if not thread:
            return
        self.log.info('Worker %s: unsubscribing from channel %s', self.name, self.pubsub_channel_name)
        if 'timeout' in inspect.signature(thread.stop).parameters:
            thread.stop(timeout=0)  # redis-py 8.2 and later: only clear its running flag
        else:
            thread.stop()
        self.pubsub.unsubscribe()
        thread.join(timeout=1)
        self.pubsub.close()

    def teardown(self) -> None:
        """RQ's teardown; first the watch of the queues is handed on to another idle worker."""
        if not self.is_horse and self._taker is not None:
            self._taker.close()
        super().teardown()

    def monitor_work_horse(self, job: RQJob, queue: RQQueue, *args: Any) -> None:
        """Monitor the work-horse as RQ does, riding out an outage after it exited.

        When the horse died and the server is unreachable at that moment, its failure is
        recorded once the server returns (unless the job already left "started").
        """
        self._reaper = HorseReaper()  # a new work-horse: no exit noted yet (a pid may be reused)
        try:
            super().monitor_work_horse(job, queue, *args)
        except CONNECTION_ERRORS as exc:
            if self.horse_pid:
                raise
            self.contact.lost(exc)
            held = self.holding_ready_dependents(queue)
            kwargs: dict[str, Any] = {
                'queue': held,
                'exc_string': 'Work-horse terminated unexpectedly',
            }
            if args:
                kwargs['execution'] = args[0]
            rq_failure = super().handle_job_failure  # RQ's own: this call is fenced already
            self.write_outcome(job, 'failure', lambda: None if self.outcomes.landed(job) else rq_failure(job, **kwargs))
            self.enqueue_ready_dependents(job, queue, held)

    # -- stopping: a deploy costs the running job nothing -------------------------------

    def setup_work_horse_signals(self) -> None:
        """In the work-horse: ignore SIGTERM and SIGINT; the worker decides what happens to the job.

        A supervisor that stops a worker may send SIGTERM to every process of it at once
        (systemd's default ``KillMode=control-group``, Heroku): the job must not die of it.
        (RQ puts the work-horse in a process group of its own, so a signal to the worker's
        group, supervisor's ``stopasgroup`` or a terminal's Ctrl-C, does not reach it.) The
        worker stops the work-horse itself (SIGKILL) when it hands the job back (see
        :meth:`request_stop`). The signals were blocked across the fork
        (:meth:`fork_work_horse`) and are let through once ignored.
        """
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def fork_work_horse(self, job: RQJob, queue: RQQueue) -> None:
        """Fork the work-horse as RQ does, with SIGTERM and SIGINT blocked across the fork.

        A stop signal sent to every process at that moment then reaches the work-horse only
        once it ignores it, and the worker once the work-horse is running.
        """
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            super().fork_work_horse(job, queue)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def request_stop(self, signum: int, frame: Any) -> None:
        """The first SIGTERM or SIGINT (and RQ's shutdown command): RQ's warm shutdown, bounded.

        An idle worker stops at once, as in RQ. A worker running a job notes the request
        (:attr:`stop_request`); its wait for the work-horse then wakes at once, marks the lease
        stopping on the server, keeps heartbeating, and once ``shutdown_timeout`` seconds have
        passed without the job ending, stops the work-horse and hands the job back to the
        front of its queue, uncounted (:meth:`stop_and_hand_back`), then exits as RQ's warm
        shutdown does. The handler itself writes nothing to the server but RQ's own record.
        """
        if self.stop_request is None and not self.is_horse:
            self.stop_request = StopRequest(time.monotonic(), self.epoch_settings.shutdown_timeout)
        super().request_stop(signum, frame)  # raises StopRequested when idle
        if self.stop_request is not None and rq_adapter.stop_requested(self):  # busy: RQ waits for the job
            timeout = self.stop_request.timeout
            self.log.info(
                'Worker %s: told to stop while a job runs; %s',
                self.name,
                'waiting for it as long as it runs (shutdown timeout unlimited)'
                if timeout is None
                else f'handing it back to its queue unless it ends within {timeout}s',
            )
            self.job_monitoring_interval = 1  # the next look at the job comes soon, woken or not
            self._wake_monitor()

    def request_force_stop(self, signum: int, frame: Any) -> None:
        """A second SIGTERM or SIGINT (RQ's cold shutdown): hand the running job back at once, exit 0.

        As in RQ, a second signal within a second of the first is taken for the same one (a
        terminal's Ctrl-C reaches a worker pool and its workers, and the pool passes it on).
        Without a running job this is RQ's cold shutdown.
        """
        stop = self.stop_request
        if stop is None or not self._job_running():
            super().request_force_stop(signum, frame)
            return
        if time.monotonic() - stop.asked_at < 1:
            self.log.debug('Worker %s: shutdown signal ignored, received twice in less than 1 second', self.name)
            return
        if not stop.cold:
            stop.cold = True
            self.log.warning('Worker %s: cold shut down; handing the running job back now', self.name)
        self._wake_monitor()

    def set_shutdown_requested_date(self) -> None:
        """RQ's record of the stop request (written from the signal handler); rides out an outage."""
        try:
            super().set_shutdown_requested_date()
        except CONNECTION_ERRORS as exc:
            self.contact.lost(exc)

    def _job_running(self) -> bool:
        """Whether a job of this worker runs now (a work-horse is alive)."""
        return bool(self.horse_pid)

    def _wake_monitor(self) -> None:
        """Cut short the monitor's current wait for the work-horse (called from a signal handler).

        RQ's monitor waits in ``wait4`` under a SIGALRM of one heartbeat interval; when this
        thread is in that wait with RQ's alarm armed, the alarm is brought forward to now, so
        the monitor looks at the job (:meth:`maintain_heartbeats`) at once. Anywhere else the
        next look comes within a second (:meth:`request_stop` shortened the interval).
        """
        if self._in_horse_wait:
            rq_adapter.bring_monitor_alarm_forward()

    def wait_for_horse(self) -> WaitResult:
        """Wait for the work-horse as RQ does, without losing its exit status; after a hand-back,
        report the work-horse reaped then.

        RQ's monitor alarm may land just after the work-horse was reaped: the exit is noted
        before the reap (:class:`~rq_epoch.worker.reaping.HorseReaper`), so RQ's next wait still
        learns how it exited, and a job its work-horse handed back or requeued is not failed.
        A work-horse stopped to hand its job back was reaped by :meth:`stop_and_hand_back`; RQ's
        monitor is told it exited normally (status 0), since its job is not failed: it runs
        again elsewhere.
        """
        reaped, self._reaped = self._reaped, None
        if reaped is not None:
            return reaped
        if not self.horse_pid:  # no work-horse: RQ's own wait
            return cast('WaitResult', super().wait_for_horse())
        self._in_horse_wait = True
        try:
            return self._reaper.wait(self.horse_pid)
        finally:
            self._in_horse_wait = False

    def _look_at_stop(self, job: RQJob, execution: Execution) -> bool:
        """While the monitor waits for a job: act on a stop request. True once the job was handed back.

        Marks the lease stopping (once per execution), and when the hand-back is due (the
        shutdown timeout passed, or a cold stop) stops the work-horse and hands the job back.
        Otherwise sets the monitor's next look to when the hand-back becomes due.
        """
        stop = self.stop_request
        if stop is None or self.is_horse:
            return False
        if stop.marked_execution != execution.id:
            self.mark_stopping(job, execution)
        if stop.due():
            self.stop_and_hand_back(job, execution)
            return True
        self.job_monitoring_interval = stop.next_tick(self.epoch_settings.heartbeat_interval)
        return False

    def mark_stopping(self, job: RQJob, execution: Execution, connection: Redis | None = None) -> None:
        """Mark the lease of ``execution`` stopping on the server (see :func:`rq_epoch.worker.stopping.mark_stopping`).

        A connection error is ridden out: the next look tries again. ``connection``: the client
        to send it with (a lease keeper thread has its own).
        """
        stop = self.stop_request
        if stop is None:
            return
        window = self.epoch_settings.stop_window
        try:
            reply = mark_stopping(connection if connection is not None else self.connection, job, execution, window)
        except CONNECTION_ERRORS as exc:
            self.contact.lost(exc)
            return
        stop.marked_execution = execution.id
        if reply.marked:
            self.log.info(
                'Worker %s: marked the lease of job %s stopping (a sweep requeues it uncounted if it runs out '
                'within %ss)',
                self.name,
                job.id,
                window,
            )
        else:
            self.log.warning(
                'Worker %s: could not mark the lease of job %s stopping: it is no longer held', self.name, job.id
            )

    def stop_and_hand_back(self, job: RQJob, execution: Execution) -> None:
        """Stop the work-horse (SIGKILL, reaped), then hand its job back (:meth:`hand_back`).

        RQ's monitor is then told the work-horse exited normally when the job was handed back
        (it is not failed), or how it really exited when the hand-back was refused: its own
        outcome had landed just before (the job finished), or its lease was no longer this
        execution's (then its failure is not recorded either: the fence refuses it).
        """
        self.log.warning(
            'Worker %s: stopping work-horse %s of job %s to hand the job back', self.name, self.horse_pid, job.id
        )
        self.kill_horse()
        pid, status, rusage = self._reaper.wait(self.horse_pid)
        reply = self.hand_back(job, execution)
        if reply is not None and (reply.handed_back or reply.landed_before):
            self._handed_back_job_ids.add(job.id)
            self._reaped = (pid, 0, rusage)
        else:
            if reply is not None and reply.reason != 'gone':
                self._lost_lease_job_ids.add(job.id)
            self._reaped = (pid, status, rusage)

    def hand_back(
        self, job: RQJob, execution: Execution, connection: Redis | None = None
    ) -> verbs.HandBackReply | None:
        """Hand ``job`` back to the front of its queue, uncounted (:func:`rq_epoch.worker.stopping.hand_back`).

        The job must be stopped already. A server outage is ridden out for up to one
        heartbeat interval (at least 2 s); after that the lease, marked stopping, is left to
        the sweep, which requeues it uncounted once it runs out. Returns the script's reply,
        or None when the server could not be reached. One log line says what happened.
        """
        client = connection if connection is not None else self.connection
        give_up = time.monotonic() + max(2.0, float(self.epoch_settings.heartbeat_interval))
        try:
            reply = self.outcomes.with_backoff(lambda: hand_back(client, job, execution), give_up)
        except CONNECTION_ERRORS as exc:
            self.contact.lost(exc)
            self.log.error(
                'Worker %s: could not hand job %s back (%s); its lease, marked stopping, is requeued uncounted '
                'by a sweep once it runs out',
                self.name,
                job.id,
                exc,
            )
            return None
        if reply.handed_back or reply.landed_before:
            self.log.warning('Worker %s: handed job %s back to the front of queue %s', self.name, job.id, job.origin)
        elif reply.reason == 'gone':
            self.log.info('Worker %s: job %s was not handed back: its outcome was written first', self.name, job.id)
        else:
            self.log.warning(
                "Worker %s: job %s was not handed back: its lease is no longer this execution's (%s %s)",
                self.name,
                job.id,
                reply.reason,
                reply.detail,
            )
        return reply

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        """RQ's worker heartbeat; on its own (not in a pipeline) it rides out an outage.

        RQ's preparation of a job (:meth:`prepare_job_execution`) queues this heartbeat
        first in its transaction: that transaction is armed here with the execution's fence.
        """
        if pipeline is not None:
            fence = getattr(self._preparing, 'fence', None)
            if fence is not None:
                arm(pipeline, fence, outcome=False)
            return super().heartbeat(timeout, pipeline=pipeline)
        try:
            super().heartbeat(timeout)
            if not self.contact.reachable:
                self.contact.reached(read_epoch(self.connection).run_id)
            self._keep_scheduler()
        except CONNECTION_ERRORS as exc:
            self.contact.lost(exc)

    def _keep_scheduler(self, force: bool = False) -> None:
        """Start RQ's scheduler process again if it died (``--with-scheduler``, worker pools).

        RQ's scheduler process quits on a connection error, so a server restart ends it; RQ
        itself starts it again only with its maintenance (every ``maintenance_interval``,
        10 minutes by default). This is RQ's own check (``acquire_locks(auto_start=True)``),
        run as soon as the server is back (``force``) and at idle heartbeats (at most once
        per sweep interval), for a scheduler this worker had started. Raises on a
        connection error (the caller rides it out).
        """
        scheduler = self.scheduler
        if scheduler is None or self.is_horse or rq_adapter.stop_requested(self):
            return
        process = rq_adapter.scheduler_process(scheduler)
        if process is None or process.is_alive() or threading.current_thread() is not threading.main_thread():
            return
        if not force and time.monotonic() - self._scheduler_tried_at < self.epoch_settings.sweep_interval:
            return
        self._scheduler_tried_at = time.monotonic()
        if self._dead_scheduler_pid != process.pid:
            self._dead_scheduler_pid = process.pid
            self.log.warning(
                'Worker %s: the scheduler process (pid %s) has exited (exit code %s); starting it again',
                self.name,
                process.pid,
                process.exitcode,
            )
        scheduler.acquire_locks(auto_start=True)

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is not None:
            return super().set_state(state, pipeline=pipeline)
        try:
            super().set_state(state)
        except CONNECTION_ERRORS as exc:
            self.contact.lost(exc)

    def set_current_job_working_time(self, working_time: float, pipeline: Pipeline | None = None) -> None:
        """RQ 2's working-time bookkeeping (called while monitoring); rides out an outage."""
        if pipeline is not None:
            return super().set_current_job_working_time(working_time, pipeline=pipeline)  # type: ignore[misc]
        try:
            super().set_current_job_working_time(working_time)  # type: ignore[misc]
        except CONNECTION_ERRORS as exc:
            self.contact.lost(exc)

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's suspension check; while the server is unreachable, the dequeue loop waits."""
        try:
            super().check_for_suspension(burst)
        except CONNECTION_ERRORS as exc:
            self.contact.lost(exc)

    # -- leases ----------------------------------------------------------------------

    def get_heartbeat_ttl(self, job: RQJob, working_time: float = 0.0) -> int:
        """Seconds the lease lasts past this heartbeat: the interval plus the lease margin
        (see :func:`rq_epoch.worker.heartbeats.lease_ttl`)."""
        return lease_ttl(self.epoch_settings, job, working_time)

    def prepare_execution(self, job: RQJob) -> Execution:
        """Start an execution as RQ does; the grant script rides in RQ's transaction.

        The job object then carries the execution's :class:`~rq_epoch.worker.fence.Fence` (the
        work-horse inherits it), so its callbacks run only while the lease is held. A job
        object of a class without the epoch behaviour is given it first (see
        :func:`rq_epoch.jobs.jobclass.adopt`): every execution this worker starts is leased.
        """
        adopt(job)
        try:
            execution = super().prepare_execution(job)
        except redis.exceptions.NoScriptError:
            # The server restarted since the scripts were loaded; RQ's writes landed,
            # the grant did not. Load the scripts and grant now.
            scripts.load_all(self.connection)
            if self.execution is None:
                raise
            execution = self.execution
            grant_again(self.connection, job, execution, self.get_heartbeat_ttl(job), self.job_class)
        fence = Fence(job.origin, job.id, execution.id)
        cast(EpochJobMixin, job).fence = fence
        if self.durability.enabled:
            self._confirm_grant(job, execution, fence)
        return execution

    def _confirm_grant(self, job: RQJob, execution: Execution, fence: Fence) -> None:
        """Wait until replicas confirm the grant (``RQ_EPOCH_DURABLE_REPLICAS``), before the job
        runs (:func:`rq_epoch.worker.heartbeats.confirm_grant`). A grant lost meanwhile (a failover)
        marks the job so that :meth:`perform_job` does not run it: it waits in its queue on the
        current primary, and runs from there, once."""
        lost = confirm_grant(
            self.durability,
            self.connection,
            fence,
            follow=self._primary_moved,
            heartbeat=lambda: self._heartbeat_lease(job, execution),
            heartbeat_every=float(self.epoch_settings.heartbeat_interval),
            give_up=time.monotonic() + self.outcome_retry_limit,
            log=self.log,
            name=self.name,
        )
        cast(EpochJobMixin, job).grant_lost = lost is not None

    def perform_job(self, job: RQJob, queue: RQQueue, *args: Any, **kwargs: Any) -> bool:
        """Run the job as RQ does (in the work-horse, or in-process), as the execution that holds its lease.

        A job object without the epoch behaviour is given it, and one that does not carry
        its execution's fence yet (a spawned work-horse fetched it anew) is given it.

        RQ's preparation (status "started") is written first, under the fence (see
        :meth:`prepare_job_execution`): a work-horse that starts after a sweep took its
        lease (its worker was frozen, an outage outlasted the lease, a spawned work-horse
        was slow to start) writes nothing and does not run the job, which another worker
        has by then. RQ's own call of the preparation then finds it done.
        """
        leased = cast(EpochJobMixin, adopt(job))
        if leased.grant_lost:
            self.log.info(
                'Worker %s: job %s not run: its grant was lost before a replica confirmed it', self.name, job.id
            )
            return False
        execution = kwargs.get('execution') or (args[0] if args else None) or self.execution
        if leased.fence is None and execution is not None and execution.job_id == job.id:
            leased.fence = Fence(job.origin, job.id, execution.id)
        leased.ride_out = lambda call: self.ride_out_before_function(job, call)
        # Durable: on_success / on_failure run once the outcome is confirmed (see run_deferred_callback).
        leased.defer_callbacks = self.durability.enabled
        leased.deferred_callback = None
        self._horse_execution = execution
        if leased.fence is not None:
            try:
                self.prepare_job_execution(job, len(self.queues) == 1)
            except OutcomeRefused as refusal:
                self.log.info(
                    'Worker %s: job %s not run, its preparation refused: %s',
                    self.name,
                    job.id,
                    refusal.describe(),
                )
                return False
            except Exception:  # noqa: BLE001 - RQ's own call meets it again, and fails the job as RQ does
                pass  # (the server stayed away; RQ's step after the transaction could not read the job)
            else:
                leased.prepared = True
        return bool(super().perform_job(job, queue, *args, **kwargs))

    def ride_out_before_function(self, job: RQJob, call: Callable[[], _T]) -> _T:
        """Run ``call`` (the job's ``perform``), again after a server outage in RQ's step before the function.

        The job has not run yet, as in :meth:`prepare_job_execution`: a connection error there
        must not fail it (see :meth:`rq_epoch.Job.perform` for which errors are the job's).
        Attempts go on with backoff for up to :attr:`outcome_retry_limit` seconds, while the
        worker keeps heartbeating (and stops this work-horse if a sweep takes the lease). The
        job's timeout keeps running meanwhile.
        """
        give_up = time.monotonic() + self.outcome_retry_limit

        def unreachable(exc: Exception, attempt: int) -> None:
            if attempt == 0:
                self.log.warning(
                    'Worker %s: server unreachable before job %s started (%s); retrying', self.name, job.id, exc
                )

        return self.outcomes.with_backoff(call, give_up, unreachable)

    def prepare_job_execution(self, job: RQJob, *args: Any, **kwargs: Any) -> None:
        """RQ's preparation in the work-horse (status "started"), fenced, riding out a server outage.

        For a job that carries its execution's fence, RQ's transaction lands only while the
        execution holds the lease, in one atomic step (the commit script, see
        :func:`rq_epoch.worker.fence.arm`); otherwise nothing is written and
        :class:`~rq_epoch.errors.OutcomeRefused` is raised. Without that, a work-horse that
        started late would mark "started" a job that another execution has finished since.

        The job has not run yet: a connection error here must not fail it. RQ's writes are
        one transaction and idempotent, so they are tried again with backoff; meanwhile
        the worker keeps heartbeating and stops this horse if a sweep takes the lease.
        """
        leased = job if isinstance(job, EpochJobMixin) else None
        if leased is not None and leased.prepared:
            leased.prepared = False  # written by perform_job before RQ's call
            return
        give_up = time.monotonic() + self.outcome_retry_limit
        rq_prepare = super().prepare_job_execution
        self._preparing.fence = leased.fence if leased is not None else None
        try:
            self.outcomes.with_backoff(lambda: rq_prepare(job, *args, **kwargs), give_up)
        finally:
            self._preparing.fence = None

    def maintain_heartbeats(self, job: RQJob, execution: Execution | None = None) -> None:
        """Heartbeat the worker, the execution and the job, and extend the stamped lease.

        One round trip, as RQ's own heartbeat. A server outage is ridden out: attempts are
        retried with exponential backoff for up to one heartbeat interval, then the
        work-horse is checked again and the next heartbeat goes on trying. A lease that a
        sweep has taken is not brought back: the work-horse is stopped, since the job has
        been handed on.
        """
        execution = execution if execution is not None else self.execution
        if execution is None:
            return
        adopt(job)
        if self.stop_request is not None:
            if self._look_at_stop(job, execution):
                return  # the job was handed back (or left to the sweep): its lease is not ours to keep
            if time.monotonic() - self._last_stopping_beat < self.epoch_settings.heartbeat_interval:
                return  # looking more often while stopping; heartbeating as often as before
            self._last_stopping_beat = time.monotonic()
        deadline = time.monotonic() + self.epoch_settings.heartbeat_interval
        try:
            reply = self.outcomes.with_backoff(
                lambda: self._heartbeat_lease(job, execution), deadline, lambda exc, _: self.contact.lost(exc)
            )
        except CONNECTION_ERRORS:
            return  # the next heartbeat goes on trying
        self.contact.reached(reply.run_id)
        if not reply.extended and reply.taken == HANDED_BACK:
            pass  # the work-horse handed its job back itself (HerokuWorker) and is exiting
        elif not reply.extended and reply.taken:
            # A sweep took this execution's lease (its record names this execution). A
            # lease that is gone without such a record was ended by the work-horse's own
            # commit, which may still be running RQ's steps that follow it.
            self._lease_lost(job, reply.taken)
        self._sweep_if_due()

    def _heartbeat_lease(self, job: RQJob, execution: Execution, connection: Redis | None = None) -> verbs.ExtendReply:
        """One heartbeat round trip (:func:`rq_epoch.worker.heartbeats.heartbeat_round_trip`).

        ``connection``: the client to send it with (a lease keeper thread has its own).
        """
        if compat.HEARTBEAT_TTL_TAKES_WORKING_TIME:  # RQ 3 passes the working time, measured from the job's start
            working_time = (now() - job.started_at).total_seconds() if job.started_at else 0.0
            ttl = int(self.get_heartbeat_ttl(job, working_time=working_time))
        else:
            ttl = int(self.get_heartbeat_ttl(job))
        return heartbeat_round_trip(
            self, job, execution, ttl, connection if connection is not None else self.connection
        )

    def _lease_lost(self, job: RQJob, verdict: str) -> None:
        self._lost_lease_job_ids.add(job.id)
        self.log.warning(
            'Worker %s: a sweep took the lease of job %s (verdict %s) while this worker could not '
            'heartbeat; stopping its work-horse',
            self.name,
            job.id,
            verdict,
        )
        self.kill_horse()

    # -- outcomes --------------------------------------------------------------------

    def cleanup_execution(self, job: RQJob, pipeline: Pipeline, *args: Any, **kwargs: Any) -> None:
        """Remove the execution as RQ does, and fence the outcome transaction it is part of.

        Every outcome path of RQ (success, failure, retry, stop, a dead work-horse) calls
        this with the pipeline that carries the outcome. The pipeline is armed with this
        execution's fence: its commit lands only while the execution holds the lease.
        """
        execution = kwargs.get('execution') or (args[0] if args else None) or self.execution
        if execution is None:
            # RQ's loop is building the same transaction again after a WatchError; RQ 2 let
            # go of the execution the first time round. The pipeline remembers it.
            execution = redis_py.noted(pipeline, 'execution')
            if execution is not None and execution.job_id == job.id:
                if compat.CLEANUP_TAKES_EXECUTION:
                    kwargs['execution'] = execution
                else:
                    self.execution = execution
        super().cleanup_execution(job, pipeline, *args, **kwargs)
        if execution is not None and execution.job_id == job.id:
            redis_py.note(pipeline, 'execution', execution)
            arm(pipeline, Fence(job.origin, job.id, execution.id))

    def handle_job_failure(self, job: RQJob, queue: RQQueue, *args: Any, **kwargs: Any) -> None:
        """Fail (or retry, or stop) a job as RQ does, fenced; rides out a server outage.

        A job whose lease this worker saw a sweep take is not failed at all: it is not ours.
        """
        if job.id in self._lost_lease_job_ids:
            self._lost_lease_job_ids.discard(job.id)
            self.log.info('Worker %s: not failing job %s, whose lease a sweep took', self.name, job.id)
            return
        if job.id in self._handed_back_job_ids:
            self._handed_back_job_ids.discard(job.id)
            self.log.info('Worker %s: not failing job %s, handed back to its queue', self.name, job.id)
            return
        rq_failure = super().handle_job_failure
        held = self.holding_ready_dependents(queue)
        self.write_outcome(job, 'failure', lambda: rq_failure(job, held, *args, **kwargs))
        self.enqueue_ready_dependents(job, queue, held)
        self.run_deferred_callback(job)

    def handle_job_success(self, job: RQJob, queue: RQQueue, *args: Any, **kwargs: Any) -> None:
        """Record a success as RQ does, fenced; rides out a server outage."""
        rq_success = super().handle_job_success
        held = self.holding_ready_dependents(queue)
        self.write_outcome(job, 'success', lambda: rq_success(job, held, *args, **kwargs))
        self.enqueue_ready_dependents(job, queue, held)
        self.run_deferred_callback(job)

    def holding_ready_dependents(self, queue: RQQueue) -> RQQueue:
        """The queue to hand RQ's outcome handlers: with ``RQ_EPOCH_DURABLE_REPLICAS`` on RQ 3, a
        copy of ``queue`` that holds back their push of the dependents the outcome made ready
        (:class:`rq_epoch.jobs.queue.HoldsReadyDependents`); otherwise ``queue`` itself.

        RQ 3 pushes them onto their queues right after the outcome's transaction, before its
        confirmation; :meth:`enqueue_ready_dependents` pushes them once it is confirmed. On RQ 2
        the dependents are enqueued by the outcome's transaction itself: a durable worker's
        grant of one is confirmed only once a replica has everything written before it, the
        parent's outcome included.
        """
        if not self.durability.enabled or compat.READY_TO_ENQUEUE is None:
            return queue
        return cast('RQQueue', holding_ready_dependents(queue))

    def enqueue_ready_dependents(self, job: RQJob, queue: RQQueue, held: RQQueue) -> None:
        """Push onto their queues the dependents of ``job`` that ``held`` (see
        :meth:`holding_ready_dependents`) kept back, now that the outcome that made them ready is
        written and confirmed (RQ 3's ``Queue.enqueue_ready_jobs_by_queue``, which logs a queue it
        could not push to and leaves its dependents to RQ's ``ReadyJobRegistry`` cleanup).

        Not at all when the fence refused the outcome: the dependents it moved to their
        ReadyJobRegistry (on a primary since replaced) are not this execution's to push. Override
        it to push them elsewhere or later; a dependent left in its ReadyJobRegistry is pushed by
        the cleanup of that registry in RQ's maintenance.
        """
        ready = held.held_ready if isinstance(held, HoldsReadyDependents) else {}
        if not ready:
            return
        if isinstance(job, EpochJobMixin) and job.outcome_refused:
            self.log.info(
                'Worker %s: not enqueueing the dependents of job %s: its outcome was refused', self.name, job.id
            )
            return
        queue.enqueue_ready_jobs_by_queue(ready)  # type: ignore[attr-defined]  # RQ 3 (RQ 2 holds nothing)

    def run_deferred_callback(self, job: RQJob) -> None:
        """Run the job's ``on_success`` / ``on_failure`` callback that durable mode kept back
        (see :attr:`rq_epoch.EpochJobMixin.defer_callbacks`), now that its outcome is written and
        confirmed; once, and not at all if the fence refused the outcome.

        RQ runs a callback before it writes the outcome; kept back, it runs after: an error it
        raises is logged and no longer changes the outcome. It runs under the callback's timeout.
        """
        if not isinstance(job, EpochJobMixin) or job.deferred_callback is None:
            return
        (name, callback), job.deferred_callback = job.deferred_callback, None
        if job.outcome_refused:
            self.log.info(
                'Worker %s: not running the %s callback of job %s: its outcome was refused', self.name, name, job.id
            )
            return
        timeout = job.success_callback_timeout if name == 'on_success' else job.failure_callback_timeout
        try:
            with self.death_penalty_class(timeout, JobTimeoutException, job_id=job.id):
                callback()
        except Exception:
            self.log.exception('Worker %s: the %s callback of job %s raised', self.name, name, job.id)

    def handle_job_retry(self, job: RQJob, queue: RQQueue, *args: Any, **kwargs: Any) -> None:
        """Requeue a job that returned :class:`rq.Retry` as RQ does, fenced; rides out an outage.

        Past its ``Retry.max`` RQ fails it instead, and enqueues its dependents as a failure does."""
        rq_retry = super().handle_job_retry
        held = self.holding_ready_dependents(queue)
        self.write_outcome(job, 'retry', lambda: rq_retry(job, held, *args, **kwargs))
        self.enqueue_ready_dependents(job, queue, held)

    def handle_execution_ended(self, job: RQJob, queue: RQQueue, heartbeat_ttl: int) -> None:
        """End the execution as RQ does, fenced; rides out a server outage."""
        rq_end = super().handle_execution_ended
        # Not confirmed on its own: the outcome that follows it is, and covers it.
        self.write_outcome(job, 'end', lambda: rq_end(job, queue, heartbeat_ttl), confirm=False)

    def write_outcome(self, job: RQJob, what: str, write: Callable[[], object], confirm: bool = True) -> None:
        """Run ``write`` (RQ's recording of a job's outcome) through :attr:`outcomes`: fenced,
        riding out a server outage for up to :attr:`outcome_retry_limit` seconds, and (with
        ``RQ_EPOCH_DURABLE_REPLICAS``, unless ``confirm`` is False) confirmed by replicas or
        written again on a new primary; a refusal is reported with :meth:`outcome_refused`."""
        execution = rq_adapter.running_execution(self)

        def attempt() -> object:
            # Sent again (after an outage, or on a new primary): RQ 2's first attempt let go of
            # the execution (its cleanup_execution clears worker.execution), which the fence and
            # the result name. RQ 3's handlers are given it.
            if (
                not compat.CLEANUP_TAKES_EXECUTION
                and execution is not None
                and execution.job_id == job.id
                and self.execution is None
            ):
                self.execution = execution
            return write()

        refusal = self.outcomes.write(job, what, attempt, time.monotonic() + self.outcome_retry_limit, confirm=confirm)
        if refusal is not None:
            self.outcome_refused(job, what, refusal)

    def outcome_refused(self, job: RQJob, what: str, refusal: OutcomeRefused) -> None:
        """Report an outcome the fence refused: one WARNING line (the server counted it).

        Override it to report elsewhere.
        """
        if isinstance(job, EpochJobMixin):
            job.outcome_refused = True
        self.log.warning(
            'Worker %s: refused the %s of job %s from execution %s: %s',
            self.name,
            what,
            job.id,
            refusal.execution_id,
            refusal.describe(),
        )

    # -- taking ----------------------------------------------------------------------

    #: Takes jobs from the queues and waits for the next one (see :mod:`rq_epoch.worker.take`).
    taker_class: type[Taker] = Taker
    _taker: Taker | None = None

    @property
    def taker(self) -> Taker:
        """This worker's :class:`~rq_epoch.worker.take.Taker` (made at the first dequeue)."""
        if self._taker is None:
            interval = self.epoch_settings.sweep_interval
            # The watch outlives a killed watcher by at most half an interval, and a waiter's
            # BLPOP lasts the other half: a job enqueued then starts within one interval.
            self._taker = self.taker_class(
                self.connection, log=self.log, name=self.name, watch_ttl=interval / 2, sweep_interval=interval
            )
        return self._taker

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[RQJob, RQQueue] | None:
        """RQ's dequeue loop, taking each job with rq-epoch's take instead of RQ's ``BLPOP``.

        A worker on several queues takes a job, in its dequeue order, into that queue's
        intermediate list in one atomic step, so a job is never off every list without a
        lease; it waits for the next job with client tracking, not by polling. On one
        queue, RQ's own ``BLMOVE`` into the intermediate list does the same. Everything
        else (heartbeats, maintenance, idle timeout, queue reordering) is RQ's loop.
        """
        queue_class = self.queue_class
        self.queue_class = self.taker.stand_in(queue_class)
        try:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        finally:
            self.queue_class = queue_class

    # -- sweeping --------------------------------------------------------------------

    @property
    def should_run_maintenance_tasks(self) -> bool:
        return bool(super().should_run_maintenance_tasks) or self._sweep_due()

    def _sweep_due(self) -> bool:
        """Whether this worker asks for its queues' sweep tickets now: one sweep interval after
        its last ask when it won a ticket then, or while it watches an idle fleet's queues
        (it sweeps for the fleet); else at its turn (see
        :meth:`rq_epoch.worker.take.Taker.ticket_turn`: one worker of its queues per interval,
        however many), or two intervals after its last ask when it has no turn, so that idle
        workers and a busy fleet's workers between jobs do not all ask every interval."""
        if self._last_sweep is None:
            return True
        interval = self.epoch_settings.sweep_interval
        taker = self._taker
        if taker is not None and not taker.sweeping and not taker.watching:
            if taker.ticket_turn_at is not None:
                return time.monotonic() >= taker.ticket_turn_at
            interval *= 2
        return time.monotonic() - self._last_sweep >= interval

    def run_maintenance_tasks(self) -> None:
        """RQ's maintenance when it is due (with the sweep in place of its cleanup), else the sweep."""
        try:
            if super().should_run_maintenance_tasks:
                super().run_maintenance_tasks()
            else:
                self._sweep_if_due()
        except CONNECTION_ERRORS as exc:
            self.contact.lost(exc)

    def clean_registries(self) -> None:
        """RQ's registry maintenance, with the epoch-aware sweep for started jobs.

        Where it deliberately differs from RQ's ``Worker.clean_registries`` (and
        ``rq.registry.clean_registries``):

        * RQ's ``StartedJobRegistry.cleanup`` is not called: it would fail every expired
          execution as abandoned. :meth:`sweep` judges them instead, over all this worker's
          queues, outside the maintenance lock (each lease gets exactly one verdict however
          many sweeps run).
        * RQ's ``IntermediateQueue.cleanup`` is not called: it fails a job left in the
          intermediate list for a minute by the worker's clock. The sweep script rescues such
          jobs by the server's clock after one lease length, requeueing them.
        * The other registries (finished, failed, deferred, RQ 3's ready and rate-limit
          ones, see :data:`rq_epoch.compat.MAINTAINED_REGISTRIES`) and the worker registry
          are cleaned as RQ does, under RQ's per-queue maintenance lock.
        """
        for queue in self.queues:
            if queue.acquire_maintenance_lock():
                self.log.info('Worker %s: cleaning registries for queue: %s', self.name, queue.name)
                for registry_class in compat.MAINTAINED_REGISTRIES:
                    registry_class(
                        queue.name, connection=self.connection, job_class=self.job_class, serializer=self.serializer
                    ).cleanup()
                if compat.RateLimitRegistry is not None:
                    for rate_limit_registry in compat.RateLimitRegistry.all(self.connection):
                        rate_limit_registry.cleanup()
                clean_worker_registry(queue)
                queue.release_maintenance_lock()
        self.last_cleaned_at = now()  # type: ignore[assignment]
        self.sweep()

    def _sweep_if_due(self) -> None:
        if self._sweep_due():
            self.sweep()

    #: The sweep this worker runs on the queues whose ticket it wins (see :attr:`sweeper`).
    sweeper_class: type[Sweeper] = Sweeper
    _sweeper: Sweeper | None = None

    @property
    def sweeper(self) -> Sweeper:
        """This worker's :class:`~rq_epoch.sweep.Sweeper` (made at the first sweep it wins, and
        kept: it checks the server's version once, not at every sweep)."""
        if self._sweeper is None:
            self._sweeper = self.sweeper_class(
                self.connection,
                settings=self.epoch_settings,
                job_class=self.job_class,
                serializer=self.serializer,
                exception_handlers=rq_adapter.exception_handlers(self),
                death_penalty_class=self.death_penalty_class,
            )
        return self._sweeper

    def sweep(self) -> SweepReport | None:
        """Run the epoch-aware sweep over the queues of this worker whose ticket it wins; never raises.

        The ticket (:mod:`rq_epoch.worker.tickets`) goes to the first worker that asks for a queue
        once an interval has passed since its last one, so the fleet sweeps each queue about
        once per sweep interval. Returns None when no queue was won (or nothing could be done).
        """
        self._last_sweep = time.monotonic()
        try:
            taker = self.taker
            # A worker that wins nothing is given its turn to ask again, one sweep interval
            # after the last turn given to a worker of its queues (the sweeper that died is
            # replaced within about two intervals). The watcher of an idle fleet asks every
            # interval and takes no turn: it sweeps for the idle workers.
            interval = self.epoch_settings.sweep_interval
            turn = None if taker.watching else (interval, taker.ticket_turn_ms)
            tickets = take_tickets(self.connection, self.queue_names(), interval, turn=turn)
            taker.ticket_turn(tickets)
            if not tickets.granted:
                return None
            report = self.sweeper.sweep(tickets.granted)
        except CONNECTION_ERRORS as exc:
            self.log.warning('Worker %s: sweep skipped, server unreachable: %s', self.name, exc)
            return None
        except RqEpochError as exc:
            self.log.error('Worker %s: sweep skipped: %s', self.name, exc)
            return None
        except Exception:
            self.log.exception('Worker %s: sweep failed', self.name)
            return None
        self.last_sweep_report = report
        if report.total:
            counts = {k: v for k, v in report.counts().items() if v}
            self.log.info('Worker %s: sweep judged %d expired lease(s): %s', self.name, report.total, counts)
        return report
