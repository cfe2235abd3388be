"""RQ's Queue that can give each job its own stall budget, and confirm enqueues with replicas;
and the stand-in queue through which a durable worker holds back RQ 3's push of dependents."""

from __future__ import annotations

import threading
from typing import Any

from redis.exceptions import WatchError
from rq.job import JobStatus
from rq.queue import Queue as RQQueue
from rq.utils import utcformat

from ..adapters import rq as rq_adapter
from ..compat import text
from ..errors import EnqueueNotConfirmed, connection_error_behind
from ..protocol.durable import Durability
from ..settings import EpochSettings
from .job import Job
from .jobclass import epoch_job_class

__all__ = ['HoldsReadyDependents', 'Queue', 'holding_ready_dependents']


class Queue(RQQueue):
    """An RQ queue whose ``enqueue`` family accepts ``max_stalled=N``.

    ``max_stalled`` is this job's stall budget (a whole number of at least 1); without it
    the sweeper's setting (``RQ_EPOCH_MAX_STALLED``) applies. Jobs are ``rq_epoch.Job``, or
    the epoch variant of the ``job_class`` given (see :func:`rq_epoch.epoch_job_class`).

    **Durable enqueue.** With ``durable_replicas=N`` (to the queue, or to one ``enqueue``
    call; default ``RQ_EPOCH_DURABLE_REPLICAS``, 0 is off), ``enqueue``, ``enqueue_call``,
    ``enqueue_at`` and ``enqueue_in`` return only once N replicas confirmed the job
    (``WAIT``, up to ``durable_timeout`` ms, default ``RQ_EPOCH_DURABLE_TIMEOUT``; with
    ``durable_fsync``, also the primary's append-only file), and raise
    :class:`rq_epoch.EnqueueNotConfirmed` when they did not: the job may or may not exist
    after a failover. A server with no replica connected confirms nothing (one warning, then
    as without the setting). ``enqueue_many`` and enqueues into a pipeline of your own are
    not confirmed (send ``WAIT`` after your pipeline).
    """

    job_class = Job

    def __init__(
        self,
        *args: Any,
        durable_replicas: int | None = None,
        durable_timeout: int | None = None,
        durable_fsync: int | bool | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs['job_class'] = epoch_job_class(kwargs.get('job_class') or type(self).job_class)
        super().__init__(*args, **kwargs)
        self._pending = threading.local()
        settings = EpochSettings.resolve(
            durable_replicas=durable_replicas,
            durable_timeout=durable_timeout,
            durable_fsync=None if durable_fsync is None else int(durable_fsync),
        )
        #: Confirms enqueued jobs with replicas (``durable_replicas``; off by default).
        self.durability = Durability(settings.durable_replicas, settings.durable_timeout, bool(settings.durable_fsync))

    def _with_max_stalled(self, method: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        durable = kwargs.pop('durable_replicas', None)
        outermost = not getattr(self._pending, 'inside', False)  # enqueue calls enqueue_call
        previous = getattr(self._pending, 'max_stalled', None)
        if 'max_stalled' in kwargs:
            self._pending.max_stalled = kwargs.pop('max_stalled')
        self._pending.inside = True
        try:
            job = method(*args, **kwargs)
        finally:
            self._pending.max_stalled = previous
            if outermost:
                self._pending.inside = False
        if outermost and kwargs.get('pipeline') is None:
            self.confirm_enqueued(job.id, durable)
        return job

    def confirm_enqueued(self, job_id: str, replicas: int | None = None) -> None:
        """Wait until replicas confirm every write of this client so far (the job ``job_id``).

        ``replicas``: how many (default: the queue's ``durable_replicas``; 0 confirms
        nothing).

        Raises:
            EnqueueNotConfirmed: fewer replicas confirmed it in time (it may or may not exist).
        """
        durability = self.durability
        if replicas is not None and replicas != durability.replicas:
            durability = Durability(replicas, durability.timeout_ms, durability.fsync)
        if not durability.enabled:
            return
        confirmation = durability.confirm(self.connection)
        if not confirmation.confirmed:
            raise EnqueueNotConfirmed(job_id, confirmation.replicas or 0, durability.replicas, durability.timeout_ms)

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        return self._with_max_stalled(super().enqueue, args, kwargs)

    def enqueue_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._with_max_stalled(super().enqueue_call, args, kwargs)

    def enqueue_at(self, *args: Any, **kwargs: Any) -> Any:
        return self._with_max_stalled(super().enqueue_at, args, kwargs)

    def enqueue_in(self, *args: Any, **kwargs: Any) -> Any:
        return self._with_max_stalled(super().enqueue_in, args, kwargs)

    def setup_dependencies(self, job: Any, pipeline: Any = None) -> Any:
        """RQ's registration of a job that waits for unfinished dependencies, not repeated after it landed.

        RQ sends the registration (status "deferred", the job among each dependency's
        dependents) as a transaction under ``WATCH``, and sends it again on a ``WatchError``:
        a dependency changed meanwhile. redis-py raises ``WatchError`` too when the connection
        drops while keys are watched (a restart, a failover). When the registration had landed
        and a dependency finished before the second attempt, that dependency pushed the job, and
        the second attempt found every dependency met and pushed it again: the job ran twice.
        Here, before trying again after a dropped connection, the job hash is read: if it holds
        this job object's ``created_at``, the registration landed, and the job stays deferred.
        A job given a pipeline of the caller's is RQ's business, as in RQ.
        """
        if pipeline is not None or not rq_adapter.dependency_ids(job):
            return super().setup_dependencies(job, pipeline=pipeline)
        status = job.get_status(refresh=False)
        while True:
            with self.connection.pipeline() as pipe:
                try:
                    super().setup_dependencies(job, pipeline=pipe)  # the registration queued on pipe, or nothing
                    if job.get_status(refresh=False) == JobStatus.DEFERRED:
                        pipe.execute()
                    return job
                except WatchError as exc:
                    if connection_error_behind(exc) is not None and self._registered(job):
                        return job
                    rq_adapter.set_local_status(job, status)  # as RQ does before it tries again

    def _registered(self, job: Any) -> bool:
        """Whether the job hash on the server is this job object's (its ``created_at``)."""
        stored = self.connection.hget(job.key, 'created_at')
        return stored is not None and job.created_at is not None and text(stored) == utcformat(job.created_at)

    def create_job(self, *args: Any, **kwargs: Any) -> Any:
        max_stalled = kwargs.pop('max_stalled', None)
        if max_stalled is None:
            max_stalled = getattr(self._pending, 'max_stalled', None)
        job: Any = super().create_job(*args, **kwargs)
        if max_stalled is not None:
            job.max_stalled = max_stalled
        return job


class HoldsReadyDependents:
    """A queue whose push of ready dependents is held back, for the worker to do it later.

    RQ 3 records a job's outcome in two steps: the outcome's transaction moves the dependents
    that may run now into their ReadyJobRegistry, then ``enqueue_ready_jobs_by_queue`` pushes
    them onto their queues (``Queue.enqueue_dependents`` does the same after a failure). Here
    that second step only keeps their ids, by queue name, in :attr:`held_ready`; nothing is
    pushed. A durable worker (``RQ_EPOCH_DURABLE_REPLICAS``) hands RQ's outcome handlers such a
    queue (:func:`holding_ready_dependents`) and pushes what it kept once replicas confirmed the
    outcome (``rq_epoch.Worker.enqueue_ready_dependents``). A dependent left in its registry is
    pushed by RQ's ``ReadyJobRegistry`` cleanup (the workers' maintenance), as in RQ.
    """

    #: Ids of the dependents made ready by the outcomes recorded through this queue, by queue name.
    held_ready: dict[str, list[str]]

    def enqueue_ready_jobs_by_queue(self, job_ids_by_queue_name: dict[str, list[str]]) -> None:
        """Keep the ids in :attr:`held_ready` instead of pushing the jobs onto their queues."""
        for name, ids in job_ids_by_queue_name.items():
            kept = self.held_ready.setdefault(name, [])
            kept.extend(job_id for job_id in ids if job_id not in kept)


_holding_classes: dict[type, type] = {}
_holding_lock = threading.Lock()


def holding_ready_dependents(queue: RQQueue) -> HoldsReadyDependents:
    """A copy of ``queue`` that holds back the push of ready dependents (:class:`HoldsReadyDependents`).

    Its class derives from the queue's own (``HoldsReadyDependents + type(queue)``, made once
    per class, with the same name and module), so it is the same queue in every other way;
    ``queue`` itself is left as it was.
    """
    cls = type(queue)
    with _holding_lock:
        holding = _holding_classes.get(cls)
        if holding is None:
            holding = type(
                cls.__name__,
                (HoldsReadyDependents, cls),
                {'__module__': cls.__module__, '__qualname__': cls.__qualname__, '__doc__': cls.__doc__},
            )
            _holding_classes[cls] = holding
    held: HoldsReadyDependents = rq_adapter.queue_copy_as(queue, holding)
    held.held_ready = {}
    return held
