"""One job's stall history, for ``rq-epoch status --job``: its counters, its lease, its dead letters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rq.job import JobStatus

from ..compat import text
from ..errors import StalledJobError
from ..jobs.job import Job
from ..protocol import epoch, keys

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['job_history']


def _status(job: Job) -> str:
    status = job.get_status(refresh=False)
    return str(getattr(status, 'value', status) or '')


def _count(raw: Any) -> int:
    value = text(raw)
    return int(value) if value.isdigit() else 0


def _stop_mark(raw: Any, lease_execution: str | None) -> dict[str, float] | None:
    """The stop mark of the lease the job holds now, if its worker was told to stop."""
    mark = epoch.parse_stop_mark(raw)
    if mark is None or mark.execution_id != lease_execution:
        return None
    return {'marked_at': mark.marked_at, 'until': mark.until}


def job_history(
    connection: Redis,
    job_id: str,
    *,
    run_id: str,
    default_max_stalled: int,
    job_class: type[Job] = Job,
    serializer: Any = None,
) -> dict[str, Any]:
    """What rq-epoch knows of one job, as a JSON-ready dict. Writes nothing.

    ``stalled`` is read as :class:`rq_epoch.Job` reads it (a dead letter requeued by hand
    reads 0). ``stall_epochs`` lists the server epoch of each stall counted in ``stalled``.
    ``handed_back`` counts the times a worker told to stop handed it back, and
    ``stopping_recoveries`` the times a sweep requeued it because its worker, told to stop, was
    killed first (verdict ``stopping``); neither is a counted stall. ``stop_mark`` is the
    stop mark of the lease it holds now (server times), if its worker was told to stop.
    ``dead_letter`` says whether the job is a dead letter now; ``requeued_since_dead_letter``
    whether it was one and was requeued since; ``dead_letter_results`` are its failure
    results that a dead-lettering wrote (newest first, as far as RQ keeps results).

    Raises:
        rq.exceptions.NoSuchJobError: there is no such job.
    """
    job = cast(Job, job_class.fetch(job_id, connection=connection, serializer=serializer))
    status = _status(job)
    stall_dead, stall_epochs, handed_back, stopping, stop_mark = connection.hmget(  # type: ignore[misc]
        job.key, 'stall_dead', 'stall_epochs', 'handed_back', 'stopping_recoveries', keys.STOP_MARK_FIELD
    )
    seconds, micros = connection.time()  # type: ignore[misc]
    now = float(seconds) + float(micros) / 1e6
    lease = None
    if job.lease_execution:
        # The job's lease; or, granted by a 0.2.0 worker during an upgrade, its execution's.
        member = job.id
        deadline = connection.zscore(keys.leases_key(job.origin), member)
        if deadline is None:
            member = f'{job.id}:{job.lease_execution}'
            deadline = connection.zscore(keys.legacy_leases_key(job.origin), member)
        if deadline is not None:
            lease = {
                'member': member,
                'deadline': float(deadline),
                'expired': float(deadline) <= now,
                'seconds_left': round(float(deadline) - now, 3),
            }
    epochs = [e for e in text(stall_epochs).split(',') if e] if job.stalled else []
    dead_letter = stall_dead is not None and status == JobStatus.FAILED.value
    results = []
    for result in job.results():
        exc_string = getattr(result, 'exc_string', None) or ''
        if exc_string.startswith(f'{StalledJobError.__name__}:'):
            created = getattr(result, 'created_at', None)
            results.append({'created_at': created.isoformat() if created else None, 'reason': exc_string})
    return {
        'job_id': job.id,
        'queue': job.origin,
        'status': status,
        'stalled': job.stalled,
        'max_stalled': job.max_stalled or default_max_stalled,
        'max_stalled_source': 'job' if job.max_stalled else 'default',
        'exempt_recoveries': job.exempt_recoveries,
        'handed_back': _count(handed_back),
        'stopping_recoveries': _count(stopping),
        'stop_mark': _stop_mark(stop_mark, job.lease_execution),
        'stall_epochs': epochs,
        'lease_epoch': job.lease_epoch,
        'lease_epoch_is_current': bool(job.lease_epoch) and job.lease_epoch == run_id,
        'lease': lease,
        'dead_letter': dead_letter,
        'requeued_since_dead_letter': not dead_letter and (stall_dead is not None or bool(results)),
        'dead_letter_results': results,
    }
