"""Every key name rq-epoch reads or writes: its own, and RQ's.

Both follow RQ's key prefix (``RQ_KEY_PREFIX`` in RQ 3, fixed ``rq`` in RQ 2). RQ's names are
spelled here once, not built by hand elsewhere; ``tests/test_key_names.py`` compares each of
them with RQ's own properties (``Queue.key``, ``Execution.key``, the registries'
``key_template``...) on every supported RQ version, so an RQ rename fails a test.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .compat import RQ_KEY_PREFIX, text

__all__ = [
    'COMMITTED_RECORD_TTL',
    'PREFIX',
    'QUEUE_PREFIX',
    'TAKEN_RECORD_TTL',
    'canceled_key',
    'committed_key',
    'deferred_key',
    'execution_key',
    'failed_key',
    'finished_key',
    'finishing_key',
    'intermediate_first_seen_key',
    'intermediate_key',
    'job_dependents_key',
    'job_executions_key',
    'job_key',
    'leases_key',
    'limbo_key',
    'primaries_key',
    'queue_key',
    'queue_name_of',
    'queue_names',
    'queues_key',
    'ready_key',
    'results_key',
    'scheduled_key',
    'stats_key',
    'taken_key',
    'wip_key',
    'worker_executions_key',
    'worker_key',
    'workers_key',
]

PREFIX: str = RQ_KEY_PREFIX

# -- rq-epoch's own keys -------------------------------------------------------------------

#: Seconds the record of a lease taken by a sweep is kept: an execution frozen for longer
#: than this is still fenced out, but its refusal says "gone" instead of naming the verdict.
TAKEN_RECORD_TTL = 86400


def leases_key(queue_name: str) -> str:
    """Sorted set of managed leases of a queue: ``<job_id>:<execution_id>`` scored by deadline."""
    return f'{PREFIX}:epoch:leases:{queue_name}'


def taken_key(member: str) -> str:
    """Record that a sweep took the lease ``<job_id>:<execution_id>``: the verdict, with a TTL."""
    return f'{PREFIX}:epoch:taken:{member}'


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


def primaries_key() -> str:
    """Hash of primary epochs: ``<run_id>:<replid>`` -> first seen as primary (server time) and replicas seen."""
    return f'{PREFIX}:epoch:primaries'


# -- RQ's keys -----------------------------------------------------------------------------

#: What RQ puts before a queue's name in its key (``Queue.redis_queue_namespace_prefix``).
QUEUE_PREFIX: str = f'{PREFIX}:queue:'


def queues_key() -> str:
    """RQ's set of every queue's key (``Queue.redis_queues_keys``)."""
    return f'{PREFIX}:queues'


def queue_key(queue_name: str) -> str:
    """RQ's queue list (``Queue.key``)."""
    return f'{QUEUE_PREFIX}{queue_name}'


def queue_name_of(key: str) -> str | None:
    """The queue named by a member of :func:`queues_key`; None for a key that is not a queue's."""
    return key[len(QUEUE_PREFIX) :] if key.startswith(QUEUE_PREFIX) else None


def queue_names(members: Iterable[Any]) -> list[str]:
    """The queues named by members of :func:`queues_key` as the server returned them, sorted."""
    names = (queue_name_of(text(member)) for member in members)
    return sorted(name for name in names if name is not None)


def intermediate_key(queue_name: str) -> str:
    """RQ's intermediate list of a queue: jobs taken by a worker that has not granted them yet."""
    return f'{queue_key(queue_name)}:intermediate'


def intermediate_first_seen_key(queue_name: str, job_id: str) -> str:
    """RQ's record of when its own cleanup first saw a job in the intermediate list."""
    return f'{intermediate_key(queue_name)}:first_seen:{job_id}'


def job_key(job_id: str) -> str:
    """RQ's job hash (``Job.key``)."""
    return f'{PREFIX}:job:{job_id}'


def job_dependents_key(job_id: str) -> str:
    """RQ's set of the jobs waiting for this one (``Job.dependents_key``)."""
    return f'{job_key(job_id)}:dependents'


def results_key(job_id: str) -> str:
    """RQ's stream of a job's results (``Result.get_key``)."""
    return f'{PREFIX}:results:{job_id}'


def execution_key(member: str) -> str:
    """RQ's hash of one execution, ``member`` being ``<job_id>:<execution_id>`` (``Execution.key``)."""
    return f'{PREFIX}:execution:{member}'


def job_executions_key(job_id: str) -> str:
    """RQ's registry of a job's executions (``ExecutionRegistry.key``)."""
    return f'{PREFIX}:executions:{job_id}'


def workers_key() -> str:
    """RQ's set of every registered worker's key."""
    return f'{PREFIX}:workers'


def worker_key(worker_name: str) -> str:
    """RQ's worker hash (``Worker.key``)."""
    return f'{PREFIX}:worker:{worker_name}'


def worker_executions_key(worker_name: str) -> str:
    """RQ 3's set of a worker's running executions (``Worker.executions_key``); RQ 2 has none."""
    return f'{worker_key(worker_name)}:executions'


def wip_key(queue_name: str) -> str:
    """RQ's StartedJobRegistry key."""
    return f'{PREFIX}:wip:{queue_name}'


def failed_key(queue_name: str) -> str:
    """RQ's FailedJobRegistry key."""
    return f'{PREFIX}:failed:{queue_name}'


def finished_key(queue_name: str) -> str:
    """RQ's FinishedJobRegistry key."""
    return f'{PREFIX}:finished:{queue_name}'


def deferred_key(queue_name: str) -> str:
    """RQ's DeferredJobRegistry key."""
    return f'{PREFIX}:deferred:{queue_name}'


def scheduled_key(queue_name: str) -> str:
    """RQ's ScheduledJobRegistry key."""
    return f'{PREFIX}:scheduled:{queue_name}'


def canceled_key(queue_name: str) -> str:
    """RQ's CanceledJobRegistry key."""
    return f'{PREFIX}:canceled:{queue_name}'


def ready_key(queue_name: str) -> str:
    """RQ 3's ReadyJobRegistry key (dependents on their way onto the queue); unused by RQ 2."""
    return f'{PREFIX}:ready:{queue_name}'
