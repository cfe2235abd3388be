"""Names of the keys rq-epoch adds. They follow RQ's key prefix (``RQ_KEY_PREFIX`` in RQ 3)."""

from __future__ import annotations

try:  # RQ 3.0 made the prefix configurable
    from rq.defaults import RQ_KEY_PREFIX as _RQ_PREFIX
except ImportError:  # RQ 2.x: fixed prefix
    _RQ_PREFIX = 'rq'

__all__ = [
    'COMMITTED_RECORD_TTL',
    'PREFIX',
    'committed_key',
    'failed_key',
    'finishing_key',
    'intermediate_key',
    'job_key',
    'leases_key',
    'limbo_key',
    'primaries_key',
    'queue_key',
    'stats_key',
    'taken_field',
    'wip_key',
]

PREFIX: str = _RQ_PREFIX

def leases_key(queue_name: str) -> str:
    """Sorted set of managed leases of a queue: ``<job_id>:<execution_id>`` scored by deadline."""
    return f'{PREFIX}:epoch:leases:{queue_name}'


def taken_field(execution_id: str) -> str:
    """Field of the job hash where a sweep records the verdict that took this execution's lease.

    Written in the HSET the verdict does anyway; it lives as long as the job. The extend
    and commit scripts read it, so the execution learns which verdict took its lease.
    """
    return f'taken:{execution_id}'


#: Seconds the record of an unleased execution's commit is kept: longer than any worker
#: retries an outcome after a connection error.
COMMITTED_RECORD_TTL = 86400


def committed_key(member: str) -> str:
    """Record that the execution ``<job_id>:<execution_id>``, which held no lease, committed its outcome."""
    return f'{PREFIX}:epoch:committed:{member}'


def finishing_key() -> str:
    """Sorted set of dead letters whose Python side effects have not run yet (``<queue>|<job_id>``)."""
    return f'{PREFIX}:epoch:finishing'


def stats_key(queue_name: str) -> str:
    """Hash of per-verdict counters of a queue, kept by the sweep."""
    return f'{PREFIX}:epoch:stats:{queue_name}'


def limbo_key(queue_name: str) -> str:
    """Hash of first sightings of jobs stuck in RQ's intermediate queue (job id -> server time)."""
    return f'{PREFIX}:epoch:limbo:{queue_name}'


def queue_key(queue_name: str) -> str:
    """RQ's queue list."""
    return f'{PREFIX}:queue:{queue_name}'


def intermediate_key(queue_name: str) -> str:
    """RQ's intermediate list of a queue: jobs taken by a worker that has not granted them yet."""
    return f'{queue_key(queue_name)}:intermediate'


def wip_key(queue_name: str) -> str:
    """RQ's StartedJobRegistry key."""
    return f'{PREFIX}:wip:{queue_name}'


def failed_key(queue_name: str) -> str:
    """RQ's FailedJobRegistry key."""
    return f'{PREFIX}:failed:{queue_name}'


def job_key(job_id: str) -> str:
    """RQ's job hash key."""
    return f'{PREFIX}:job:{job_id}'


def primaries_key() -> str:
    """Hash of primary epochs: ``<run_id>:<replid>`` -> first seen as primary (server time) and replicas seen."""
    return f'{PREFIX}:epoch:primaries'
