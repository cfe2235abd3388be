"""Errors that rq-epoch raises. All of them derive from :class:`RqEpochError`.

Two exceptions are not errors and stand apart: :class:`OutcomeRefused`, the fence's
refusal of an outcome, and :class:`OutcomeInterrupted`, an outcome's commit cut short by a
connection error, are :class:`BaseException` so that RQ's ``except Exception`` blocks let them
through (see their docstrings); :class:`RqEpochError` is an :class:`Exception`, so nothing can
derive from both.
"""

from __future__ import annotations

import redis.exceptions
from rq.exceptions import AbandonedJobError

__all__ = [
    'ConfigurationError',
    'EnqueueNotConfirmed',
    'EpochUnavailableError',
    'OutcomeInterrupted',
    'OutcomeRefused',
    'RqEpochError',
    'ServerOutageError',
    'StalledJobError',
    'UnsupportedServerError',
]


#: What a worker rides out: the server does not answer, or answers that it takes no writes now
#: (:class:`ServerOutageError` is a ``ConnectionError``).
CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def connection_error_behind(error: redis.exceptions.WatchError) -> Exception | None:
    """The connection error that ``error`` stands for, or None for a real change of a watched key.

    redis-py raises ``WatchError`` (from the connection error) when the connection drops while
    keys are watched: the transaction may or may not have landed.
    """
    cause = error.__cause__ or error.__context__
    return cause if isinstance(cause, CONNECTION_ERRORS) else None


class RqEpochError(Exception):
    """Base class of every error rq-epoch raises."""


class ConfigurationError(RqEpochError, ValueError):
    """A setting (argument or ``RQ_EPOCH_*`` environment variable) has a bad value."""


class EpochUnavailableError(RqEpochError):
    """The server did not yield a valid run_id, so no lease can be stamped or judged.

    Raised at worker start and at sweep start when ``INFO server`` is refused (an ACL
    without ``+info``), or answers without a 40-character hex ``run_id`` (a proxy that
    hides it). rq-epoch never guesses an epoch and never writes a lease without one.
    """


class UnsupportedServerError(RqEpochError):
    """The server is older than rq-epoch needs: Redis before 6.2 (it has no ``BLMOVE``).

    Raised at worker start, at sweep start and by the exporter and ``rq-epoch status``, from
    the ``INFO server`` they read anyway, before anything is written. It is not an outage:
    a worker does not wait for it, and ``rq-epoch worker`` exits at once (status 78).
    ``found`` names the server and its version (``Redis 5.0.6``), ``needed`` what rq-epoch
    needs.
    """

    def __init__(self, found: str, needed: str) -> None:
        self.found = found
        self.needed = needed
        super().__init__(
            f'the server is {found}; rq-epoch needs {needed} '
            '(LMOVE and BLMOVE, with which RQ takes a job from a single queue, came with Redis 6.2)'
        )


class ServerOutageError(RqEpochError, redis.exceptions.ConnectionError):
    """The server answered, but cannot take writes now: ``NOREPLICAS``, ``READONLY``, ``LOADING``,
    ``MASTERDOWN`` or ``TRYAGAIN`` (a primary without its replicas, a demoted primary, a server
    loading its data).

    It is a redis-py ``ConnectionError``: a worker rides it out like a server that does not
    answer (see :mod:`rq_epoch.worker.failover`).
    """


class EnqueueNotConfirmed(RqEpochError):
    """No replica confirmed an enqueued job in time (a durable enqueue, see
    :class:`rq_epoch.Queue`): the job may or may not exist.

    The primary took the job, but its replicas did not confirm it within
    ``RQ_EPOCH_DURABLE_TIMEOUT``: if the primary is replaced now (a failover), the job may be
    lost; if it is not, the job runs as any other. ``job_id`` names it, so that the producer
    can look (``Job.exists(job_id)``) once the server has settled, and enqueue it again if it
    is gone (an enqueue with the same ``job_id`` replaces it). ``replicas`` is how many
    replicas confirmed it, of ``wanted``.
    """

    def __init__(self, job_id: str, replicas: int, wanted: int, timeout_ms: int) -> None:
        self.job_id = job_id
        self.replicas = replicas
        self.wanted = wanted
        self.timeout_ms = timeout_ms
        super().__init__(
            f'job {job_id} was enqueued on the primary, but {replicas} of {wanted} replica(s) confirmed it '
            f'within {timeout_ms} ms: it may or may not exist after a failover; check with '
            f'Job.exists({job_id!r}) and enqueue it again if it is gone'
        )


