"""Settings read from the environment, so a service file can set them without code.

Constructor arguments override the environment; the environment overrides the defaults.

===============================  =======  ====================================================
variable                         default  meaning
===============================  =======  ====================================================
``RQ_EPOCH_MAX_STALLED``         3        counted stalls a job may have; the last one kills it
``RQ_EPOCH_HEARTBEAT_INTERVAL``  10       seconds between heartbeats (RQ's job monitoring;
                                          a ``--job-monitoring-interval`` other than RQ's
                                          default 30 is followed instead)
``RQ_EPOCH_LEASE_MARGIN``        20       seconds a lease outlives its last heartbeat
``RQ_EPOCH_SWEEP_INTERVAL``      5        seconds between two sweeps of a queue by the
                                          fleet (each worker asks for the queues nobody
                                          swept lately, and sweeps those)
``RQ_EPOCH_RESTART_GRACE``       (auto)   seconds after a server start before uncounted
                                          leases are swept; default heartbeat + margin
``RQ_EPOCH_BATCH_SIZE``          30       leases judged per sweep script call
``RQ_EPOCH_STARTUP_WAIT``        300      seconds a worker started while the server is down,
                                          loading, read-only or refusing writes waits for
                                          it before it gives up (0: it gives up at once)
``RQ_EPOCH_SHUTDOWN_TIMEOUT``    20       seconds a worker told to stop (first SIGTERM or
                                          SIGINT, ``send_shutdown_command``) waits for its
                                          running job before it stops the work-horse and
                                          hands the job back to the front of its queue,
                                          uncounted; 0: at once; ``unlimited``: wait for the
                                          job as RQ does
``RQ_EPOCH_DURABLE_REPLICAS``    0        replicas that must confirm (``WAIT``) a grant, an
                                          outcome and a durable enqueue before they count as
                                          written; 0 is off
``RQ_EPOCH_DURABLE_TIMEOUT``     1000     milliseconds one confirmation waits for them
``RQ_EPOCH_DURABLE_FSYNC``       0        1: the primary must also have written them to its
                                          append-only file on disk (``WAITAOF``)
===============================  =======  ====================================================

With the defaults a worker that dies is detected within one lease (30 s) plus one sweep
interval (5 s) by any other worker on its queue, and the job runs again at once. The price is
one heartbeat round trip per running job every 10 s (stock RQ: every 30 s), one sweep of each
queue every 5 s by the whole fleet (whichever worker's ticket wins), and one ticket call per
worker every 5 s.

A worker told to stop marks its lease *stopping* on the server. If it is killed before it could
hand its job back, a sweep requeues the job uncounted (verdict ``stopping``) when the lease ran
out within the *stop window*: the shutdown timeout plus one lease length (heartbeat interval plus
lease margin) after the mark; with ``unlimited``, :data:`UNLIMITED_STOP_WAIT` seconds stand for
the shutdown timeout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import ConfigurationError

__all__ = ['DEFAULTS', 'UNLIMITED', 'UNLIMITED_STOP_WAIT', 'EpochSettings']

#: The value of ``RQ_EPOCH_SHUTDOWN_TIMEOUT`` (and of the ``shutdown_timeout`` argument) that
#: makes a worker told to stop wait for its job as RQ does.
UNLIMITED = 'unlimited'
#: Seconds that stand for the shutdown timeout in the stop window when it is ``unlimited``.
UNLIMITED_STOP_WAIT = 600

_FIELDS = {
    'max_stalled': ('RQ_EPOCH_MAX_STALLED', 1),
    'heartbeat_interval': ('RQ_EPOCH_HEARTBEAT_INTERVAL', 1),
    'lease_margin': ('RQ_EPOCH_LEASE_MARGIN', 1),
    'sweep_interval': ('RQ_EPOCH_SWEEP_INTERVAL', 1),
    'restart_grace': ('RQ_EPOCH_RESTART_GRACE', 0),
    'batch_size': ('RQ_EPOCH_BATCH_SIZE', 1),
    'startup_wait': ('RQ_EPOCH_STARTUP_WAIT', 0),
    'shutdown_timeout': ('RQ_EPOCH_SHUTDOWN_TIMEOUT', 0),
    'durable_replicas': ('RQ_EPOCH_DURABLE_REPLICAS', 0),
    'durable_timeout': ('RQ_EPOCH_DURABLE_TIMEOUT', 1),
    'durable_fsync': ('RQ_EPOCH_DURABLE_FSYNC', 0),
}


def _parse_timeout(name: str, value: object) -> int | None:
    """A shutdown timeout: whole seconds (at least 0), or None for the word ``unlimited``."""
    if isinstance(value, str) and value.strip().lower() == UNLIMITED:
        return None
    try:
        return _parse(name, value, 0)
    except ConfigurationError:
        raise ConfigurationError(f'{name} must be a whole number of seconds or {UNLIMITED!r}, got {value!r}') from None


def _parse(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f'{name} must be a whole number, got {value!r}')
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip()
        try:
            number = int(text)
        except ValueError:
            raise ConfigurationError(f'{name} must be a whole number, got {value!r}') from None
    if number < minimum:
        raise ConfigurationError(f'{name} must be at least {minimum}, got {number}')
    return number


def _parse_field(field: str, name: str, value: object, minimum: int) -> int | None:
    if field == 'shutdown_timeout':
        return _parse_timeout(name, value)
    return _parse(name, value, minimum)


@dataclass(frozen=True)
class EpochSettings:
    """rq-epoch's settings, validated. Build it with :meth:`resolve`."""

    max_stalled: int = 3
    heartbeat_interval: int = 10
    lease_margin: int = 20
    sweep_interval: int = 5
    restart_grace: int | None = None
    batch_size: int = 30
    startup_wait: int = 300
    #: Seconds a worker told to stop waits for its job before it hands it back; None: unlimited.
    shutdown_timeout: int | None = 20
    #: Replicas that must confirm a grant, an outcome or a durable enqueue (0: none asked).
    durable_replicas: int = 0
    #: Milliseconds one confirmation (``WAIT``, ``WAITAOF``) waits.
    durable_timeout: int = 1000
    #: Nonzero: the primary must also have fsynced them to its append-only file (``WAITAOF``).
    durable_fsync: int = 0

    @property
    def durable(self) -> bool:
        """Whether grants, outcomes and enqueues are confirmed before they count as written."""
        return self.durable_replicas > 0 or self.durable_fsync > 0

    @property
    def lease_ttl(self) -> int:
        """Seconds from one heartbeat to the lease deadline."""
        return self.heartbeat_interval + self.lease_margin

    @property
    def grace(self) -> int:
        """The restart grace in force: the explicit value, else one heartbeat plus margin."""
        if self.restart_grace is not None:
            return self.restart_grace
        return self.heartbeat_interval + self.lease_margin

    @property
    def stop_window(self) -> int:
        """Seconds after a stop mark within which a lease that runs out is requeued uncounted.

        The shutdown timeout (:data:`UNLIMITED_STOP_WAIT` when unlimited) plus one lease length:
        a worker that waits for its job heartbeats until the timeout, so its lease cannot run
        out later than that unless the worker outlived its own stop.
        """
        wait = UNLIMITED_STOP_WAIT if self.shutdown_timeout is None else self.shutdown_timeout
        return wait + self.lease_ttl

    @classmethod
    def resolve(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> EpochSettings:
        """Defaults, then ``RQ_EPOCH_*`` variables, then keyword arguments that are not None.

        Raises:
            ConfigurationError: a value is not a whole number or is below its minimum.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, (variable, minimum) in _FIELDS.items():
            override = overrides.pop(field, None)
            if override is not None:
                values[field] = _parse_field(field, field, override, minimum)
            elif env.get(variable, '').strip():
                values[field] = _parse_field(field, variable, env[variable], minimum)
        if overrides:
            raise TypeError(f'unknown settings: {", ".join(sorted(overrides))}')
        return replace(DEFAULTS, **values)


DEFAULTS = EpochSettings()
