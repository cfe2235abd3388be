"""RQ's other worker flavours with the epoch behaviour: no fork, and spawn instead of fork.

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

``rq worker --worker-class rq_epoch.SpawnWorker`` starts each work-horse with
``posix_spawn`` instead of ``fork`` (RQ's ``SpawnWorker``). The work-horse process rebuilds
the worker from its class (pickled), so it commits through the same fence; RQ 2's own
spawned work-horse always rebuilt a stock ``rq.Worker``, so on RQ 2 this class starts the
work-horse its own way.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from rq.connections import get_connection_kwargs
from rq.worker import BaseWorker
from rq.worker import SimpleWorker as RQSimpleWorker
from rq.worker import SpawnWorker as RQSpawnWorker

from .errors import RqEpochError
from .outcomes import CONNECTION_ERRORS
from .worker import Worker

if TYPE_CHECKING:
    from rq.executions import Execution

__all__ = ['LeaseKeeper', 'SimpleWorker', 'SpawnWorker']

#: RQ 3's SpawnWorker rebuilds the worker from its pickled class; RQ 2's rebuilds rq.Worker.
_RQ_SPAWNS_OWN_CLASS = hasattr(RQSpawnWorker, '_dump_worker_config')


class LeaseKeeper(threading.Thread):
    """Keeps the lease of a job that runs in the worker process, from a thread of its own.

    Every heartbeat interval it sends the worker's heartbeat round trip (worker, execution,
    job, lease extended and re-stamped) on its own connection. A server outage is ridden
    out: attempts are retried with backoff until the server is back. It stops when told to
    (the job ended), or when the lease is gone (its own commit removed it, or a sweep took
    it: then it logs a warning, since the job cannot be stopped in-process).
    """

    def __init__(self, worker: Worker, job: Any, execution: Execution) -> None:
        super().__init__(name=f'rq-epoch-lease-keeper-{job.id}', daemon=True)
        self.worker = worker
        self.job = job
        self.execution = execution
        self.stopped = threading.Event()
        #: Verdict of the sweep that took the lease, once the keeper learned of one.
        self.taken: str | None = None
        pool = worker.connection.connection_pool
        self.connection = type(worker.connection)(connection_pool=pool, single_connection_client=True)

    def run(self) -> None:
        interval = self.worker.epoch_settings.heartbeat_interval
        try:
            while not self.stopped.wait(interval):
                if not self._beat():
                    return
        finally:
            self.connection.close()

    def _beat(self) -> bool:
        """One heartbeat, retried through an outage; False once the lease is gone."""
        delay = 0.1
        while not self.stopped.is_set():
            try:
                extended, run_id, taken = self.worker._heartbeat_lease(self.job, self.execution, self.connection)
            except CONNECTION_ERRORS as exc:
                self.worker._server_unreachable(exc)
                self.stopped.wait(delay)
                delay = min(delay * 2, self.worker._max_backoff())
                continue
            except Exception:  # noqa: BLE001 - the keeper must not die silently
                self.worker.log.exception('Worker %s: lease heartbeat of job %s failed', self.worker.name, self.job.id)
                self.stopped.wait(delay)
                delay = min(delay * 2, self.worker._max_backoff())
                continue
            self.worker._server_reachable(run_id)
            if extended:
                return True
            if taken:
                self.taken = taken
                self.worker.log.warning(
                    'Worker %s: a sweep took the lease of job %s (verdict %s) while this worker could not '
                    'heartbeat; the job runs in this process and cannot be stopped: its outcome will be refused',
                    self.worker.name,
                    self.job.id,
                    taken,
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

    def perform_job(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> bool:
        """Run the job in this process while a lease keeper thread keeps its lease."""
        execution = kwargs.get('execution') or (args[0] if args else None) or self.execution
        keeper = LeaseKeeper(self, job, execution) if execution is not None and execution.job_id == job.id else None
        if keeper is not None:
            _without_signals(keeper.start)
        try:
            return super().perform_job(job, queue, *args, **kwargs)
        finally:
            if keeper is not None:
                keeper.stop()


class SpawnWorker(Worker, RQSpawnWorker):
    """RQ's SpawnWorker (work-horses started with ``posix_spawn``) with the epoch behaviour."""

    if not _RQ_SPAWNS_OWN_CLASS:

        def fork_work_horse(self, job: Any, queue: Any) -> None:
            """Spawn a work-horse that rebuilds this worker class, then runs the job as RQ does."""
            if self.execution is None:
                raise RqEpochError(f'SpawnWorker {self.name}: no execution prepared for job {job.id}')
            os.environ['RQ_WORKER_ID'] = self.name
            os.environ['RQ_JOB_ID'] = job.id
            os.environ['RQ_EXECUTION_ID'] = self.execution.id
            connection_kwargs = get_connection_kwargs(self.connection)
            for name in ('retry', 'driver_info', 'connection_class'):
                connection_kwargs.pop(name, None)
            if 'path' in connection_kwargs:
                connection_kwargs['unix_socket_path'] = connection_kwargs.pop('path')
            payload = pickle.dumps(
                {
                    'worker_class': type(self),
                    'worker_key': self.key,
                    'connection_class': type(self.connection),
                    'connection_kwargs': connection_kwargs,
                    'job_class': self.job_class,
                    'queue_class': self.queue_class,
                    'serializer': self._serializer_arg,
                    'job_id': job.id,
                    'queue_name': queue.name,
                    'execution_id': self.execution.id,
                    'attributes': {
                        'death_penalty_class': self.death_penalty_class,
                        '_exc_handlers': self._exc_handlers,
                        'default_result_ttl': self.default_result_ttl,
                        'job_monitoring_interval': self.job_monitoring_interval,
                        'log_job_description': self.log_job_description,
                        'log_result_lifespan': self.log_result_lifespan,
                        'disable_default_exception_handler': self.disable_default_exception_handler,
                    },
                }
            )
            argv = [sys.executable, '-c', 'from rq_epoch.flavours import _spawned_horse; _spawned_horse()']
            environ = {**os.environ, 'RQ_EPOCH_SPAWN_PAYLOAD': payload.hex(), 'PYTHONPATH': os.pathsep.join(sys.path)}
            self._horse_pid = os.posix_spawn(sys.executable, argv, environ, setpgroup=0)
            self.procline(f'Spawned {self._horse_pid} at {time.time()}')


def _spawned_horse() -> None:
    """Entry point of a work-horse started by :class:`SpawnWorker` on RQ 2."""
    from rq.executions import Execution

    spec = pickle.loads(bytes.fromhex(os.environ.pop('RQ_EPOCH_SPAWN_PAYLOAD')))
    connection = spec['connection_class'](**spec['connection_kwargs'])
    worker = spec['worker_class'].find_by_key(
        spec['worker_key'],
        connection=connection,
        job_class=spec['job_class'],
        queue_class=spec['queue_class'],
        serializer=spec['serializer'],
    )
    if not worker:
        sys.exit(1)
    for name, value in spec['attributes'].items():
        setattr(worker, name, value)
    job = worker.job_class.fetch(spec['job_id'], connection=connection, serializer=worker.serializer)
    queue = worker.queue_class(
        spec['queue_name'], connection=connection, job_class=worker.job_class, serializer=worker.serializer
    )
    worker.execution = Execution.fetch(spec['execution_id'], job.id, connection=connection)
    worker.main_work_horse(job, queue)
