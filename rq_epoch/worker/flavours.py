"""RQ's other worker flavours with the epoch behaviour: no fork, spawn instead of fork, Heroku.

``rq worker --worker-class rq_epoch.SimpleWorker`` runs each job in the worker process (as
``rq.SimpleWorker`` does: tests, platforms without ``fork``, django-rq's test mode). The
worker process is busy with the job, so a *lease keeper* thread, with a connection of its
own, heartbeats the worker, the execution and the lease (re-stamping it) while the job
runs, and rides out a server outage as the forking worker's monitor does.

A lease lost while the job runs (the process froze for longer than the lease, a sweep took
the lease and the job was handed on) is handled as in the forking worker, except for one
thing: a job running in-process cannot be stopped from the outside, so it runs to its end,
and then the fence refuses its outcome (nothing of it is written; the worker logs one
warning and the server counts it). The keeper logs a warning as soon as it learns of it.

Told to stop while a job runs (see :mod:`rq_epoch.worker.stopping`), the keeper marks the lease
stopping; the job cannot be stopped on its own, so once the shutdown timeout has passed (or at a
second signal) the keeper hands the job back and ends the process, exit status 0, with the job
in it: what a supervisor's SIGKILL would do a little later, but with the job back at the front
of its queue, uncounted. With ``unlimited`` the worker waits for the job, as RQ's does.

``rq worker --worker-class rq_epoch.SpawnWorker`` starts each work-horse with
``posix_spawn`` instead of ``fork`` (RQ's ``SpawnWorker``). The work-horse is a new process
that reads the worker and the job from the server before the job starts;
rq-epoch starts it its own way on both RQ versions, so that it rebuilds rq-epoch's worker
class (RQ 2's rebuilt a stock ``rq.Worker``), connects through the sentinels when the worker
does (RQ's passes the connection's settings as text, which a Sentinel pool does not survive),
and rides out a server outage in those reads instead of dying and failing the job.

``rq worker --worker-class rq_epoch.HerokuWorker`` is RQ's ``HerokuWorker`` (a warm shutdown
raises ``ShutDownImminentException`` in the running job after a delay) with the epoch behaviour.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, cast

from redis import ConnectionPool, Redis
from redis.sentinel import Sentinel
from rq.connections import get_connection_kwargs
from rq.exceptions import ShutDownImminentException
from rq.logutils import setup_loghandlers
from rq.worker import BaseWorker
from rq.worker import HerokuWorker as RQHerokuWorker
from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import SpawnWorker as RQSpawnWorker

from ..adapters import redis_py
from ..adapters import rq as rq_adapter
from ..errors import CONNECTION_ERRORS, ConfigurationError, RqEpochError
from ..protocol.durable import Durability
from ..protocol.server import read_epoch
from .failover import _WatchedConnection, is_sentinel_managed
from .outcomes import with_backoff
from .worker import STOP_SIGNALS, Worker

if TYPE_CHECKING:
    from rq.executions import Execution

__all__ = ['HerokuWorker', 'LeaseKeeper', 'SimpleWorker', 'SpawnWorker', 'connection_spec', 'rebuild_connection']


class LeaseKeeper(threading.Thread):
    """Keeps the lease of a job that runs in the worker process, from a thread of its own.

    Every heartbeat interval it sends the worker's heartbeat round trip (worker, execution,
    job, lease extended and re-stamped) on its own connection. A server outage is ridden
    out: attempts are retried with backoff until the server is back. It stops when told to
    (the job ended), or when the lease is gone (its own commit removed it, or a sweep took
    it: then it logs a warning, since the job cannot be stopped in-process).
    """

    def __init__(self, worker: SimpleWorker, job: Any, execution: Execution) -> None:
        super().__init__(name=f'rq-epoch-lease-keeper-{job.id}', daemon=True)
        self.worker = worker
        self.job = job
        self.execution = execution
        self.stopped = threading.Event()
        #: Verdict of the sweep that took the lease, once the keeper learned of one.
        self.taken: str | None = None
        pool = worker.connection.connection_pool
        self.connection = type(worker.connection)(connection_pool=pool, single_connection_client=True)

    #: Seconds between two looks at whether the worker was told to stop.
    tick = 0.2

    def run(self) -> None:
        interval = self.worker.epoch_settings.heartbeat_interval
        next_beat = time.monotonic() + interval
        try:
            while not self.stopped.wait(self.tick):
                if self.worker.stop_request is not None and self._look_at_stop():
                    return
                if time.monotonic() >= next_beat:
                    if not self._beat():
                        return
                    next_beat = time.monotonic() + interval
        finally:
            self.connection.close()

    def _look_at_stop(self) -> bool:
        """The worker was told to stop: mark the lease stopping; once the hand-back is due, hand
        the job back and end the process (exit status 0). True when there is nothing left to keep.

        The job runs in this process and cannot be stopped on its own: past the shutdown
        timeout, or at a cold stop, the process ends with it, as a supervisor's SIGKILL would
        end it, but with the job back at the front of its queue, uncounted.
        """
        worker, stop = self.worker, self.worker.stop_request
        if stop is None:
            return False
        if stop.marked_execution != self.execution.id:
            worker.mark_stopping(self.job, self.execution, self.connection)
        if not stop.due():
            return False
        reply = worker.hand_back(self.job, self.execution, self.connection)
        if reply is not None and reply.reason == 'gone' and not reply.landed_before:
            return True  # the job's outcome was written first: the worker stops once it returns
        worker.log.warning('Worker %s: the job ran in this process, which ends now (exit status 0)', worker.name)
        worker.exit_now()
        return True

    def _beat(self) -> bool:
        """One heartbeat, retried through an outage; False once the lease is gone."""
        delay = 0.1
        while not self.stopped.is_set():
            try:
                reply = self.worker._heartbeat_lease(self.job, self.execution, self.connection)
            except CONNECTION_ERRORS as exc:
                self.worker.contact.lost(exc)
                self.stopped.wait(delay)
                delay = min(delay * 2, self.worker.outcomes.max_backoff)
                continue
            except Exception:  # noqa: BLE001 - the keeper must not die silently
                self.worker.log.exception('Worker %s: lease heartbeat of job %s failed', self.worker.name, self.job.id)
                self.stopped.wait(delay)
                delay = min(delay * 2, self.worker.outcomes.max_backoff)
                continue
            self.worker.contact.reached(reply.run_id)
            if reply.extended:
                return True
            if reply.taken:
                self.taken = reply.taken
                self.worker.log.warning(
                    'Worker %s: a sweep took the lease of job %s (verdict %s) while this worker could not '
                    'heartbeat; the job runs in this process and cannot be stopped: its outcome will be refused',
                    self.worker.name,
                    self.job.id,
                    reply.taken,
                )
            return False
        return False

    def stop(self) -> None:
        """Stop heartbeating and wait for the thread to end."""
        self.stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()


def _without_signals(start: Any) -> None:
    """Start a thread with every signal blocked in it, so they reach the job's (main) thread.

    RQ's job timeout is a SIGALRM in the worker process; delivered to another thread, it
    would not interrupt a job blocked in a system call.
    """
    blocked = signal.valid_signals()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class SimpleWorker(Worker, RQSimpleWorker):
    """RQ's SimpleWorker (the job runs in the worker process) with the epoch behaviour.

    Everything :class:`rq_epoch.Worker` does, with a :class:`LeaseKeeper` thread keeping the
    lease while a job runs. The worker's own sweep runs between jobs (a running job keeps
    the process busy); other workers and ``rq-epoch sweep`` sweep meanwhile.
    """

    # RQ's SimpleWorker behaviour, where rq_epoch.Worker's forking parent would otherwise win.
    execute_job = RQSimpleWorker.execute_job
    kill_horse = BaseWorker.kill_horse
    wait_for_horse = BaseWorker.wait_for_horse

    _keeper: LeaseKeeper | None = None

    def perform_job(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> bool:
        """Run the job in this process while a lease keeper thread keeps its lease."""
        execution = kwargs.get('execution') or (args[0] if args else None) or self.execution
        keeper = LeaseKeeper(self, job, execution) if execution is not None and execution.job_id == job.id else None
        if keeper is not None:
            _without_signals(keeper.start)
        self._keeper = keeper
        try:
            return super().perform_job(job, queue, *args, **kwargs)
        finally:
            self._keeper = None
            if keeper is not None:
                keeper.stop()

    def _job_running(self) -> bool:
        """Whether a job runs in this process now (its lease keeper is alive)."""
        keeper = self._keeper
        return keeper is not None and keeper.is_alive()

    def exit_now(self) -> None:
        """End this process at once with exit status 0, after its job was handed back.

        Called from the lease keeper thread while the job runs in the main thread, where
        nothing can stop it: the worker's registration is removed as RQ's teardown does, the
        logs are flushed, and the process ends.
        """
        try:
            self.register_death()
        except Exception:  # noqa: BLE001 - the process ends either way; the registration expires
            self.log.warning('Worker %s: could not remove its registration before exiting', self.name)
        logging.shutdown()
        os._exit(0)


class SpawnWorker(Worker, RQSpawnWorker):
    """RQ's SpawnWorker (work-horses started with ``posix_spawn``) with the epoch behaviour.

    rq-epoch starts the work-horse itself, on RQ 2 and RQ 3 (:func:`_spawned_horse`), so
    that a spawn costs a job no more than a fork does:

    * the work-horse connects as the worker does: through the sentinels to the current
      primary for a Sentinel-managed connection, and with the worker's connection class
      otherwise (TLS, a Unix socket), see :func:`connection_spec`;
    * the worker and the job it reads before the job starts are read again after a server
      outage (a restart, a failover), with backoff for up to :attr:`outcome_retry_limit`
      seconds, as a forked work-horse's preparation is: the job has not started, so an
      outage there must not fail it;
    * the execution is the one the worker made, passed on, not read back from the server:
      its record may have expired while the worker was frozen, and the execution may still
      hold its lease when the worker thaws.
    """

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """Check that the work-horse can be given this worker's connection, then start as RQ does."""
        try:
            pickle.dumps(connection_spec(self.connection))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ConfigurationError(
                f'SpawnWorker cannot pass its connection settings to a work-horse process: {exc}'
            ) from exc
        super().bootstrap(*args, **kwargs)

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        """Spawn a work-horse that rebuilds this worker, then runs the job as RQ does."""
        if self.execution is None:
            raise RqEpochError(f'SpawnWorker {self.name}: no execution prepared for job {job.id}')
        os.environ['RQ_WORKER_ID'] = self.name
        os.environ['RQ_JOB_ID'] = job.id
        os.environ['RQ_EXECUTION_ID'] = self.execution.id
        payload = pickle.dumps(
            {
                'worker_class': type(self),
                'worker_key': self.key,
                'worker_name': self.name,
                'logging': self.log_settings,
                'connection': connection_spec(self.connection),
                'job_class': self.job_class,
                'queue_class': self.queue_class,
                'serializer': rq_adapter.serializer_argument(self),
                'job_id': job.id,
                # A grant lost before a replica confirmed it (prepare_execution, in this process):
                # the work-horse does not run the job, as a forked one does not.
                'grant_lost': bool(getattr(job, 'grant_lost', False)),
                'durability': (self.durability.replicas, self.durability.timeout_ms, self.durability.fsync),
                'queue_name': queue.name,
                'execution': {
                    'id': self.execution.id,
                    'worker_name': self.execution.worker_name,
                    'created_at': self.execution.created_at,
                    'last_heartbeat': self.execution.last_heartbeat,
                },
                'max_backoff': self.outcomes.max_backoff,
                'exception_handlers': rq_adapter.exception_handlers(self),
                'attributes': {
                    'death_penalty_class': self.death_penalty_class,
                    'default_result_ttl': self.default_result_ttl,
                    'job_monitoring_interval': self.job_monitoring_interval,
                    'log_job_description': self.log_job_description,
                    'log_result_lifespan': self.log_result_lifespan,
                    'disable_default_exception_handler': self.disable_default_exception_handler,
                },
            }
        )
        argv = [sys.executable, '-c', 'from rq_epoch.worker.flavours import _spawned_horse; _spawned_horse()']
        environ = {**os.environ, 'RQ_EPOCH_SPAWN_PAYLOAD': payload.hex(), 'PYTHONPATH': os.pathsep.join(sys.path)}
        # SIGTERM and SIGINT blocked from the start: the work-horse ignores them once it runs
        # Python (_spawned_horse), and a stop signal sent meanwhile must not end it.
        pid = os.posix_spawn(sys.executable, argv, environ, setpgroup=0, setsigmask=STOP_SIGNALS)
        rq_adapter.set_horse_pid(self, pid)
        self.procline(f'Spawned {pid} at {time.time()}')


