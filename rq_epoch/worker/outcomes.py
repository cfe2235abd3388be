"""The outcomes a worker records, fenced: they land only while the execution holds its lease.

:class:`FencedOutcomes` is the layer of :class:`rq_epoch.Worker` over RQ's outcome handlers
(success, failure, retry, the end of an execution): each RQ transaction that records an
outcome is armed with the execution's :class:`~rq_epoch.worker.fence.Fence`, and written again
after a server outage, with backoff, until it lands or the fence refuses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rq.job import Job as RQJob
from rq.worker import Worker as RQWorker

from .. import compat
from ..adapters import redis_py
from ..errors import CONNECTION_ERRORS, OutcomeRefused
from ..jobs.job import EpochJobMixin
from ..jobs.jobclass import adopt
from ..settings import EpochSettings
from .fence import Fence, arm

if TYPE_CHECKING:
    from redis.client import Pipeline
    from rq.queue import Queue as RQQueue

__all__ = ['FencedOutcomes', 'with_backoff']

T = TypeVar('T')


class FencedOutcomes(RQWorker):
    """RQ's outcome handlers, fenced and riding out outages (a base of :class:`rq_epoch.Worker`)."""

    epoch_settings: EpochSettings
    #: Longest wait, in seconds, for the server to return while an outcome is unwritten.
    outcome_retry_limit: float = 600.0
    #: Jobs whose lease this worker saw a sweep take: their failure is not this worker's to record.
    _lost_lease_job_ids: set[str]

    def _follow_primary(self) -> None:
        """Before an outcome is written: make sure this process talks to the current primary
        (:class:`rq_epoch.Worker` asks its :class:`~rq_epoch.worker.failover.PrimaryWatch`)."""

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

    def handle_job_failure(self, job: RQJob, *args: Any, **kwargs: Any) -> None:
        """Fail (or retry, or stop) a job as RQ does, fenced; rides out a server outage.

        A job whose lease this worker saw a sweep take is not failed at all: it is not ours.
        """
        if job.id in self._lost_lease_job_ids:
            self._lost_lease_job_ids.discard(job.id)
            self.log.info('Worker %s: not failing job %s, whose lease a sweep took', self.name, job.id)
            return
        self.write_outcome(job, 'failure', lambda: super(FencedOutcomes, self).handle_job_failure(job, *args, **kwargs))

    def handle_job_success(self, job: RQJob, *args: Any, **kwargs: Any) -> None:
        """Record a success as RQ does, fenced; rides out a server outage."""
        self.write_outcome(job, 'success', lambda: super(FencedOutcomes, self).handle_job_success(job, *args, **kwargs))

    def handle_job_retry(self, job: RQJob, *args: Any, **kwargs: Any) -> None:
        """Requeue a job that returned :class:`rq.Retry` as RQ does, fenced; rides out an outage."""
        self.write_outcome(job, 'retry', lambda: super(FencedOutcomes, self).handle_job_retry(job, *args, **kwargs))

    def handle_execution_ended(self, job: RQJob, queue: RQQueue, heartbeat_ttl: int) -> None:
        rq_end = super().handle_execution_ended
        self.write_outcome(job, 'end', lambda: rq_end(job, queue, heartbeat_ttl))

    def write_outcome(self, job: RQJob, what: str, write: Callable[[], object]) -> None:
        """Run ``write`` (RQ's recording of a job's outcome), fenced, riding out a server outage.

        The commit inside ``write`` is fenced (see :meth:`cleanup_execution`): if this
        execution no longer holds the lease, nothing of it lands and
        :meth:`outcome_refused` reports it. On a connection error it waits with
        exponential backoff and tries again, for up to :attr:`outcome_retry_limit`
        seconds; a first attempt that landed after all makes the next one find the lease
        gone, so an outcome is never written twice.
        """
        adopt(job)
        give_up = time.monotonic() + self.outcome_retry_limit
        failures = 0

        def unreachable(exc: Exception, attempt: int) -> None:
            nonlocal failures
            failures = attempt + 1
            if attempt == 0:
                self.log.warning(
                    'Worker %s: server unreachable while recording the %s of job %s (%s); retrying',
                    self.name,
                    what,
                    job.id,
                    exc,
                )

        self._follow_primary()
        try:
            self.with_backoff(write, give_up, unreachable)
        except OutcomeRefused as refusal:
            if failures and refusal.reason == 'gone':
                self.log.info('Worker %s: %s of job %s was recorded before the outage', self.name, what, job.id)
            else:
                self.outcome_refused(job, what, refusal)
            return
        if failures:
            self.log.warning(
                'Worker %s: server back; %s of job %s recorded after %d attempt(s)',
                self.name,
                what,
                job.id,
                failures + 1,
            )

    def outcome_refused(self, job: RQJob, what: str, refusal: OutcomeRefused) -> None:
        """Report an outcome the fence refused: one WARNING line (the server counted it)."""
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

    def _outcome_landed(self, job: RQJob) -> bool:
        status = self.connection.hget(job.key, 'status')
        return status is None or status != b'started'

    def _max_backoff(self) -> float:
        return float(min(self.max_connection_wait_time, max(1, self.epoch_settings.heartbeat_interval)))

    def with_backoff(
        self,
        call: Callable[[], T],
        give_up: float,
        on_error: Callable[[Exception, int], None] | None = None,
    ) -> T:
        """Return ``call()``, tried again on a connection error until the monotonic time ``give_up``.

        Waits 0.1 s after the first failure, doubling up to one heartbeat interval (at most
        RQ's ``max_connection_wait_time``); see :func:`with_backoff`.
        """
        return with_backoff(call, give_up, self._max_backoff(), on_error)


def with_backoff(
    call: Callable[[], T],
    give_up: float,
    max_delay: float,
    on_error: Callable[[Exception, int], None] | None = None,
) -> T:
    """Return ``call()``, tried again on a connection error until the monotonic time ``give_up``.

    Waits 0.1 s after the first failure, doubling up to ``max_delay``. ``on_error`` is told
    each failure and its attempt number (from 0). The last connection error is raised when
    the next wait would end past ``give_up``; any other exception is raised at once.
    """
    delay, attempt = 0.1, 0
    while True:
        try:
            return call()
        except CONNECTION_ERRORS as exc:
            if on_error is not None:
                on_error(exc, attempt)
            if time.monotonic() + delay > give_up:
                raise
            time.sleep(delay)
            delay, attempt = min(delay * 2, max_delay), attempt + 1
