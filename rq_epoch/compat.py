"""Every difference between the RQ versions rq-epoch supports (3.0 and 2.12), in one place.

The rest of the package imports what differs from here instead of testing versions itself.
Where a version has a public function for what rq-epoch needs, it is used; the fallbacks
say which RQ 2 method they stand for. A difference whose one side is a private part of RQ
is in :mod:`rq_epoch.adapters.rq` with RQ's other internals (the failure recorded without a
worker: :func:`rq_epoch.adapters.rq.record_job_failure`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from rq.job import JobStatus
from rq.queue import Queue as RQQueue
from rq.registry import BaseRegistry, DeferredJobRegistry, FailedJobRegistry, FinishedJobRegistry
from rq.worker import Worker as RQWorker

if TYPE_CHECKING:
    from rq.job import Job
    from rq.queue import Queue
    from rq.timeouts import BaseDeathPenalty

__all__ = [
    'CLEANUP_TAKES_EXECUTION',
    'HEARTBEAT_TTL_TAKES_WORKING_TIME',
    'MAINTAINED_REGISTRIES',
    'READY_TO_ENQUEUE',
    'RQ_KEY_PREFIX',
    'RateLimitRegistry',
    'execute_failure_callback',
    'move_dependents_to_ready',
    'release_rate_limit_slot',
    'optional_text',
    'text',
]

try:  # RQ 3.0 made the key prefix configurable
    from rq.defaults import RQ_KEY_PREFIX  # type: ignore[attr-defined]  # absent in RQ 2
except ImportError:  # RQ 2.x: fixed prefix
    RQ_KEY_PREFIX = 'rq'

#: Registries a worker's maintenance cleans besides the started one. RQ 3 adds "ready":
#: dependents whose push onto the queue was interrupted; RQ 2 enqueues dependents inside the
#: parent's own transaction.
MAINTAINED_REGISTRIES: tuple[type[BaseRegistry], ...]
#: RQ 3's registry of rate-limited jobs (None on RQ 2, which has no rate limits).
RateLimitRegistry: Any
try:
    from rq.rate_limit import RateLimitRegistry  # type: ignore[no-redef]  # declared above for RQ 2
    from rq.registry import ReadyJobRegistry  # type: ignore[attr-defined]  # absent in RQ 2

    MAINTAINED_REGISTRIES = (FinishedJobRegistry, FailedJobRegistry, DeferredJobRegistry, ReadyJobRegistry)
except ImportError:  # RQ 2.x
    RateLimitRegistry = None
    MAINTAINED_REGISTRIES = (FinishedJobRegistry, FailedJobRegistry, DeferredJobRegistry)

#: RQ 3's status of a dependent in its ReadyJobRegistry, not yet pushed onto its queue (None on
#: RQ 2, which has no such step: a dependent goes onto its queue in its parent's transaction).
READY_TO_ENQUEUE: str | None = getattr(JobStatus, 'READY_TO_ENQUEUE', None)

# RQ 3's worker-less failure functions, resolved once (None on RQ 2): a failed import would
# search the whole path again at every dead letter.
_rq3_failure_callback: Any
_rq3_release_slot: Any
try:
    from rq.callbacks import execute_failure_callback as _rq3_failure_callback  # type: ignore[no-redef]
    from rq.rate_limit import release_slot as _rq3_release_slot  # type: ignore[no-redef]
except ImportError:  # RQ 2.x
    _rq3_failure_callback = _rq3_release_slot = None

#: RQ's own ``Queue.enqueue_dependents`` (a queue class that overrides it is called as it is).
_STOCK_ENQUEUE_DEPENDENTS = RQQueue.enqueue_dependents

#: RQ 3's ``Worker.get_heartbeat_ttl`` takes the job's working time; RQ 2's does not.
HEARTBEAT_TTL_TAKES_WORKING_TIME = 'working_time' in inspect.signature(RQWorker.get_heartbeat_ttl).parameters

#: RQ 3's ``Worker.cleanup_execution`` is told the execution; RQ 2's uses the worker's current one.
CLEANUP_TAKES_EXECUTION = 'execution' in inspect.signature(RQWorker.cleanup_execution).parameters


def text(value: Any) -> str:
    """A server reply as text: bytes decoded (undecodable bytes replaced), None as ``''``.

    RQ's ``rq.utils.as_text`` refuses anything but bytes and str and raises on bad UTF-8;
    replies read for reports and views must not.
    """
    if value is None:
        return ''
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else str(value)


def optional_text(value: Any) -> str | None:
    """As :func:`text`, but None stays None (a missing field apart from an empty one)."""
    return None if value is None else text(value)


def execute_failure_callback(job: Job, death_penalty_class: type[BaseDeathPenalty], *exc_info: Any) -> None:
    """Run the job's ``on_failure`` callback under its timeout (RQ 3's function, RQ 2's Job method)."""
    if _rq3_failure_callback is None:  # RQ 2.x
        job.execute_failure_callback(death_penalty_class, *exc_info)  # type: ignore[attr-defined]
    else:
        _rq3_failure_callback(job, death_penalty_class, *exc_info)


def move_dependents_to_ready(queue: Queue, job: Job) -> dict[str, list[str]]:
    """RQ 3's first half of ``queue.enqueue_dependents(job)``: the job's dependents that may run
    now, moved to their ReadyJobRegistry; returns their ids by queue name, for
    ``queue.enqueue_ready_jobs_by_queue``, the second half.

    RQ 2 enqueues dependents in one step (and so does a queue class that overrides
    ``enqueue_dependents``): done here in full, returning nothing left to enqueue.
    The job's status is not read again (the caller has just failed it).
    """
    move = getattr(queue, 'move_dependents_to_ready', None)
    if move is None or type(queue).enqueue_dependents is not _STOCK_ENQUEUE_DEPENDENTS:
        queue.enqueue_dependents(job, refresh_job_status=False)
        return {}
    moved: dict[str, list[str]] = move(job, refresh_job_status=False)
    return moved


def release_rate_limit_slot(job: Job) -> None:
    """Give back the job's rate-limit slot and promote waiting jobs (RQ 3; RQ 2 has no rate limits)."""
    if _rq3_release_slot is not None:
        _rq3_release_slot(job)