class HerokuWorker(Worker, RQHerokuWorker):
    """RQ's HerokuWorker (a warm shutdown warns the running job) with the epoch behaviour.

    On SIGTERM the work-horse is sent SIGRTMIN and, :attr:`imminent_shutdown_delay`
    seconds later, the job gets ``rq.exceptions.ShutDownImminentException``, as with RQ's
    class: the job may catch it to clean up. If it lets it through, the job is not failed:
    the work-horse hands it back to the front of its queue, uncounted, and exits (status 0),
    and the worker stops as RQ's warm shutdown does. The worker's own shutdown timeout
    still applies (whichever comes first hands the job back). The work-horse ignores SIGTERM
    and SIGINT, as with RQ's class (Heroku sends SIGTERM to every process of a dyno).
    """

    def setup_work_horse_signals(self) -> None:
        """RQ's HerokuWorker signals in the work-horse (SIGRTMIN warns the job; SIGTERM and SIGINT
        are ignored), let through once set (they were blocked across the fork)."""
        RQHerokuWorker.setup_work_horse_signals(self)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def ride_out_before_function(self, job: Any, call: Any) -> Any:
        """Run the job; a ``ShutDownImminentException`` it lets through hands it back instead of failing it."""
        try:
            return super().ride_out_before_function(job, call)
        except ShutDownImminentException:
            execution = self._horse_execution
            if not self.is_horse or execution is None:
                raise
            reply = self.hand_back(job, execution)
            if reply is None or not (reply.handed_back or reply.landed_before):
                raise  # not this execution's any more: recorded as RQ does, and the fence decides
            logging.shutdown()
            os._exit(0)


