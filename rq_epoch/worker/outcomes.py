"""The outcomes a worker records, fenced: they land only while the execution holds its lease.

:class:`OutcomeWriter` is what :class:`rq_epoch.Worker`'s outcome handlers (success, failure,
retry, the end of an execution) write through: each RQ transaction that records an outcome is
armed with the execution's :class:`~rq_epoch.worker.fence.Fence` (see ``Worker.cleanup_execution``),
and written again after a server outage, with backoff, until it lands or the fence refuses it.
With ``RQ_EPOCH_DURABLE_REPLICAS`` an outcome that landed is confirmed by replicas too; one that
no replica confirmed is kept, and written again through the same fence on the new primary when
the primary moves (see :meth:`OutcomeWriter.confirm`).

Every attempt at an outcome starts from the job as it was before the first one: RQ's outcome
paths spend the job's counters in memory before they commit (see :data:`SPENT_BY_AN_OUTCOME`),
so an outcome sent again after an outage, or written again on a new primary, would otherwise
spend one more retry (or repeat) each time.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rq.job import Job as RQJob

from ..errors import CONNECTION_ERRORS, OutcomeInterrupted, OutcomeRefused
from ..jobs.jobclass import adopt
from ..protocol.durable import Durability

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['SPENT_BY_AN_OUTCOME', 'OutcomeWriter', 'with_backoff']

T = TypeVar('T')

#: The fields of a job that RQ's outcome paths change in memory before they commit them:
#: ``Job.retry`` spends one of ``retries_left`` (a job enqueued with ``retry=Retry(...)`` that
#: failed), ``Job._handle_retry_result`` adds one to ``number_of_retries`` (a job that returned
#: ``rq.Retry``), ``Repeat.schedule`` spends one of ``repeats_left`` and moves on in
#: ``repeat_intervals``. :meth:`OutcomeWriter.write` puts them back before every attempt.
SPENT_BY_AN_OUTCOME = ('retries_left', 'number_of_retries', 'repeats_left', 'repeat_intervals')


def _from_the_start(job: RQJob, call: Callable[[], T]) -> Callable[[], T]:
    """``call``, each time from the job's :data:`SPENT_BY_AN_OUTCOME` as they are now."""
    before = {name: copy.copy(getattr(job, name)) for name in SPENT_BY_AN_OUTCOME if hasattr(job, name)}

    def attempt() -> T:
        for name, value in before.items():
            setattr(job, name, copy.copy(value))
        return call()

    return attempt


