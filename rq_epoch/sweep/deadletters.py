"""The Python side effects of dead letters: what RQ does when a job fails, run once per dead letter.

The sweep script dead-letters a job in the server and lists it in ``<prefix>:epoch:finishing``;
:class:`DeadLetters` claims those entries and runs the job's ``on_failure`` callback, the
exception handlers, its dependents, its failure Result and webhooks, each exactly once whatever
the number of sweepers. A :class:`~rq_epoch.sweep.Sweeper` owns one (its ``dead_letters``, made
from its ``dead_letters_class``) and finishes what each sweep dead-letters with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import WatchError
from rq.job import JobStatus
from rq.serializers import resolve_serializer
from rq.timeouts import BaseDeathPenalty, UnixSignalDeathPenalty
from rq.utils import now

from .. import compat
from ..adapters import rq as rq_adapter
from ..compat import text
from ..errors import StalledJobError
from ..jobs.job import Job, _field
from ..jobs.queue import Queue
from ..protocol import keys, verbs
from ..protocol.report import SweepReport
from ..protocol.verbs import DeadLetterClaim
from ..settings import EpochSettings
from .dependents import BatchDependents

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['CLAIM_BATCH', 'CLAIM_TTL', 'DeadLetters']

logger = logging.getLogger('rq_epoch')

#: Dead letters claimed (and then finished, with one transaction for their failure Results) at a time.
CLAIM_BATCH = 100
#: Seconds a claim holds its dead letters; the next sweep by anyone finishes those of a sweeper that died.
CLAIM_TTL = 300


class DeadLetters:
    """Finishes dead letters: claims them and runs their side effects (see the module).

    ``max_stalled`` is the stall budget of a job without one of its own (None: the
    environment's, ``RQ_EPOCH_MAX_STALLED``); ``job_class`` an epoch job class (see
    :func:`rq_epoch.epoch_job_class`) and ``serializer`` those of the jobs; ``queue_class`` the
    class of the queues their dependents are enqueued with; ``claim_ttl`` the seconds a claim
    holds; ``death_penalty_class`` bounds ``on_failure`` callbacks; ``exception_handlers`` are
    called as a worker calls its own, with :class:`~rq_epoch.StalledJobError`.

    Subclassing points (name the subclass in :attr:`Sweeper.dead_letters_class
    <rq_epoch.sweep.Sweeper.dead_letters_class>`): :meth:`failure_reason` (the text of a dead
    letter's failure) and :meth:`log_dead_letter`.
    """

    def __init__(
        self,
        connection: Redis,
        *,
        max_stalled: int | None = None,
        job_class: type[Job] = Job,
        queue_class: type[Queue] = Queue,
        serializer: Any = None,
        claim_ttl: int = CLAIM_TTL,
        death_penalty_class: type[BaseDeathPenalty] = UnixSignalDeathPenalty,
        exception_handlers: Sequence[Callable[..., Any]] = (),
    ) -> None:
        self.connection = connection
        self.max_stalled = max_stalled if max_stalled is not None else EpochSettings.resolve().max_stalled
        self.job_class = job_class
        self.queue_class = queue_class
        self.serializer = resolve_serializer(serializer)
        self.claim_ttl = claim_ttl
        self.death_penalty_class = death_penalty_class
        self.exception_handlers = list(exception_handlers)

    def finish(self, report: SweepReport | None = None, limit: int = 1000) -> list[str]:
        """Run the side effects of dead letters nobody has finished (claimed, bounded); returns the job ids finished.

        With a ``report``, they are added to its ``finished``.
        """
        done: list[str] = []
        while len(done) < limit:
            claimed = verbs.claim(
                self.connection, [keys.finishing_key()], [min(CLAIM_BATCH, limit - len(done)), self.claim_ttl]
            )
            if not claimed:
                break
            done.extend(self.finish_many(claimed))
        if report is not None:
            report.finished.extend(done)
        return done

    def failure_reason(self, job: Job, max_stalled: int, epochs: Any = None, at: str | None = None) -> str:
        """The text of a dead letter's failure, as ``exc_info`` and in its failure Result.

        ``epochs`` is the job's ``stall_epochs`` field when the caller has read it already;
        ``at`` the time its side effects run, in ISO format (now when not given: a batch
        gives each of its dead letters the time it started).
        """
        if epochs is None:
            epochs = self.connection.hget(job.key, 'stall_epochs')
        epoch_list = text(epochs).split(',') if epochs else [job.lease_epoch or '']
        unique = ', '.join(dict.fromkeys(e for e in epoch_list if e)) or '(none)'
        return (
            f'{StalledJobError.__name__}: job stalled {job.stalled} time(s) (max_stalled {max_stalled}): '
            f'its workers went away while the server stayed up; '
            f'counted under server epoch(s) {unique}; dead-lettered by rq-epoch at {at or now().isoformat()}'
        )

    def log_dead_letter(self, job: Job, queue_name: str, reason: str) -> None:
        """Log a dead letter whose side effects have run (one line on the ``rq_epoch`` logger)."""
        logger.error('sweep: job %s dead-lettered to FailedJobRegistry of %s: %s', job.id, queue_name, reason)

    def finish_many(self, claims: Sequence[DeadLetterClaim]) -> list[str]:
        """Side effects of claimed dead letters, a batch at a time; returns the job ids finished.

        One round trip reads every job hash (its stall epochs included) and whether the job
        has dependents; callbacks and handlers run per job, dependents only for jobs that
        have some (on RQ 3, the dependents every job of the batch made ready are pushed onto
        their queues together, see :meth:`_enqueue_ready`); one transaction then writes every
        failure Result and removes the finishing entries, so each Result exists exactly once.
        If one of the jobs' hashes changes meanwhile (someone else wrote its outcome), the
        batch falls back to one transaction per job (see :meth:`_record_failures`).
        """
        finishing = keys.finishing_key()
        job_class = self.job_class
        with self.connection.pipeline(transaction=False) as pipe:
            for claim in claims:
                pipe.hgetall(job_class.key_for(claim.job_id))
                pipe.exists(job_class.dependents_key_for(claim.job_id))
            replies = pipe.execute()
        # Two replies per claim, in the order they were queued: the job hash, whether it has dependents.
        read = zip(claims, replies[0::2], replies[1::2], strict=True)
        ready: list[tuple[DeadLetterClaim, Job, str]] = []
        moot = []
        batch = _Batch()
        at = now().isoformat()
        for claim, fields, has_dependents in read:
            job = self._restore(claim.job_id, fields)
            if job is None or job.get_status(refresh=False) != JobStatus.FAILED:
                moot.append(claim.member)  # gone, or requeued by hand before we finished
                continue
            epochs = _field(fields, 'stall_epochs') or ''
            reason = self.failure_reason(job, job.max_stalled or self.max_stalled, epochs, at)
            self._side_effects(job, claim.queue, reason, bool(has_dependents), batch)
            ready.append((claim, job, reason))
        self._enqueue_ready(batch)
        if moot:
            self.connection.zrem(finishing, *moot)
        recorded = self._record_failures(ready)
        for claim, job, reason in ready:
            if claim in recorded:
                self._after_failure(job, reason)
        return [job.id for claim, job, _ in ready if claim in recorded]

    def _restore(self, job_id: str, raw: Any) -> Job | None:
        """The job read from its hash as ``Job.fetch_many`` makes it; None if it is gone or unreadable."""
        if not raw:
            return None
        job = self.job_class(job_id, connection=self.connection)
        # Resolved once, in __init__: RQ's Job resolves a serializer it is given again, with
        # a runtime protocol check that costs more than the rest of the job object.
        job.serializer = self.serializer
        try:
            job.restore(raw)
        except Exception:
            logger.exception('sweep: dead letter %s cannot be read; its side effects are not run', job_id)
            return None
        return job

    def _side_effects(self, job: Job, queue_name: str, reason: str, has_dependents: bool, batch: _Batch) -> None:
        """The job's ``on_failure`` callback, the exception handlers, and its dependents.

        A job with dependents is added to ``batch.parents``: :meth:`_enqueue_ready` enqueues
        the dependents of all of them together. With a queue or job class that overrides how
        dependents are enqueued, they are enqueued here, job by job (see
        :meth:`~rq_epoch.sweep.dependents.BatchDependents.enqueue_one`); on RQ 3 they are made ready,
        and pushed by :meth:`_enqueue_ready`.
        """
        error = StalledJobError(reason)
        self._run_failure_callback(job, error)
        for handler in self.exception_handlers:
            try:
                if handler(job, StalledJobError, error, None) is False:
                    break
            except Exception:
                logger.exception('sweep: exception handler for job %s raised', job.id)
        if not has_dependents:
            return
        queue = batch.queues.get(queue_name)
        if queue is None:
            queue = batch.queues[queue_name] = self.queue_class(
                queue_name, connection=self.connection, serializer=self.serializer, job_class=self.job_class
            )
        if BatchDependents.applies_to(queue):
            batch.parents.setdefault(queue_name, []).append(job)
            return
        try:
            dependents = BatchDependents(queue, batch.enqueued)
            for target, job_ids in dependents.enqueue_one(job).items():
                batch.made_ready.setdefault(queue_name, {}).setdefault(target, []).extend(job_ids)
        except Exception:
            logger.exception('sweep: could not enqueue dependents of job %s', job.id)

    def _enqueue_ready(self, batch: _Batch) -> None:
        """Enqueue the dependents of the batch's ``parents`` and push those already
        ``made_ready`` (RQ 3) onto their queues.

        RQ's ``enqueue_dependents`` is an optimistic transaction per job (on RQ 3 two steps,
        the second one per dependent); :class:`~rq_epoch.sweep.dependents.BatchDependents` takes
        each step once for the batch. A dependent left in a ReadyJobRegistry (a sweeper that
        dies in between) is enqueued by RQ's maintenance of that registry, as when RQ's own
        second step is interrupted.
        """
        for queue_name in dict.fromkeys([*batch.made_ready, *batch.parents]):
            queue = batch.queues[queue_name]
            by_target = batch.made_ready.get(queue_name, {})
            if queue_name in batch.parents:
                dependents = BatchDependents(queue, batch.enqueued)
                try:
                    for target, job_ids in dependents.move_to_ready(batch.parents[queue_name]).items():
                        by_target.setdefault(target, []).extend(job_ids)
                    dependents.enqueue_ready(by_target)
                except Exception:
                    logger.exception('sweep: could not enqueue the dependents of dead letters of %s', queue_name)
                continue
            try:
                queue.enqueue_ready_jobs_by_queue(by_target)  # type: ignore[attr-defined]  # RQ 3
            except Exception:
                logger.exception('sweep: could not enqueue the dependents made ready by dead letters of %s', queue_name)

    def _record_failures(self, ready: list[tuple[DeadLetterClaim, Job, str]]) -> set[DeadLetterClaim]:
        """One transaction for the batch; job by job if one of its jobs changed meanwhile.

        Only entries still in the finishing set are recorded. The transaction watches the
        jobs' hashes, not the finishing set: every sweeper writes that set all the time
        (verdicts, claims), while a job's hash changes under a claimed batch only when
        someone else wrote its outcome (a sweeper that claimed it after this claim
        expired, or a requeue by hand).
        """
        if not ready:
            return set()
        finishing = keys.finishing_key()
        with self.connection.pipeline() as pipeline:
            try:
                pipeline.watch(*(job.key for _, job, _ in ready))
                scores = pipeline.zmscore(finishing, [claim.member for claim, _, _ in ready])
                pipeline.multi()
                kept = set()
                for (claim, job, reason), score in zip(ready, scores, strict=True):
                    if score is None:
                        continue
                    kept.add(claim)
                    self._queue_failure(pipeline, job, reason)
                if kept:
                    pipeline.zrem(finishing, *(claim.member for claim in kept))
                pipeline.execute()
            except WatchError:
                kept = {claim for claim, job, reason in ready if self._record_failure(job, claim.member, reason)}
        for claim, job, reason in ready:
            if claim in kept:
                self.log_dead_letter(job, claim.queue, reason)
        return kept

    def _run_failure_callback(self, job: Job, error: StalledJobError) -> None:
        try:
            compat.execute_failure_callback(job, self.death_penalty_class, StalledJobError, error, None)
        except Exception:
            logger.exception('sweep: on_failure callback of job %s raised', job.id)

    @staticmethod
    def _queue_failure(pipeline: Any, job: Job, reason: str) -> None:
        """Queue RQ's failure bookkeeping (status, job hash, registry, Result); the caller drops the finishing entry."""
        job.ended_at = now()  # written by RQ's job.save() in the bookkeeping, with the status
        rq_adapter.record_job_failure(job, reason, pipeline)

    def _record_failure(self, job: Job, member: str, reason: str) -> bool:
        """One job's failure bookkeeping, if its finishing entry is still there (a few tries)."""
        finishing = keys.finishing_key()
        for _ in range(10):
            with self.connection.pipeline() as pipeline:
                try:
                    pipeline.watch(job.key)
                    if pipeline.zscore(finishing, member) is None:
                        return False
                    pipeline.multi()
                    self._queue_failure(pipeline, job, reason)
                    pipeline.zrem(finishing, member)
                    pipeline.execute()
                    return True
                except WatchError:
                    continue
        return False

    def _after_failure(self, job: Job, reason: str) -> None:
        try:
            compat.release_rate_limit_slot(job)
        except Exception:
            logger.exception('sweep: could not release the rate-limit slot of job %s', job.id)
        send = getattr(job, 'send_webhooks', None)
        if send is not None:
            try:
                send(JobStatus.FAILED, exc_string=reason)
            except Exception:
                logger.exception('sweep: failed webhooks of job %s raised', job.id)


@dataclass
class _Batch:
    """What the side effects of one claimed batch of dead letters share."""

    #: Queue objects by name.
    queues: dict[str, Queue] = field(default_factory=dict)
    #: Jobs with dependents, per queue, for :class:`~rq_epoch.sweep.dependents.BatchDependents`.
    parents: dict[str, list[Job]] = field(default_factory=dict)
    #: Dependents RQ 3 moved to a ReadyJobRegistry job by job: per queue, by target queue.
    made_ready: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    #: Dependents enqueued (or made ready) for a job of the batch: another job of the batch
    #: does not enqueue them again (see :mod:`rq_epoch.sweep.dependents`).
    enqueued: set[str] = field(default_factory=set)
