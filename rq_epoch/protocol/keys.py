"""Every key name rq-epoch reads or writes: its own, and RQ's.

Both follow RQ's key prefix (``RQ_KEY_PREFIX`` in RQ 3, fixed ``rq`` in RQ 2). RQ's names are
spelled here once, not built by hand elsewhere; ``tests/test_key_names.py`` compares each of
them with RQ's own properties (``Queue.key``, ``Execution.key``, the registries'
``key_template``...) on every supported RQ version, so an RQ rename fails a test.

Most names are a family, ``<prefix>:<word>:<name>[<suffix>]``: ``job_key(job_id)``,
``leases_key(queue_name)``... Each family is a :class:`KeyFamily`, called with the name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from ..compat import RQ_KEY_PREFIX, text

__all__ = [
    'COMMITTED_RECORD_TTL',
    'PREFIX',
    'QUEUE_PREFIX',
    'REGISTRIES',
    'KeyFamily',
    'alive_key',
    'committed_key',
    'confirm_key',
    'execution_key',
    'failed_key',
    'finishing_key',
    'intermediate_first_seen_key',
    'intermediate_key',
    'job_dependents_key',
    'job_executions_key',
    'job_key',
    'leases_key',
    'legacy_leases_key',
    'limbo_key',
    'primaries_key',
    'queue_key',
    'queue_name_of',
    'queue_names',
    'queue_set_id',
    'queues_key',
    'registry_key',
    'results_key',
    'startup_probe_key',
    'stats_key',
    'STOP_MARK_FIELD',
    'taken_field',
    'tickets_key',
    'watch_key',
    'baton_key',
    'sweep_turns_key',
    'turns_key',
    'wip_key',
    'worker_executions_key',
    'worker_key',
    'workers_key',
]

PREFIX: str = RQ_KEY_PREFIX


class KeyFamily:
    """The keys ``<prefix>:<word>:<name><suffix>``, one per name: call it with the name."""

    def __init__(self, word: str, suffix: str = '') -> None:
        self.word = word
        self.suffix = suffix

    def __call__(self, name: str) -> str:
        return f'{PREFIX}:{self.word}:{name}{self.suffix}'

    def __repr__(self) -> str:
        return f'KeyFamily({self.word!r}, {self.suffix!r})'


# -- rq-epoch's own keys -------------------------------------------------------------------

#: Sorted set of managed leases of a queue: one per job, member the job id, scored by its
#: deadline (server time). The job hash's ``lease_execution`` names the execution that holds
#: it, so a newer grant of the same job replaces the older lease.
leases_key = KeyFamily('epoch:lease')
#: The leases written by rq-epoch 0.2.0: member ``<job_id>:<execution_id>``, scored by
#: deadline. Nothing writes it any more but 0.2.0 workers still running during an upgrade;
#: the sweep judges what is left in it, and status, metrics and history read it.
legacy_leases_key = KeyFamily('epoch:leases')
#: Record that the execution ``<job_id>:<execution_id>``, which held no lease, committed its outcome.
committed_key = KeyFamily('epoch:committed')
#: Hash of per-verdict counters of a queue, kept by the sweep.
stats_key = KeyFamily('epoch:stats')
#: Hash of first sightings of jobs stuck in RQ's intermediate queue (job id -> server time).
limbo_key = KeyFamily('epoch:limbo')


def taken_field(execution_id: str) -> str:
    """Field of the job hash where a sweep records the verdict that took this execution's lease.

    Written in the HSET the verdict does anyway; it lives as long as the job. The extend
    and commit scripts read it, so the execution learns which verdict took its lease.
    """
    return f'taken:{execution_id}'


#: Field of the job hash where a worker told to stop marks its execution's lease stopping:
#: ``"<execution_id> <marked_at> <until>"``, server time (``stopmark.lua``; read by the sweep).
STOP_MARK_FIELD = 'stop_mark'


#: Seconds the record of an unleased execution's commit is kept: longer than any worker
#: retries an outcome after a connection error.
COMMITTED_RECORD_TTL = 86400


def queue_set_id(queue_keys: Iterable[str]) -> str:
    """The identity of a set of queues, whatever their order: 16 hex digits of the SHA-1 of
    their keys (:func:`queue_key`), sorted, one per line. Workers on the same queues share it
    (and so share a watcher)."""
    joined = '\n'.join(sorted(set(queue_keys)))
    return hashlib.sha1(joined.encode('utf-8')).hexdigest()[:16]


#: String naming the worker that watches a set of queues for the others (its token), with a
#: TTL its holder refreshes while it waits (``watch.lua``). Named by :func:`queue_set_id`.
watch_key = KeyFamily('epoch:watch')
#: List holding at most one token: the watch handed on to the next idle worker of a set of
#: queues, which waits for it with ``BLPOP`` (``watch.lua``). Named by :func:`queue_set_id`.
baton_key = KeyFamily('epoch:baton')
#: String: the server time (ms) of the last turn given to an idle worker of a set of queues
#: that waits for the baton; the turns follow each other at a fixed gap (``_watch.lua``).
#: Named by :func:`queue_set_id`.
turns_key = KeyFamily('epoch:turns')
#: String: the server time (ms) of the last turn given to a worker to ask for the sweep
#: tickets of a set of queues again, after it won none (``ticket.lua``); the turns follow
#: each other one sweep interval apart. Named by :func:`queue_set_id`.
sweep_turns_key = KeyFamily('epoch:sweepturns')


def tickets_key() -> str:
    """Hash of the workers' sweep tickets (``ticket.lua``): ``at:<queue>`` the server time (ms)
    of the last ticket, ``count:<queue>`` how many were granted."""
    return f'{PREFIX}:epoch:tickets'


def startup_probe_key() -> str:
    """A key that is never written: a worker at start deletes it to learn whether the server
    takes writes (a write command is refused by a replica, a loading server, or a primary
    short of replicas, whether or not the key exists)."""
    return f'{PREFIX}:epoch:probe'


def confirm_key() -> str:
    """A string written just before each confirmation (``WAIT``) on the same connection, so
    that the confirmation covers every write the server applied before it, whichever pooled
    connection made them (``rq_epoch.protocol.durable``). Its value means nothing."""
    return f'{PREFIX}:epoch:confirm'


def finishing_key() -> str:
    """Sorted set of dead letters whose Python side effects have not run yet (``<queue>|<job_id>``)."""
    return f'{PREFIX}:epoch:finishing'


def primaries_key() -> str:
    """Hash of primary epochs: ``<run_id>:<replid>`` -> first seen as primary (server time) and replicas seen."""
    return f'{PREFIX}:epoch:primaries'


def alive_key() -> str:
    """Hash of server processes' last signs of life as primary: ``<run_id>`` -> ``"<last> <replid> <first>"``.

    Written by the scripts (at most once a second per server), read by the sweep to count a
    lease that ran out before a restart or failover (``note_alive`` in ``lua/_epoch.lua``).
    """
    return f'{PREFIX}:epoch:alive'


# -- RQ's keys -----------------------------------------------------------------------------

#: RQ's queue list (``Queue.key``).
queue_key = KeyFamily('queue')
#: RQ's intermediate list of a queue: jobs taken by a worker that has not granted them yet.
intermediate_key = KeyFamily('queue', ':intermediate')
#: RQ's job hash (``Job.key``).
job_key = KeyFamily('job')
#: RQ's set of the jobs waiting for this one (``Job.dependents_key``).
job_dependents_key = KeyFamily('job', ':dependents')
#: RQ's stream of a job's results (``Result.get_key``).
results_key = KeyFamily('results')
#: RQ's hash of one execution, named ``<job_id>:<execution_id>`` (``Execution.key``).
execution_key = KeyFamily('execution')
#: RQ's registry of a job's executions (``ExecutionRegistry.key``).
job_executions_key = KeyFamily('executions')
#: RQ's worker hash (``Worker.key``).
worker_key = KeyFamily('worker')
#: RQ 3's set of a worker's running executions (``Worker.executions_key``); RQ 2 has none.
worker_executions_key = KeyFamily('worker', ':executions')

#: What RQ puts before a queue's name in its key (``Queue.redis_queue_namespace_prefix``).
QUEUE_PREFIX: str = queue_key('')

#: RQ's job registries of a queue, by the word in their key ``<prefix>:<word>:<queue>``:
#: Started (``wip``), Failed, Finished, Deferred, Scheduled, Canceled, and RQ 3's Ready.
REGISTRIES = ('wip', 'failed', 'finished', 'deferred', 'scheduled', 'canceled', 'ready')
#: RQ's StartedJobRegistry, where rq-epoch's own registry keeps RQ's entries.
wip_key = KeyFamily('wip')
#: RQ's FailedJobRegistry, where dead letters go.
failed_key = KeyFamily('failed')


def registry_key(word: str, queue_name: str) -> str:
    """RQ's job registry of a queue named by ``word``, one of :data:`REGISTRIES` (``BaseRegistry.key``)."""
    if word not in REGISTRIES:
        raise ValueError(f'no RQ registry {word!r} (one of {", ".join(REGISTRIES)})')
    return KeyFamily(word)(queue_name)


def intermediate_first_seen_key(queue_name: str, job_id: str) -> str:
    """RQ's record of when its own cleanup first saw a job in the intermediate list."""
    return f'{intermediate_key(queue_name)}:first_seen:{job_id}'


def queues_key() -> str:
    """RQ's set of every queue's key (``Queue.redis_queues_keys``)."""
    return f'{PREFIX}:queues'


def workers_key() -> str:
    """RQ's set of every registered worker's key (``Worker.redis_workers_keys``)."""
    return f'{PREFIX}:workers'


def queue_name_of(key: str) -> str | None:
    """The queue named by a member of :func:`queues_key`; None for a key that is not a queue's."""
    return key[len(QUEUE_PREFIX) :] if key.startswith(QUEUE_PREFIX) else None


def queue_names(members: Iterable[Any]) -> list[str]:
    """The queues named by members of :func:`queues_key` as the server returned them, sorted."""
    names = (queue_name_of(text(member)) for member in members)
    return sorted(name for name in names if name is not None)