class OutcomeWriter:
    """Writes the outcomes of a worker's executions: fenced, and riding out server outages.

    The worker hands it RQ's recording of an outcome (a call that builds and commits RQ's
    transaction, armed with the execution's fence by ``Worker.cleanup_execution``); the
    writer calls it again after a connection error, with backoff, until it lands, the fence
    refuses it, or the worker's time limit has passed.

    ``before_write()`` runs before the first attempt (the worker makes sure it talks to the
    current primary). ``durability``, when it asks for confirmations, confirms each outcome
    that landed; ``moved()`` asks whether the primary moved (and moves the connections).
    """

    def __init__(
        self,
        connection: Redis,
        *,
        log: logging.Logger | logging.LoggerAdapter[Any],
        name: str,
        max_backoff: float,
        before_write: Callable[[], None],
        durability: Durability | None = None,
        moved: Callable[[], bool] | None = None,
    ) -> None:
        self.connection = connection
        self.log = log
        self.name = name
        #: Longest pause, in seconds, between two attempts.
        self.max_backoff = max_backoff
        self.before_write = before_write
        self.durability = durability
        self.moved = moved or (lambda: False)

    def write(
        self,
        job: RQJob,
        what: str,
        write: Callable[[], object],
        give_up: float,
        confirm: bool = True,
    ) -> OutcomeRefused | None:
        """Run ``write`` (RQ's recording of the ``what`` of ``job``), fenced, riding out an outage
        until the monotonic time ``give_up``.

        Every attempt, here and in :meth:`confirm`, starts from the job's counters as they were
        before the first one (:data:`SPENT_BY_AN_OUTCOME`): a retry is spent once, however
        many times the outcome is sent.

        Returns the fence's refusal, for the worker to report, or None once the outcome
        landed. On a connection error it waits with exponential backoff and tries again; a
        first attempt that landed after all makes the next one find the lease gone ("gone"),
        which is logged as landed: an outcome is never written twice. With durability on,
        the outcome that landed is then confirmed (:meth:`confirm`, which calls ``write``
        again on a new primary), unless ``confirm`` is False (a step that the job's final
        outcome follows, and whose confirmation covers).

        Raises:
            redis.exceptions.ConnectionError: the server did not come back before ``give_up``.
        """
        adopt(job)
        write = _from_the_start(job, write)
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

        self.before_write()
        try:
            self.with_backoff(write, give_up, unreachable)
        except OutcomeRefused as refusal:
            if failures and refusal.reason == 'gone':
                self.log.info('Worker %s: %s of job %s was recorded before the outage', self.name, what, job.id)
                return self.confirm(job, what, write, give_up) if confirm else None
            return refusal
        if failures:
            self.log.warning(
                'Worker %s: server back; %s of job %s recorded after %d attempt(s)',
                self.name,
                what,
                job.id,
                failures + 1,
            )
        return self.confirm(job, what, write, give_up) if confirm else None

    def confirm(self, job: RQJob, what: str, write: Callable[[], object], give_up: float) -> OutcomeRefused | None:
        """Wait until replicas confirm the ``what`` of ``job`` that just landed; None once they do.

        Without durability, or where it cannot work (no replica connected, ``WAIT`` refused),
        returns at once. An outcome no replica confirmed in time is kept: when the primary
        moves (a failover), it is written again there by ``write`` through the same fence. It
        lands if the job is still this execution's there (the failover lost it), is found
        already written (``gone``: it reached the new primary before the failover), or is
        refused because another execution has the job now: that refusal is returned. Until
        the monotonic time ``give_up``; then it stays as written, unconfirmed (one warning).
        """
        durability = self.durability
        if durability is None or not durability.enabled:
            return None
        said = False
        fence = getattr(job, 'fence', None)
        check = (fence.script_keys, fence.script_args('0', 0)) if fence is not None else None
        for _ in range(1_000_000):  # each turn waits up to the durable timeout (the time limit ends it)
            rewrite = False
            try:
                confirmation = durability.confirm(self.connection, check)
            except CONNECTION_ERRORS:
                # The primary is going away: follow it, without asking again at once (a server
                # that refuses connections answers at once, and the turn would spin).
                time.sleep(0.1)
            else:
                here = confirmation.check
                # The fence's check ran on the server that confirmed: this execution still holds
                # the lease there, so the outcome is not there (the connection reached a new
                # primary, by the watch or by itself, that never got it): write it again there.
                rewrite = here is not None and here.lands and here.leased
                if confirmation.confirmed and not rewrite:
                    if said:
                        self.log.warning('Worker %s: the %s of job %s is confirmed', self.name, what, job.id)
                    return None
            if not said:
                said = True
                self.log.warning(
                    'Worker %s: no replica confirmed the %s of job %s within %s ms; keeping it until one does, '
                    'or until the primary moves',
                    self.name,
                    what,
                    job.id,
                    durability.timeout_ms,
                )
            if time.monotonic() >= give_up:
                break
            if not rewrite and not self.moved():
                continue
            self.log.warning(
                'Worker %s: the primary moved before a replica confirmed the %s of job %s; writing it again there',
                self.name,
                what,
                job.id,
            )
            try:
                self.with_backoff(write, give_up)
            except OutcomeRefused as refusal:
                if refusal.reason != 'gone':
                    return refusal
                self.log.info('Worker %s: the %s of job %s had reached the new primary', self.name, what, job.id)
        self.log.warning(
            'Worker %s: the %s of job %s is still not confirmed by a replica; it stays as the primary took it',
            self.name,
            what,
            job.id,
        )
        return None

    def landed(self, job: RQJob) -> bool:
        """Whether an outcome of ``job`` was recorded already: it is no longer "started" (or is gone)."""
        status = self.connection.hget(job.key, 'status')
        return status is None or status != b'started'

    def with_backoff(
        self,
        call: Callable[[], T],
        give_up: float,
        on_error: Callable[[Exception, int], None] | None = None,
    ) -> T:
        """Return ``call()``, tried again on a connection error until the monotonic time ``give_up``.

        Waits 0.1 s after the first failure, doubling up to :attr:`max_backoff`; see
        :func:`with_backoff`.
        """
        return with_backoff(call, give_up, self.max_backoff, on_error)


def with_backoff(
    call: Callable[[], T],
    give_up: float,
    max_delay: float,
    on_error: Callable[[Exception, int], None] | None = None,
) -> T:
    """Return ``call()``, tried again on a connection error until the monotonic time ``give_up``.

    Waits 0.1 s after the first failure, doubling up to ``max_delay``. ``on_error`` is told
    each failure and its attempt number (from 0). An outcome's commit cut short
    (:class:`~rq_epoch.errors.OutcomeInterrupted`) counts as the connection error it carries.
    The last connection error is raised when the next wait would end past ``give_up``; any
    other exception is raised at once.
    """
    delay, attempt = 0.1, 0
    while True:
        error: Exception
        try:
            return call()
        except CONNECTION_ERRORS as exc:
            error = exc
        except OutcomeInterrupted as interrupted:
            error = interrupted.error
        if on_error is not None:
            on_error(error, attempt)
        if time.monotonic() + delay > give_up:
            raise error
        time.sleep(delay)
        delay, attempt = min(delay * 2, max_delay), attempt + 1