def connection_spec(connection: Redis) -> dict[str, Any]:
    """What another process needs to connect as ``connection`` does (picklable).

    A Sentinel-managed connection is rebuilt through the same sentinels, for the same
    primary name, so that the new process finds the *current* primary; any other through
    its pool's connection class (rq-epoch's failover watch, when installed, is left out).
    """
    pool = connection.connection_pool
    kwargs = {
        name: value
        for name, value in get_connection_kwargs(connection).items()
        if name not in _PROCESS_LOCAL_KWARGS and type(value) is not object
    }
    spec: dict[str, Any] = {'redis_class': type(connection), 'kwargs': kwargs}
    if is_sentinel_managed(connection):
        manager = cast(Any, pool).sentinel_manager
        spec['sentinel'] = {
            'service_name': cast(Any, pool).service_name,
            'sentinels': [_address(client) for client in manager.sentinels],
            'min_other_sentinels': manager.min_other_sentinels,
            'sentinel_kwargs': manager.sentinel_kwargs,
        }
    else:
        spec['connection_class'] = redis_py.unhooked_connection_class(pool, _WatchedConnection)
    return spec


def rebuild_connection(spec: dict[str, Any]) -> Redis:
    """A client connected as the one :func:`connection_spec` described."""
    sentinel = spec.get('sentinel')
    if sentinel is not None:
        # The pool's settings (spec['kwargs']) already hold the Sentinel's connection settings.
        manager = Sentinel(
            sentinel['sentinels'],
            min_other_sentinels=sentinel['min_other_sentinels'],
            sentinel_kwargs=sentinel['sentinel_kwargs'],
        )
        return manager.master_for(sentinel['service_name'], redis_class=spec['redis_class'], **spec['kwargs'])
    pool = ConnectionPool(connection_class=spec['connection_class'], **spec['kwargs'])
    return cast(Redis, spec['redis_class'](connection_pool=pool))


