"""RQ's internals that rq-epoch relies on (see :mod:`rq_epoch.adapters` for the rule).

Each function is one private attribute or method of RQ, or one behaviour RQ does not
promise, under a name that says what rq-epoch needs from it. Differences between the RQ
versions that only touch public API are in :mod:`rq_epoch.compat`; one whose side touches
a private part is here (:func:`record_job_failure`).
"""

from __future__ import annotations

import copy
import signal
from collections.abc import Callable, Sequence
from types import CodeType
from typing import TYPE_CHECKING, Any, TypeVar

from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus, parse_job_id
from rq.timeouts import UnixSignalDeathPenalty

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from redis import Redis
    from redis.client import Pipeline
    from rq.executions import Execution
    from rq.queue import Queue
    from rq.scheduler import RQScheduler
    from rq.worker import BaseWorker

__all__ = [
    'attach_job',
    'bring_monitor_alarm_forward',
    'change_job_class',
    'dependency_ids',
    'exception_handlers',
    'fetches_as_rq',
    'job_from_hash',
    'push_job',
    'push_rate_limited_job',
    'queue_class_dequeuing_with',
    'queue_copy_as',
    'raised_before_job_function',
    'record_job_failure',
    'scheduler_process',
    'serializer_argument',
    'set_exception_handlers',
    'set_horse_pid',
    'stop_requested',
]

J = TypeVar('J', bound=RQJob)
Q = TypeVar('Q', bound='Queue')

# -- jobs -------------------------------------------------------------------------------

#: RQ's own ``Job.perform``, and its ``_execute``, which calls the job function: an error
#: raised in the first and not in the second is RQ's step before the function.
_RQ_PERFORM: CodeType = RQJob.perform.__code__
_RQ_EXECUTE: CodeType = RQJob._execute.__code__