class StalledJobError(RqEpochError, AbandonedJobError):
    """Passed to ``on_failure`` callbacks of a job that the sweep dead-lettered.

    It subclasses RQ's :class:`~rq.exceptions.AbandonedJobError`, so callbacks that
    already handle abandoned jobs keep working.
    """


class OutcomeRefused(BaseException):
    """The server refused an execution's outcome: a newer holder has the job.

    Raised by the fenced commit (see :mod:`rq_epoch.worker.fence`) when the execution no longer
    holds its lease; nothing of the outcome was written. ``reason`` is ``taken`` (a sweep
    took the lease; ``detail`` is its verdict), ``superseded`` (``detail`` is the newer
    execution's id), ``queued`` (the server holds no lease of this execution, a failover
    lost its grant, and the job waits in its queue or intermediate list, whose key is
    ``detail``: it runs again) or ``gone`` (no sign of a newer holder: the execution's own
    earlier commit landed, or the job was cancelled or deleted). ``holder`` is the job's lease
    execution when the commit was refused, or ''.

    It derives from :class:`BaseException` and not from :class:`Exception` (as
    ``KeyboardInterrupt`` and ``asyncio.CancelledError`` do; RQ's own ``StopRequested`` is an
    ordinary ``Exception`` in RQ 2.12 and 3.0), so that it crosses the ``except Exception``
    blocks in RQ's outcome handlers (which would otherwise log it as a failure to persist
    and go on to enqueue dependents and send webhooks) and reaches
    :meth:`rq_epoch.Worker.write_outcome`, which reports it. For the same reason it cannot
    derive from :class:`RqEpochError`: catch it by name.
    """

    def __init__(self, job_id: str, execution_id: str, reason: str, detail: str = '', holder: str = '') -> None:
        self.job_id = job_id
        self.execution_id = execution_id
        self.reason = reason
        self.detail = detail
        self.holder = holder
        super().__init__(self.describe())

    def describe(self) -> str:
        """Who took over, in words, for the worker's log line."""
        newer = f'; execution {self.holder} holds it now' if self.holder and self.holder != self.execution_id else ''
        if self.reason == 'taken':
            return f'a sweep took its lease (verdict {self.detail or "unknown"}){newer}'
        if self.reason == 'superseded':
            return f'a newer execution {self.detail} was granted the job'
        if self.reason == 'queued':
            return (
                f'the server holds no lease of this execution and the job waits in {self.detail or "its queue"} '
                '(a failover or restart lost its grant): it runs again there'
            )
        return 'its lease is gone (no newer holder recorded)'


class OutcomeInterrupted(BaseException):
    """The connection failed while an execution's fenced commit was sent: the outcome may or may not have landed.

    Raised by the fenced commit (see :mod:`rq_epoch.worker.fence`) in place of the connection
    error (or :class:`ServerOutageError`), which is ``error`` (and ``__cause__``). RQ's failure
    paths catch every ``Exception`` around their commit and log it as a failure to persist, so
    a connection error there would lose the outcome (the job stays started, and a sweep counts
    the outage as a stall). As a :class:`BaseException` it crosses those blocks, as
    :class:`OutcomeRefused` does, and reaches :class:`rq_epoch.worker.outcomes.OutcomeWriter`,
    which rides it out as the connection error it is and sends the outcome again: if the first
    commit landed after all, the fence finds it written ("gone") and nothing is written twice.
    """

    def __init__(self, job_id: str, execution_id: str, error: Exception) -> None:
        self.job_id = job_id
        self.execution_id = execution_id
        self.error = error
        super().__init__(f'the commit of job {job_id} from execution {execution_id} was cut short: {error}')
