"""The outcomes a worker records, fenced: they land only while the execution holds its lease.

:class:`OutcomeWriter` is what :class:`rq_epoch.Worker`'s outcome handlers (success, failure,
retry, the end of an execution) write through: each RQ transaction that records an outcome is
armed with the execution's :class:`~rq_epoch.worker.fence.Fence` (see ``Worker.cleanup_execution``),
and written again after a server outage, with backoff, until it lands or the fence refuses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rq.job import Job as RQJob

from ..errors import CONNECTION_ERRORS, OutcomeRefused
from ..jobs.jobclass import adopt

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['OutcomeWriter', 'with_backoff']

T = TypeVar('T')


class OutcomeWriter:
    """Writes the outcomes of a worker's executions: fenced, and riding out server outages.

    The worker hands it RQ's recording of an outcome (a call that builds and commits RQ's
    transaction, armed with the execution's fence by ``Worker.cleanup_execution``); the
    writer calls it again after a connection error, with backoff, until it lands, the fence
    refuses it, or the worker's time limit has passed.

    ``before_write()`` runs before the first attempt (the worker makes sure it talks to the
    current primary).
    """

    def __init__(
        self,
        connection: Redis,
        *,
        log: logging.Logger | logging.LoggerAdapter[Any],
        name: str,
        max_backoff: float,
        before_write: Callable[[], None],
    ) -> None:
        self.connection = connection
        self.log = log
        self.name = name
        #: Longest pause, in seconds, between two attempts.
        self.max_backoff = max_backoff
        self.before_write = before_write

    def write(self, job: RQJob, what: str, write: Callable[[], object], give_up: float) -> OutcomeRefused | None:
        """Run ``write`` (RQ's recording of the ``what`` of ``job``), fenced, riding out an outage
        until the monotonic time ``give_up``.

        Returns the fence's refusal, for the worker to report, or None once the outcome
        landed. On a connection error it waits with exponential backoff and tries again; a
        first attempt that landed after all makes the next one find the lease gone ("gone"),
        which is logged as landed: an outcome is never written twice.

        Raises:
            redis.exceptions.ConnectionError: the server did not come back before ``give_up``.
        """
        adopt(job)
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
                return None
            return refusal
        if failures:
            self.log.warning(
                'Worker %s: server back; %s of job %s recorded after %d attempt(s)',
                self.name,
                what,
                job.id,
                failures + 1,
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
