"""Errors that rq-epoch raises. All of them derive from :class:`RqEpochError`."""

from __future__ import annotations

import redis.exceptions
from rq.exceptions import AbandonedJobError

__all__ = ['ConfigurationError', 'EpochUnavailableError', 'RqEpochError', 'ServerOutageError', 'StalledJobError']


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


class ServerOutageError(RqEpochError, redis.exceptions.ConnectionError):
    """The server answered, but cannot take writes now: ``NOREPLICAS``, ``READONLY``, ``LOADING``,
    ``MASTERDOWN`` or ``TRYAGAIN`` (a primary without its replicas, a demoted primary, a server
    loading its data).

    It is a redis-py ``ConnectionError``: a worker rides it out like a server that does not
    answer (see :mod:`rq_epoch.failover`).
    """


class StalledJobError(AbandonedJobError):
    """Passed to ``on_failure`` callbacks of a job that the sweep dead-lettered.

    It subclasses RQ's :class:`~rq.exceptions.AbandonedJobError`, so callbacks that
    already handle abandoned jobs keep working.
    """
