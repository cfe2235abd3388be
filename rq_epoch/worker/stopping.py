"""A worker told to stop: its stop mark, its bounded wait, and the hand-back of its job.

A deploy stops workers in one of a few ways (a supervisor's SIGTERM to the worker, or to every
process of it at once, a second signal, RQ's shutdown command), and then kills what is left
after a grace period. A running job must not pay for it:

* the work-horse ignores SIGTERM and SIGINT; the worker decides;
* on the first stop signal the worker marks its lease *stopping* on the server
  (:func:`mark_stopping`, the ``stopmark`` script, server time), so that a sweep requeues the
  job uncounted if the worker is killed before it could hand the job back;
* it waits for the job at most ``shutdown_timeout`` seconds (:class:`StopRequest`), or not at
  all after a second signal, then stops the work-horse and hands the job back to the front of
  its queue, uncounted (:func:`hand_back`, the ``handback`` script: fenced, so a job whose
  outcome landed first, or whose lease a sweep took, is not handed back).

This module holds the server calls and the bookkeeping of the stop; :class:`rq_epoch.Worker`
and its flavours call them from RQ's signal handlers and from their wait for the job.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..protocol import keys, verbs

if TYPE_CHECKING:
    from redis import Redis
    from rq.executions import Execution

__all__ = ['StopRequest', 'hand_back', 'mark_stopping']


@dataclass
class StopRequest:
    """What a worker was told: stop warmly (at :attr:`asked_at`), and maybe cold after that."""

    #: ``time.monotonic()`` when the first stop signal arrived.
    asked_at: float
    #: Seconds to wait for the running job; None: as long as it runs (``unlimited``).
    timeout: int | None
    #: True after a second stop signal (RQ's cold shutdown): hand the job back at once.
    cold: bool = False
    #: The execution whose lease was marked stopping (or found not to be markable).
    marked_execution: str | None = None

    def due(self, now: float | None = None) -> bool:
        """Whether the job is to be handed back now: after a cold stop, or once the timeout passed."""
        if self.cold:
            return True
        if self.timeout is None:
            return False
        return (time.monotonic() if now is None else now) - self.asked_at >= self.timeout

    def seconds_left(self, now: float | None = None) -> float | None:
        """Seconds until the hand-back is due (0 when due); None when the wait is unlimited."""
        if self.cold:
            return 0.0
        if self.timeout is None:
            return None
        return max(0.0, self.asked_at + self.timeout - (time.monotonic() if now is None else now))

    def next_tick(self, interval: int) -> int:
        """Whole seconds (at least 1) until the worker should look at its job again: the heartbeat
        ``interval``, or less when the hand-back is due sooner."""
        left = self.seconds_left()
        if left is None:
            return interval
        return max(1, min(interval, math.ceil(left)))


def mark_stopping(connection: Redis, job: Any, execution: Execution, window: int) -> verbs.StopMarkReply:
    """Mark the lease of ``execution`` stopping, for ``window`` seconds from now (server time).

    Refused (``marked`` False, nothing written) when the execution no longer holds the lease,
    or the lease has run out already.
    """
    return verbs.stop_mark(
        connection, [keys.leases_key(job.origin), keys.job_key(job.id)], [job.id, execution.id, int(window)]
    )


def hand_back(connection: Redis, job: Any, execution: Execution) -> verbs.HandBackReply:
    """Give ``job`` back to the front of its queue, uncounted, if ``execution`` still holds its lease.

    The caller has stopped the job first (its work-horse killed and reaped). Refused when a
    sweep took the lease, a newer execution holds the job, or the job's outcome already landed.
    """
    member = f'{job.id}:{execution.id}'
    return verbs.hand_back(
        connection,
        [
            keys.leases_key(job.origin),
            keys.job_key(job.id),
            keys.wip_key(job.origin),
            keys.stats_key(job.origin),
            keys.queue_key(job.origin),
            keys.intermediate_key(job.origin),
            keys.queues_key(),
            keys.execution_key(member),
            keys.job_executions_key(job.id),
        ],
        [job.id, execution.id, keys.PREFIX],
    )