#: Pool settings that belong to the process that made them (RQ's SpawnWorker drops them too).
_PROCESS_LOCAL_KWARGS = ('retry', 'driver_info', 'connection_pool')


def _address(client: Redis) -> tuple[str, int]:
    kwargs = client.connection_pool.connection_kwargs
    return str(kwargs.get('host', 'localhost')), int(kwargs.get('port', 26379))


def _spawned_horse() -> None:
    """Entry point of a work-horse started by :class:`SpawnWorker`.

    Logs as the worker does; rebuilds the worker and the job from the server, riding out an
    outage meanwhile, and the execution from what the worker sent; watches the primary as the
    worker does; then runs the job as RQ's work-horse does.
    """
    # Started with SIGTERM and SIGINT blocked (SpawnWorker.fork_work_horse): ignored from now on,
    # as in a forked work-horse (Worker.setup_work_horse_signals), then let through.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    spec = pickle.loads(bytes.fromhex(os.environ.pop('RQ_EPOCH_SPAWN_PAYLOAD')))
    worker_class = spec['worker_class']
    if spec['logging'] is not None:
        level, date_format, log_format = spec['logging']
        for name in ('rq.worker', 'rq_epoch'):
            setup_loghandlers(level, date_format, log_format, name=name)
    connection = rebuild_connection(spec['connection'])

    def unreachable(exc: Exception, attempt: int) -> None:
        if attempt == 0:
            logging.getLogger('rq.worker').warning(
                'Worker %s: server unreachable before job %s started (%s); retrying',
                spec['worker_name'],
                spec['job_id'],
                exc,
            )

    give_up = time.monotonic() + worker_class.outcome_retry_limit
    rebuilt = with_backoff(lambda: _rebuild(spec, connection), give_up, spec['max_backoff'], unreachable)
    if rebuilt is None:
        sys.exit(1)
    worker, job, queue, run_id = rebuilt
    # A forked work-horse inherits the worker's watch of the primary; a spawned one needs its
    # own, or after a failover its outcome would go to the demoted primary.
    worker.contact.run_id = run_id
    worker.primary_watch = worker.watch_primary(run_id)
    worker.main_work_horse(job, queue)


