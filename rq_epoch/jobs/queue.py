"""RQ's Queue that can give each job its own stall budget, and confirm enqueues with replicas."""

from __future__ import annotations

import threading
from typing import Any

from rq.queue import Queue as RQQueue

from ..errors import EnqueueNotConfirmed
from ..protocol.durable import Durability
from ..settings import EpochSettings
from .job import Job
from .jobclass import epoch_job_class

__all__ = ['Queue']


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

    def create_job(self, *args: Any, **kwargs: Any) -> Any:
        max_stalled = kwargs.pop('max_stalled', None)
        if max_stalled is None:
            max_stalled = getattr(self._pending, 'max_stalled', None)
        job: Any = super().create_job(*args, **kwargs)
        if max_stalled is not None:
            job.max_stalled = max_stalled
        return job
