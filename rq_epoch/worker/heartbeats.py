"""Keeping a lease: the grant at the start of an execution and the heartbeat that extends it.

:class:`Heartbeats` is the layer of :class:`rq_epoch.Worker` that grants a lease stamped with
the server's run_id when RQ prepares an execution, extends and re-stamps it at every heartbeat
(in the round trip of RQ's own heartbeat), rides out a server that does not answer, and stops
the work-horse when a sweep took the lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis.exceptions
from rq.job import Job as RQJob
from rq.utils import now

from .. import compat
from ..errors import RqEpochError
from ..jobs.job import EpochJobMixin, StartedJobRegistry
from ..jobs.jobclass import adopt
from ..protocol import keys, scripts, verbs
from .fence import Fence
from .outcomes import CONNECTION_ERRORS, FencedOutcomes

if TYPE_CHECKING:
    from redis import Redis
    from rq.executions import Execution
    from rq.queue import Queue as RQQueue

    from .failover import PrimaryWatch

__all__ = ['Heartbeats']

T = TypeVar('T')


class Heartbeats(FencedOutcomes):
    """Grants, heartbeats and lost leases (a base of :class:`rq_epoch.Worker`)."""

    _known_run_id: str | None
    _server_lost_at: float | None
    primary_watch: PrimaryWatch | None

    def _keep_scheduler(self, force: bool = False) -> None:
        """Start RQ's scheduler again if it died (:class:`rq_epoch.Worker` does; here nothing)."""

    def _sweep_if_due(self) -> None:
        """Sweep when the sweep interval has passed (:class:`rq_epoch.Worker` does; here nothing)."""

    def get_heartbeat_ttl(self, job: RQJob, working_time: float = 0.0) -> int:
        """Seconds the lease lasts past this heartbeat: the interval plus the lease margin."""
        interval = self.epoch_settings.heartbeat_interval
        if job.timeout and job.timeout > 0:
            if not working_time and job.started_at:
                working_time = (now() - job.started_at).total_seconds()
            interval = max(1, int(min(job.timeout - working_time, interval)))
        return interval + self.epoch_settings.lease_margin

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
            registry = StartedJobRegistry(job.origin, connection=self.connection, job_class=self.job_class)
            verbs.grant(
                self.connection,
                registry.grant_keys(job.id),
                [job.id, self.get_heartbeat_ttl(job), execution.id, keys.PREFIX],
            )
        cast(EpochJobMixin, job).fence = Fence(job.origin, job.id, execution.id)
        return execution

    def perform_job(self, job: RQJob, queue: RQQueue, *args: Any, **kwargs: Any) -> bool:
        """Run the job as RQ does (in the work-horse, or in-process), as the execution that holds its lease.

        A job object without the epoch behaviour is given it, and one that does not carry
        its execution's fence yet (a spawned work-horse fetched it anew) is given it.
        """
        leased = cast(EpochJobMixin, adopt(job))
        execution = kwargs.get('execution') or (args[0] if args else None) or self.execution
        if leased.fence is None and execution is not None and execution.job_id == job.id:
            leased.fence = Fence(job.origin, job.id, execution.id)
        leased.ride_out = lambda call: self.ride_out_before_function(job, call)
        return bool(super().perform_job(job, queue, *args, **kwargs))

    def ride_out_before_function(self, job: RQJob, call: Callable[[], T]) -> T:
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

        return self.with_backoff(call, give_up, unreachable)

    def prepare_job_execution(self, job: RQJob, *args: Any, **kwargs: Any) -> None:
        """RQ's preparation in the work-horse (status "started"), riding out a server outage.

        The job has not run yet: a connection error here must not fail it. RQ's writes are
        one transaction and idempotent, so they are tried again with backoff; meanwhile
        the worker keeps heartbeating and stops this horse if a sweep takes the lease.
        """
        give_up = time.monotonic() + self.outcome_retry_limit
        self.with_backoff(lambda: super(Heartbeats, self).prepare_job_execution(job, *args, **kwargs), give_up)

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
        deadline = time.monotonic() + self.epoch_settings.heartbeat_interval
        try:
            reply = self.with_backoff(
                lambda: self._heartbeat_lease(job, execution), deadline, lambda exc, _: self._server_unreachable(exc)
            )
        except CONNECTION_ERRORS:
            return  # the next heartbeat goes on trying
        self._server_reachable(reply.run_id)
        if not reply.extended and reply.taken:
            # A sweep took this execution's lease (its record names this execution). A
            # lease that is gone without such a record was ended by the work-horse's own
            # commit, which may still be running RQ's steps that follow it.
            self._lease_lost(job, reply.taken)
        self._sweep_if_due()

    def _heartbeat_lease(self, job: RQJob, execution: Execution, connection: Redis | None = None) -> verbs.ExtendReply:
        """One heartbeat round trip; returns what the extend script found.

        ``connection``: the client to send it with (a lease keeper thread has its own).
        """
        connection = connection if connection is not None else self.connection
        worker_ttl = self.job_monitoring_interval + 60
        if compat.HEARTBEAT_TTL_TAKES_WORKING_TIME:  # RQ 3 passes the working time, measured from the job's start
            working_time = (now() - job.started_at).total_seconds() if job.started_at else 0.0
            ttl = int(self.get_heartbeat_ttl(job, working_time=working_time))
        else:
            ttl = int(self.get_heartbeat_ttl(job))
        registry = cast(EpochJobMixin, adopt(job)).heartbeat_registry
        registry.extend_index = None  # set again when RQ's heartbeat registers the execution
        with connection.pipeline() as pipeline:
            self.heartbeat(worker_ttl, pipeline=pipeline)
            execution.heartbeat(registry, ttl, pipeline=pipeline)
            job_index = len(pipeline)
            job.heartbeat(now(), ttl, pipeline=pipeline, xx=True)
            results = pipeline.execute(raise_on_error=False)
            extend_index = registry.extend_index
            extend_result = results[extend_index] if extend_index is not None else None
            for index, result in enumerate(results):
                if isinstance(result, redis.exceptions.ResponseError) and index != extend_index:
                    if not isinstance(result, redis.exceptions.NoScriptError):
                        raise result
            reply: verbs.ExtendReply | None = None
            if isinstance(extend_result, redis.exceptions.NoScriptError):
                scripts.load_all(connection)
                reply = verbs.extend(
                    connection, registry.extend_keys(job.id), [job.id, max(ttl, 1), execution.id, keys.PREFIX]
                )
            elif isinstance(extend_result, redis.exceptions.ResponseError):
                scripts.raise_typed(extend_result)
            elif extend_result is not None:
                reply = verbs.ExtendReply.read(extend_result)
            # RQ's follow-up, on the same pipeline: sent only when there is something to send.
            if results[job_index] == 1:  # the job hash was gone: don't leave a stub (rq#1450)
                pipeline.delete(job.key)
            if results[0] == 1:  # the worker hash had expired
                pipeline.hset(self.key, mapping=self.serialize())
                pipeline.expire(self.key, worker_ttl)
            pipeline.execute()
        if reply is None:
            raise RqEpochError(
                f'the heartbeat of job {job.id} carried no lease extension: its registry is not '
                "rq-epoch's StartedJobRegistry (a job class without the epoch behaviour?)"
            )
        return reply

    def _server_unreachable(self, exc: Exception) -> None:
        if self._server_lost_at is None:
            self._server_lost_at = time.monotonic()
            self.log.warning(
                'Worker %s: server unreachable (%s); keeping the work-horse running and retrying (last epoch %s)',
                self.name,
                exc,
                self._known_run_id,
            )

    def _server_reachable(self, run_id: str) -> None:
        if self._server_lost_at is not None:
            down = time.monotonic() - self._server_lost_at
            self._server_lost_at = None
            self.log.warning(
                'Worker %s: server back after %.1fs; epoch %s -> %s',
                self.name,
                down,
                self._known_run_id,
                run_id,
            )
            try:
                self._keep_scheduler(force=True)
            except CONNECTION_ERRORS:
                pass
        elif self._known_run_id and run_id != self._known_run_id:
            if self.primary_watch is None or not self.primary_watch.announced(run_id):
                self.log.warning('Worker %s: server epoch changed %s -> %s', self.name, self._known_run_id, run_id)
        if run_id != self._known_run_id:
            try:
                scripts.load_all(self.connection)
            except CONNECTION_ERRORS:
                pass
        self._known_run_id = run_id

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
