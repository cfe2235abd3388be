"""RQ's Queue that can give each job its own stall budget."""

from __future__ import annotations

import threading
from typing import Any

from rq.queue import Queue as RQQueue

from .job import Job
from .jobclass import epoch_job_class

__all__ = ['Queue']


class Queue(RQQueue):
    """An RQ queue whose ``enqueue`` family accepts ``max_stalled=N``.

    ``max_stalled`` is this job's stall budget (a whole number of at least 1); without it
    the sweeper's setting (``RQ_EPOCH_MAX_STALLED``) applies. Jobs are ``rq_epoch.Job``, or
    the epoch variant of the ``job_class`` given (see :func:`rq_epoch.epoch_job_class`).
    """

    job_class = Job

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs['job_class'] = epoch_job_class(kwargs.get('job_class') or type(self).job_class)
        super().__init__(*args, **kwargs)
        self._pending = threading.local()

    def _with_max_stalled(self, method: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if 'max_stalled' not in kwargs:
            return method(*args, **kwargs)
        previous = getattr(self._pending, 'max_stalled', None)
        self._pending.max_stalled = kwargs.pop('max_stalled')
        try:
            return method(*args, **kwargs)
        finally:
            self._pending.max_stalled = previous

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