def _rebuild(spec: dict[str, Any], connection: Redis) -> tuple[Any, Any, Any, str] | None:
    """The worker (None if its key is gone), the job, its queue and the server's run_id, read
    from the server; the worker is given its execution of the job."""
    from rq.executions import Execution

    worker = spec['worker_class'].find_by_key(
        spec['worker_key'],
        connection=connection,
        job_class=spec['job_class'],
        queue_class=spec['queue_class'],
        serializer=spec['serializer'],
    )
    if not worker:
        return None
    for name, value in spec['attributes'].items():
        setattr(worker, name, value)
    rq_adapter.set_exception_handlers(worker, spec['exception_handlers'])
    run_id = read_epoch(connection).run_id
    job = worker.job_class.fetch(spec['job_id'], connection=connection, serializer=worker.serializer)
    queue = worker.queue_class(
        spec['queue_name'],
        connection=connection,
        job_class=worker.job_class,
        serializer=worker.serializer,
        death_penalty_class=worker.death_penalty_class,
    )
    # The execution as the worker made it, not read back: its record may have expired by now
    # (a worker frozen past its lease, which this execution may still hold once it thaws).
    made = spec['execution']
    execution = Execution(made['id'], job.id, connection=connection, worker_name=made['worker_name'])
    execution.created_at, execution.last_heartbeat = made['created_at'], made['last_heartbeat']
    rq_adapter.attach_job(execution, job)  # the job as the worker's job class made it
    worker.execution = execution
    job.grant_lost = spec['grant_lost']
    # The worker's durability settings, keyword arguments included (find_by_key reads only the environment).
    worker.durability = worker.outcomes.durability = Durability(*spec['durability'], log=worker.log, name=worker.name)
    return worker, job, queue, run_id
