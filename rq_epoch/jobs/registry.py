"""RQ's StartedJobRegistry, with leases managed by rq-epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rq.registry import StartedJobRegistry as RQStartedJobRegistry

from . import keys, scripts
from .job import Job

if TYPE_CHECKING:
    from redis.client import Pipeline
    from rq.executions import Execution
    from rq.job import Job as RQJob

__all__ = ['StartedJobRegistry']

#: RQ's score for "never expires"; stock cleanup ignores such entries.
NO_EXPIRY = '+inf'


class StartedJobRegistry(RQStartedJobRegistry):
    """The registry of running jobs, whose expiry is rq-epoch's business.

    The entry in RQ's ``<prefix>:wip:<queue>`` keeps RQ's "no expiry" score, so no stock
    cleanup (``rq info``, dashboards, stock workers) can fail or retry a managed job. The
    lease deadline lives in ``<prefix>:epoch:lease:<queue>`` (one entry per job, named by
    the job id; the job's ``lease_execution`` says which execution holds it), written with
    the stamp by the grant and extend scripts, and :meth:`cleanup` is the epoch-aware sweep.
    """

    job_class = Job

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.leases_key = keys.leases_key(self.name)
        #: Index, in the pipeline, of the extend script queued by the last heartbeat.
        self.extend_index: int | None = None

    def add_execution(self, execution: Execution, pipeline: Pipeline, ttl: int = 0, xx: bool = False) -> int:
        """Register an execution: RQ's entry with no expiry, and the stamped lease.

        Without ``xx`` (an execution starting) RQ's entry is written and the grant script
        queued; with ``xx`` (a heartbeat) only the extend script is, which also gives RQ's
        entry its "no expiry" score again, so that a heartbeat sends no more commands than
        RQ's own. :attr:`extend_index` says where the extend script's answer is. Both
        scripts also note the server alive as primary (at most once a second per server; see
        ``note_alive`` in ``lua/_epoch.lua``), in the same command.
        """
        lease_args = [execution.job_id, max(int(ttl), 1), execution.id, keys.PREFIX]
        if xx:
            self.extend_index = len(pipeline)
            scripts.extend().queue(pipeline, self.extend_keys(execution.job_id), lease_args)
        else:
            pipeline.zadd(self.key, {execution.composite_key: NO_EXPIRY})
            scripts.grant().queue(pipeline, self.grant_keys(execution.job_id), lease_args)
        return 0

    def extend_keys(self, job_id: str) -> list[str]:
        """KEYS of the extend script for a job of this queue: the lease, the job, RQ's entry."""
        return [self.leases_key, keys.job_key(job_id), self.key]

    def grant_keys(self, job_id: str) -> list[str]:
        """KEYS of the grant script for a job of this queue.

        Besides the lease and the job, the grant removes the job's entry from RQ's
        intermediate list (where the take left it) and its first sighting by a sweep, and
        RQ's registry entry of the execution whose lease it replaces, if any.
        """
        return [
            self.leases_key,
            keys.job_key(job_id),
            keys.intermediate_key(self.name),
            keys.limbo_key(self.name),
            self.key,
        ]

    def remove_execution(
        self,
        execution: Execution,
        job: RQJob | None = None,
        pipeline: Pipeline | None = None,
        delete_job: bool = False,
    ) -> None:
        """Remove RQ's entry and the lease of an execution that ended.

        The lease is the job's (member: the job id). An outcome's transaction, where RQ
        calls this, is fenced (:mod:`rq_epoch.fence`): it runs only while this execution
        holds the lease, so a newer execution's lease is never removed by an older one.
        """
        super().remove_execution(execution, job=job, pipeline=pipeline, delete_job=delete_job)
        connection = pipeline if pipeline is not None else self.connection
        connection.zrem(self.leases_key, execution.job_id)

    def cleanup(self, timestamp: float | None = None, exception_handlers: list | None = None) -> None:
        """Run the epoch-aware sweep on this queue (instead of RQ's abandoned-job cleanup).

        ``timestamp`` is ignored: expiry is judged by the server clock.
        """
        from .sweep import Sweeper

        sweeper = Sweeper(
            self.connection,
            job_class=self.job_class,
            serializer=self.serializer,
            exception_handlers=exception_handlers,
        )
        sweeper.sweep([self.name])
