"""The dependents of a batch of dead letters, enqueued in a few round trips.

RQ's ``Queue.enqueue_dependents(job)`` is an optimistic transaction per failed job: WATCH the
job's dependents set, read it, read each dependent and, with their hashes WATCHed, the status
of its other dependencies; then MULTI and the writes. RQ 3 splits it in two steps: the
dependents are moved to their ``ReadyJobRegistry`` (``move_dependents_to_ready``), then pushed
onto their queues by ``ReadyJobRegistry.enqueue_jobs``, one WATCH/MULTI/EXEC per dependent.
That is about ten round trips for a job with one dependent, most of the cost of a dead
letter that has dependents.

:class:`BatchDependents` takes each step once for every dead letter of a claimed batch: the
same checks, on the same keys WATCHed by the transaction that writes, the writes queued by
RQ's own registry and queue methods, in about ten round trips for the whole batch. When a
watched key changes meanwhile (another worker enqueued or finished a dependency), the step is
taken again job by job with RQ's own functions (:meth:`BatchDependents.enqueue_one`), as if
there had been no batch. A queue or job class that overrides one of the methods these steps
stand for is called job by job too.

The sweep script fails every job of a batch before any side effect runs, so a dependent of
two of them may run after the first; RQ's function, which does not read the dependent's own
status, would enqueue it again for the second. Job by job, the dependents enqueued for a job
of the batch are first taken off the others' dependents; a batch enqueues each dependent once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import WatchError
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.queue import Queue as RQQueue
from rq.registry import DeferredJobRegistry

from .. import compat
from ..adapters import rq as rq_adapter
from ..compat import text

if TYPE_CHECKING:
    from rq.job import Job
    from rq.queue import Queue

__all__ = ['BatchDependents']

logger = logging.getLogger('rq_epoch')

#: The methods a batch stands for; a queue or job class that overrides one of them is called job by job.
_STOCK_METHODS: tuple[tuple[type, str], ...] = (
    (RQQueue, 'enqueue_dependents'),
    (RQQueue, 'move_dependents_to_ready'),
    (RQQueue, 'enqueue_ready_jobs_by_queue'),
    (RQJob, 'dependencies_are_met'),
)
_STOCK = {(base, name): getattr(base, name, None) for base, name in _STOCK_METHODS}
#: RQ 3 enqueues dependents in two steps (made ready, then pushed); RQ 2 in one.
_TWO_STEPS = _STOCK[(RQQueue, 'move_dependents_to_ready')] is not None


class BatchDependents:
    """RQ 3's two steps of ``enqueue_dependents``, for the failed jobs of one queue together.

    ``queue`` is the queue the failed jobs came from (its class, job class and serializer
    are used for every queue the dependents go to).
    """

    def __init__(self, queue: Queue, enqueued: set[str] | None = None) -> None:
        self.queue = queue
        self.connection = queue.connection
        #: Dependents enqueued (on RQ 3: made ready) for a job of the batch, shared by its queues.
        self.enqueued: set[str] = set() if enqueued is None else enqueued

    @staticmethod
    def applies_to(queue: Queue) -> bool:
        """Whether a batch may stand for RQ's functions: none of them overridden."""
        for base, name in _STOCK_METHODS:
            owner = type(queue) if base is RQQueue else queue.job_class
            if getattr(owner, name, None) is not _STOCK[(base, name)]:
                return False
        return True

    def move_to_ready(self, parents: Sequence[Job]) -> dict[str, list[str]]:
        """Move the dependents that may run now of every job in ``parents`` (all failed) to
        their queues' ReadyJobRegistry; returns their ids by queue name, for
        :meth:`enqueue_ready`. RQ 2 has no such registry: they are enqueued, and nothing is
        returned.

        One transaction for all of them; job by job with RQ's function if a watched key
        changed meanwhile (see the module's docstring).
        """
        if not parents:
            return {}
        try:
            return self._move_batch(parents)
        except WatchError:
            pass
        except Exception:
            logger.exception('sweep: could not make the dependents of %d dead letters ready at once', len(parents))
        moved: dict[str, list[str]] = {}
        for parent in parents:
            try:
                for name, ids in self.enqueue_one(parent).items():
                    moved.setdefault(name, []).extend(ids)
            except Exception:
                logger.exception('sweep: could not enqueue dependents of job %s', parent.id)
        return moved

    def enqueue_one(self, parent: Job) -> dict[str, list[str]]:
        """One failed job's dependents, with RQ's function (:func:`rq_epoch.compat.move_dependents_to_ready`:
        on RQ 3 made ready, their ids returned by queue name; on RQ 2 enqueued).

        The dependents already enqueued for another job of the batch are taken off this job's
        dependents first (see the module's docstring).
        """
        key = parent.dependents_key
        with self.connection.pipeline(transaction=False) as pipe:
            if self.enqueued:
                pipe.srem(key, *self.enqueued)
            pipe.smembers(key)
            before = {text(m) for m in pipe.execute()[-1]}
        moved = compat.move_dependents_to_ready(self.queue, parent)
        self.enqueued.update(before - {text(m) for m in self.connection.smembers(key)})
        return moved

    def enqueue_ready(self, by_queue: dict[str, list[str]]) -> None:
        """Push the ready dependents ``by_queue`` onto their queues: one transaction per queue,
        RQ's ``ReadyJobRegistry.enqueue_jobs`` (job by job) if a watched key changed meanwhile."""
        for name, ids in by_queue.items():
            target = self._queue(name)
            registry = target.ready_job_registry  # type: ignore[attr-defined]
            try:
                self._enqueue_batch(target, registry, list(dict.fromkeys(ids)))
                continue
            except WatchError:
                pass
            except Exception:
                logger.exception('sweep: could not push %d ready dependents onto %s at once', len(ids), name)
            registry.enqueue_jobs(ids)

    def _queue(self, name: str) -> Queue:
        queue = self.queue
        if name == queue.name:
            return queue
        return type(queue)(name, connection=self.connection, job_class=queue.job_class, serializer=queue.serializer)

    def _fetch(self, ids: list[str]) -> list[Job | None]:
        queue = self.queue
        fetch = queue.job_class.fetch_many
        jobs: list[Job | None] = fetch(ids, connection=self.connection, serializer=queue.serializer)
        return jobs

    def _read(self, commands: Iterable[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Replies to read-only commands, in one round trip (on another connection than the
        transaction's: its WATCH still covers what they read)."""
        with self.connection.pipeline(transaction=False) as read:
            for name, args in commands:
                getattr(read, name)(*args)
            return read.execute()

    def _move_batch(self, parents: Sequence[Job]) -> dict[str, list[str]]:
        """``move_dependents_to_ready(parent, refresh_job_status=False)`` for every parent, in
        one transaction; raises WatchError if a watched key changed."""
        with self.connection.pipeline() as pipe:
            pipe.watch(*(parent.dependents_key for parent in parents))
            members = self._read(('smembers', (parent.dependents_key,)) for parent in parents)
            dependents_of = [sorted(text(m) for m in found) for found in members]
            wanted = list(dict.fromkeys(i for ids in dependents_of for i in ids))
            if not wanted:
                return {}
            dependents = {job.id: job for job in self._fetch(wanted) if job is not None}
            key_for = self.queue.job_class.key_for
            watched = {key_for(d) for job in dependents.values() for d in rq_adapter.dependency_ids(job)}
            if watched:
                pipe.watch(*watched)
            found = self._read(('smembers', (job.dependencies_key,)) for job in dependents.values())
            dependencies = {job_id: {text(d) for d in ids} for job_id, ids in zip(dependents, found, strict=True)}
            others = sorted({d for ids in dependencies.values() for d in ids})
            statuses = dict(zip(others, self._read(('hget', (key_for(d), 'status')) for d in others), strict=True))
            moved: dict[str, list[Job]] = {}
            writes: list[tuple[str, list[str], int]] = []
            for parent, ids in zip(parents, dependents_of, strict=True):
                done = [i for i in ids if i in self.enqueued]  # by another queue's batch, or job by job
                ready = [
                    dependents[i]
                    for i in ids
                    if i in dependents
                    and i not in self.enqueued
                    and _may_run(dependents[i], parent, dependencies[i], statuses)
                ]
                if not ready and not done:
                    continue
                for job in ready:
                    moved.setdefault(job.origin, []).append(job)
                writes.append((parent.dependents_key, [*done, *(job.id for job in ready)], len(ids)))
            if not writes:
                return {}
            pipe.multi()
            for key, taken, total in writes:
                if len(taken) == total:
                    pipe.delete(key)
                else:
                    pipe.srem(key, *taken)
            by_queue: dict[str, list[str]] = {}
            for name, jobs in moved.items():
                unique = list({job.id: job for job in jobs}.values())  # a dependent of two parents once
                if _TWO_STEPS:
                    self._queue(name).ready_job_registry.register_jobs(unique, pipeline=pipe)  # type: ignore[attr-defined]
                    by_queue[name] = [job.id for job in unique]
                else:  # RQ 2: enqueued in the same transaction
                    self._enqueue_now(self._queue(name), unique, pipe)
            pipe.execute()
        self.enqueued.update(job.id for jobs in moved.values() for job in jobs)
        return by_queue

    def _enqueue_now(self, target: Queue, jobs: list[Job], pipe: Any) -> None:
        """RQ 2's writes for dependents that may run: out of the deferred registry, onto the queue."""
        deferred = DeferredJobRegistry(
            target.name, self.connection, job_class=target.job_class, serializer=target.serializer
        )
        for job in jobs:
            deferred.remove(job, pipeline=pipe)
            rq_adapter.push_job(target, job, pipe, at_front=job.enqueue_at_front or False)

    def _enqueue_batch(self, target: Queue, registry: Any, ids: list[str]) -> None:
        """``ReadyJobRegistry.enqueue_jobs(ids)`` in one transaction; raises WatchError if a
        watched key changed."""
        fetched = self._fetch(ids)
        gone = [job_id for job_id, job in zip(ids, fetched, strict=True) if job is None]
        jobs = [job for job in fetched if job is not None]
        with self.connection.pipeline() as pipe:
            if jobs:
                pipe.watch(registry.key, *(job.key for job in jobs))
                replies = self._read(
                    [('zmscore', (registry.key, [job.id for job in jobs]))]
                    + [('hget', (job.key, 'status')) for job in jobs]
                )
            pipe.multi()
            if gone:
                pipe.zrem(registry.key, *gone)
            if jobs:
                for job, score, status in zip(jobs, replies[0], replies[1:], strict=True):
                    if score is None:
                        continue  # another caller took it off the registry
                    registry.remove(job, pipeline=pipe)
                    if text(status) != compat.READY_TO_ENQUEUE:
                        continue
                    if job.has_rate_limit:  # type: ignore[attr-defined]
                        rq_adapter.push_rate_limited_job(target, job, pipe)
                    else:
                        rq_adapter.push_job(target, job, pipe, at_front=job.should_enqueue_at_front())  # type: ignore[attr-defined]
            pipe.execute()


def _may_run(dependent: Job, parent: Job, dependencies: set[str], statuses: dict[str, Any]) -> bool:
    """RQ's ``dependent.dependencies_are_met(parent_job=parent, refresh_job_status=False)``
    and not canceled, with the statuses of the dependencies already read."""
    if dependent.get_status(refresh=False) == JobStatus.CANCELED:
        return False
    parent_status = parent.get_status(refresh=False)
    if parent_status in (JobStatus.CANCELED, JobStatus.STOPPED):
        return False
    if parent_status == JobStatus.FAILED and not dependent.allow_dependency_failures:
        return False
    allowed = {JobStatus.FINISHED.value}
    if dependent.allow_dependency_failures:
        allowed.add(JobStatus.FAILED.value)
    others = dependencies - {parent.id}
    return all(text(statuses[d]) in allowed for d in others if statuses.get(d))
