"""What ``rq-epoch status`` shows, as data: the server's epoch and role, and per queue its
leases, the verdicts a sweep would give now, its stalled jobs and dead letters.

Read-only (the verdicts come from a dry-run sweep) and independent of the command line, so a
program or a monitoring job can call :func:`read_status` and use :meth:`Status.to_dict`, the
document ``rq-epoch status --json`` prints.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rq.job import Job as RQJob

from ..compat import text
from ..jobs.job import stalled_count
from ..protocol import keys
from ..protocol.report import SweepReport
from ..protocol.server import PrimaryState, ServerEpoch, read_epoch, read_primary_state
from ..protocol.verdicts import Verdict
from ..settings import EpochSettings
from ..sweep.sweeper import Sweeper

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['STATUS_SCAN_LIMIT', 'Status', 'all_queue_names', 'grace_left', 'queue_status', 'read_status', 'server_now']

#: At most this many entries of each list or registry are read to find stalled jobs.
STATUS_SCAN_LIMIT = 10_000
#: Job hashes read per round trip.
_CHUNK = 500


def all_queue_names(connection: Redis) -> list[str]:
    """Every queue RQ knows of (the members of RQ's set of queues), sorted."""
    return keys.queue_names(connection.smembers(keys.queues_key()))  # type: ignore[arg-type]


def server_now(connection: Redis) -> float:
    """The server's clock, in seconds."""
    seconds, micros = connection.time()  # type: ignore[misc]
    return float(seconds) + float(micros) / 1e6


@dataclass
class Status:
    """The server's epoch and role, the settings the verdicts were computed with, and the queues."""

    current: ServerEpoch
    primary: PrimaryState
    settings: EpochSettings
    #: Per queue, the document :func:`queue_status` returns.
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``rq-epoch status --json``."""
        current, primary, settings = self.current, self.primary, self.settings
        return {
            'server': {
                'run_id': current.run_id,
                'uptime': current.uptime,
                'role': current.role,
                'state': primary.state,
                'primary_for': round(primary.age, 3) if primary.first_seen else None,
                'primary_since': primary.first_seen or None,
                'replicas_online': primary.replicas_online,
                'replicas_expected': primary.replicas_expected,
            },
            'max_stalled': settings.max_stalled,
            'restart_grace': settings.grace,
            'restart_grace_left': grace_left(primary, settings),
            'queues': self.queues,
        }


def read_status(
    connection: Redis,
    queue_names: Sequence[str] = (),
    *,
    settings: EpochSettings | None = None,
    job_class: type[RQJob] | str | None = None,
    serializer: Any = None,
) -> Status:
    """Read the status of the given queues (every queue RQ knows of when none are given); writes nothing."""
    settings = settings or EpochSettings.resolve()
    current = read_epoch(connection)
    primary = read_primary_state(connection, current)
    names = list(queue_names) or all_queue_names(connection)
    sweeper = Sweeper(connection, settings=settings, job_class=job_class, serializer=serializer)
    preview = sweeper.sweep(names, dry_run=True) if names else SweepReport(run_id=current.run_id)
    queues = {name: queue_status(connection, name, preview, settings) for name in names}
    return Status(current=current, primary=primary, settings=settings, queues=queues)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def queue_status(connection: Redis, name: str, preview: SweepReport, settings: EpochSettings) -> dict[str, Any]:
    """The state of one queue's leases, its jobs with counted stalls, and its dead letters."""
    now = server_now(connection)
    limit = STATUS_SCAN_LIMIT
    with connection.pipeline(transaction=False) as pipeline:
        pipeline.zcount(keys.leases_key(name), f'({now}', '+inf')
        pipeline.zcount(keys.legacy_leases_key(name), f'({now}', '+inf')
        pipeline.zcount(keys.wip_key(name), f'({now}', '(+inf')
        pipeline.zrange(keys.leases_key(name), 0, limit - 1)
        pipeline.zrange(keys.legacy_leases_key(name), 0, limit - 1)
        pipeline.zrange(keys.wip_key(name), 0, limit - 1)
        pipeline.lrange(keys.queue_key(name), 0, limit - 1)
        pipeline.zrange(keys.failed_key(name), 0, limit - 1)
        pipeline.hgetall(keys.stats_key(name))
        live, legacy_live, stock_live, leases, legacy, wip, queued, failed, stats = pipeline.execute()
    # A lease's member is its job id; a 0.2.0 worker's (during an upgrade) is <job_id>:<execution_id>.
    live += legacy_live
    job_ids: dict[str, None] = {}
    for member in [*leases, *legacy, *wip]:
        job_ids[text(member).split(':', 1)[0]] = None
    for job_id in [*queued, *failed]:
        job_ids[text(job_id)] = None
    failed_ids = {text(x) for x in failed}
    stalled_jobs = []
    dead_letters = []
    for chunk in _chunks(list(job_ids), _CHUNK):
        with connection.pipeline(transaction=False) as pipeline:
            for job_id in chunk:
                pipeline.hmget(keys.job_key(job_id), 'stalled', 'max_stalled', 'status', 'stall_dead')
            rows = pipeline.execute()
        for job_id, (stalled, own_max, job_status, stall_dead) in zip(chunk, rows, strict=True):
            count = stalled_count(stalled, job_status, stall_dead)
            budget = int(text(own_max)) if text(own_max).isdigit() else settings.max_stalled
            if text(stall_dead) == '1' and job_id in failed_ids:
                dead_letters.append(job_id)
            if count > 0:
                stalled_jobs.append(
                    {'job_id': job_id, 'stalled': count, 'max_stalled': budget, 'status': text(job_status)}
                )
    expired = preview.counts(name)
    counters = {text(k): text(v) for k, v in sorted(stats.items())}
    last_sweep = float(counters['last_sweep']) if counters.get('last_sweep') else None
    return {
        'live_leases': int(live),
        'stock_live_leases': int(stock_live),
        'expired_leases': sum(expired.values()),
        'expired': expired,
        'would_be_exempt': sum(n for v, n in expired.items() if Verdict(v).uncounted),
        'would_be_counted': sum(n for v, n in expired.items() if Verdict(v).counted),
        'stalled_jobs': stalled_jobs,
        'dead_letters': dead_letters,
        'counters': {k: int(v) for k, v in counters.items() if v.isdigit()},
        'last_sweep': last_sweep,
        'seconds_since_last_sweep': round(now - last_sweep, 3) if last_sweep is not None else None,
        'truncated': any(len(x) >= limit for x in (leases, legacy, wip, queued, failed)),
    }


def grace_left(primary: PrimaryState, settings: EpochSettings) -> int | None:
    """Seconds of restart grace left on this primary (the whole grace when no sweep has seen it
    as primary yet); None on a replica."""
    if not primary.is_primary:
        return None
    if not primary.first_seen:
        return settings.grace
    return max(0, math.ceil(settings.grace - primary.age))