def _raised_in(error: BaseException, code: CodeType) -> bool:
    """Whether ``error`` was raised inside a call of the function whose code is ``code``."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def raised_before_job_function(error: BaseException) -> bool:
    """Whether RQ's ``Job.perform`` raised ``error`` itself, before it called the job function.

    Read from the traceback: a frame of RQ's ``perform`` and none of ``Job._execute`` (the
    private method through which ``perform`` calls the function). RQ 2's ``perform``
    removes the job key's expiry first (a server call that may fail); RQ 3's calls no
    server before the function.
    """
    return _raised_in(error, _RQ_PERFORM) and not _raised_in(error, _RQ_EXECUTE)


def change_job_class(job: RQJob, cls: type[J]) -> J:
    """Make ``job`` an instance of ``cls`` in place (``cls`` derives from the job's class).

    An RQ job keeps its state in its instance dictionary and has no ``__slots__``, so the
    object keeps every field; what ``cls`` adds must have class-level defaults, since its
    ``__init__`` does not run.
    """
    job.__class__ = cls
    return job  # type: ignore[return-value]


def dependency_ids(job: RQJob) -> list[str]:
    """The ids of the jobs ``job`` depends on, as it was made or fetched (RQ's ``_dependency_ids``).

    RQ's public ``Job.dependency_ids`` reads them from the server again; this sends nothing.
    """
    return list(job._dependency_ids)


def fetches_as_rq(job_class: type[RQJob]) -> bool:
    """Whether ``job_class`` fetches a job as RQ's ``Job`` does: its ``fetch`` and ``refresh``
    are RQ's own (the job object made with the id, then its hash read with ``HGETALL`` and
    given to ``restore``). Then :func:`job_from_hash` makes the same job from a hash read
    elsewhere; a class that reads its jobs its own way is fetched as it says."""
    fetch = getattr(job_class.fetch, '__func__', None)
    return fetch is RQJob.fetch.__func__ and job_class.refresh is RQJob.refresh  # type: ignore[attr-defined]


def job_from_hash(job_class: type[J], job_id: str, data: dict[bytes, bytes], connection: Redis, serializer: Any) -> J:
    """The job ``job_class.fetch(job_id)`` gives, made from its hash ``data`` as read by ``HGETALL``
    (RQ's ``fetch`` and ``refresh``, without the read; see :func:`fetches_as_rq`).

    Raises:
        rq.exceptions.NoSuchJobError: ``data`` is empty (the job hash does not exist).
    """
    job = job_class(parse_job_id(job_id), connection=connection, serializer=serializer)
    if not data:
        raise NoSuchJobError(f'No such job: {job.key}')
    job.restore(data)
    return job


def set_local_status(job: RQJob, status: JobStatus) -> None:
    """Give the job object ``status`` without writing it (RQ's ``Job._status``).

    RQ's ``setup_dependencies`` does this before it sends a registration again (the queued
    ``set_status`` of the failed attempt changed the object only); ``Job.set_status`` would
    write to the server.
    """
    job._status = status


def push_job(queue: Queue, job: RQJob, pipeline: Pipeline, at_front: bool) -> None:
    """Queue the writes that put ``job`` onto ``queue`` (status queued, id pushed) on ``pipeline``.

    RQ's ``Queue._enqueue_job``, which its own ``enqueue_dependents`` and
    ``ReadyJobRegistry.enqueue_jobs`` use; the public ``Queue.enqueue_job`` first checks
    the job's dependencies again and writes outside the pipeline.
    """
    queue._enqueue_job(job, pipeline=pipeline, at_front=at_front)


def push_rate_limited_job(queue: Queue, job: RQJob, pipeline: Pipeline) -> None:
    """:func:`push_job` for a job with a rate limit (RQ 3's ``Queue._enqueue_rate_limited_job``)."""
    queue._enqueue_rate_limited_job(job, pipeline=pipeline)  # type: ignore[attr-defined]  # absent in RQ 2


#: RQ 3's worker-less failure, resolved once (None on RQ 2).
_rq3_record_job_failure: Any
try:
    from rq.job_lifecycle import record_job_failure as _rq3_record_job_failure  # type: ignore[no-redef]
except ImportError:  # RQ 2.x
    _rq3_record_job_failure = None


def record_job_failure(job: RQJob, exc_string: str, pipeline: Pipeline) -> None:
    """Queue RQ's worker-less failure on ``pipeline``: status FAILED, FailedJobRegistry entry, failure Result.

    RQ 3's public ``rq.job_lifecycle.record_job_failure``; on RQ 2 the same two steps,
    the second of which is the private ``Job._handle_failure``.
    """
    if _rq3_record_job_failure is None:  # RQ 2.x
        job.set_status(JobStatus.FAILED, pipeline=pipeline)
        job._handle_failure(exc_string, pipeline)
    else:
        _rq3_record_job_failure(job, exc_string, pipeline)


def attach_job(execution: Execution, job: RQJob) -> None:
    """Make ``execution.job`` return ``job`` (RQ's ``Execution._job``) instead of fetching a plain RQ Job."""
    execution._job = job


# -- queues -----------------------------------------------------------------------------


def queue_class_dequeuing_with(queue_class: type[Q], dequeue_any: Callable[..., Any]) -> type[Q]:
    """A subclass of ``queue_class`` (same name, module and docstring) whose ``dequeue_any`` is ``dequeue_any``.

    RQ's worker loop (``Worker.dequeue_job_and_maintain_ttl``) takes each job with
    ``self.queue_class.dequeue_any(queues, timeout, connection=, job_class=, serializer=,
    death_penalty_class=)``: a worker that puts this class in its ``queue_class`` for the
    loop takes jobs with ``dequeue_any(cls, queues, timeout, **those)``. That the loop
    goes through this classmethod is not promised by RQ.
    """
    return type(
        queue_class.__name__,
        (queue_class,),
        {
            '__module__': queue_class.__module__,
            '__doc__': queue_class.__doc__,
            'dequeue_any': classmethod(dequeue_any),
        },
    )


def queue_copy_as(queue: Queue, cls: type[Q]) -> Q:
    """A shallow copy of ``queue`` made an instance of ``cls`` (which derives from the queue's class).

    An RQ queue keeps its state (name, key, connection, job class, serializer, ...) in its
    instance dictionary and has no ``__slots__``, so the copy is the same queue to RQ; what
    ``cls`` adds must be set on the copy, since its ``__init__`` does not run. ``queue``
    itself is left as it was.
    """
    made = copy.copy(queue)
    made.__class__ = cls
    return made  # type: ignore[return-value]


# -- workers ----------------------------------------------------------------------------


def exception_handlers(worker: BaseWorker) -> list[Callable[..., Any]]:
    """The worker's exception handlers, the list itself (RQ's ``_exc_handlers``; RQ has only push and pop)."""
    handlers: list[Callable[..., Any]] = worker._exc_handlers
    return handlers


def set_exception_handlers(worker: BaseWorker, handlers: Sequence[Callable[..., Any]]) -> None:
    """Give ``worker`` these exception handlers in place of its own (a work-horse rebuilt in a new process)."""
    worker._exc_handlers = list(handlers)


def stop_requested(worker: BaseWorker) -> bool:
    """Whether the worker was told to stop once its current job ends (RQ's ``_stop_requested``)."""
    return bool(worker._stop_requested)


def running_execution(worker: BaseWorker) -> Execution | None:
    """The execution this worker process holds in memory now, or None; never read from the server.

    RQ 3's ``worker.execution`` falls back, when the worker holds none, to the worker's
    execution index in the server, and caches what it read there (``_executions``): read in
    the middle of an outcome, that cache outlives the execution, and ``get_current_job_id``
    keeps naming a job that ended. RQ 2's ``execution`` is a plain attribute.
    """
    executions = getattr(worker, 'executions', None)
    if isinstance(executions, dict):
        return next(iter(executions.values()), None)
    execution: Execution | None = worker.execution
    return execution


def set_horse_pid(worker: BaseWorker, pid: int) -> None:
    """Record the pid of a work-horse started by rq-epoch (RQ's ``_horse_pid``, read by ``horse_pid``)."""
    worker._horse_pid = pid


def serializer_argument(worker: BaseWorker) -> str | None:
    """The worker's serializer as a dotted path another process can resolve (RQ's ``_serializer_arg``).

    What RQ's own SpawnWorker passes to its work-horse; None for RQ's default.
    """
    argument: str | None = worker._serializer_arg
    return argument


def scheduler_process(scheduler: RQScheduler) -> BaseProcess | None:
    """The process RQ's scheduler runs in, once the worker started it (RQ's ``_process``)."""
    process: BaseProcess | None = scheduler._process
    return process


def bring_monitor_alarm_forward() -> bool:
    """End the current wait of RQ's work-horse monitor now, when one is under way; True if so.

    RQ's monitor waits for the work-horse in ``wait4`` inside a death penalty of one monitoring
    interval: with :class:`rq.timeouts.UnixSignalDeathPenalty` (RQ's default where SIGALRM
    exists), a SIGALRM whose handler is the death penalty's raises its timeout exception, and
    RQ's loop then looks at the job (heartbeats, then waits again). That the handler installed
    during the wait is a bound method of that class is not promised by RQ. Brought forward
    only while that handler is installed: outside a death penalty SIGALRM's action is the
    default one, which would end the process. To be called in the main thread (a signal handler).
    """
    handler = signal.getsignal(signal.SIGALRM)
    if not isinstance(getattr(handler, '__self__', None), UnixSignalDeathPenalty):
        return False
    signal.setitimer(signal.ITIMER_REAL, 0.001)
    return True
