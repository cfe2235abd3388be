"""Every RQ key name rq-epoch spells (``rq_epoch.protocol.keys``) is the one RQ itself uses.

The names are compared with RQ's own properties and templates on the installed RQ version
(the CI runs both RQ 3 and RQ 2), so an RQ rename fails here instead of in production; on
RQ 3 the comparison runs again under a configured key prefix, braces included.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from rq_epoch.protocol import keys
from tests.conftest import ROOT

QUEUE = 'names'
JOB_ID = 'job-1'
EXECUTION_ID = 'exec-1'
WORKER = 'worker-1'


def rq_names(connection: redis.Redis) -> dict[str, tuple[str, str]]:
    """Each RQ key rq-epoch uses: (our name, RQ's name), read from RQ's classes."""
    from rq import Queue, Worker
    from rq.executions import Execution, ExecutionRegistry
    from rq.intermediate_queue import IntermediateQueue
    from rq.job import Job
    from rq.registry import (
        CanceledJobRegistry,
        DeferredJobRegistry,
        FailedJobRegistry,
        FinishedJobRegistry,
        ScheduledJobRegistry,
        StartedJobRegistry,
    )
    from rq.results import Result

    queue = Queue(QUEUE, connection=connection)
    job = Job(JOB_ID, connection=connection)
    execution = Execution(EXECUTION_ID, JOB_ID, connection=connection, worker_name=WORKER)
    worker = Worker([queue], name=WORKER, connection=connection)
    names = {
        'queues': (keys.queues_key(), Queue.redis_queues_keys),
        'queue prefix': (keys.QUEUE_PREFIX, Queue.redis_queue_namespace_prefix),
        'queue': (keys.queue_key(QUEUE), queue.key),
        'queue name': (str(keys.queue_name_of(queue.key)), queue.name),
        'intermediate': (keys.intermediate_key(QUEUE), queue.intermediate_queue_key),
        'intermediate list': (keys.intermediate_key(QUEUE), IntermediateQueue(queue.key, connection).key),
        'first seen': (
            keys.intermediate_first_seen_key(QUEUE, JOB_ID),
            IntermediateQueue(queue.key, connection).get_first_seen_key(JOB_ID),
        ),
        'job': (keys.job_key(JOB_ID), job.key),
        'job by id': (keys.job_key(JOB_ID), Job.key_for(JOB_ID)),
        'dependents': (keys.job_dependents_key(JOB_ID), job.dependents_key),
        'results': (keys.results_key(JOB_ID), Result.get_key(JOB_ID)),
        'execution': (keys.execution_key(execution.composite_key), execution.key),
        'job executions': (keys.job_executions_key(JOB_ID), ExecutionRegistry(JOB_ID, connection).key),
        'workers': (keys.workers_key(), Worker.redis_workers_keys),
        'worker': (keys.worker_key(WORKER), worker.key),
        'wip': (keys.wip_key(QUEUE), StartedJobRegistry(QUEUE, connection=connection).key),
        'failed': (keys.failed_key(QUEUE), FailedJobRegistry(QUEUE, connection=connection).key),
        'finished': (keys.registry_key('finished', QUEUE), FinishedJobRegistry(QUEUE, connection=connection).key),
        'deferred': (keys.registry_key('deferred', QUEUE), DeferredJobRegistry(QUEUE, connection=connection).key),
        'scheduled': (keys.registry_key('scheduled', QUEUE), ScheduledJobRegistry(QUEUE, connection=connection).key),
        'canceled': (keys.registry_key('canceled', QUEUE), CanceledJobRegistry(QUEUE, connection=connection).key),
        'started registry of the queue': (keys.wip_key(QUEUE), queue.started_job_registry.key),
        'failed registry of the queue': (keys.failed_key(QUEUE), queue.failed_job_registry.key),
    }
    try:  # RQ 3 only
        from rq.registry import ReadyJobRegistry
    except ImportError:
        pass
    else:
        names['ready'] = (keys.registry_key('ready', QUEUE), ReadyJobRegistry(QUEUE, connection=connection).key)
    if hasattr(worker, 'executions_key'):  # RQ 3 only
        names['worker executions'] = (keys.worker_executions_key(WORKER), worker.executions_key)
        names['execution of a worker'] = (keys.worker_executions_key(WORKER), execution.worker_executions_key)
    return names


def _mismatches(connection: redis.Redis) -> dict[str, tuple[str, str]]:
    return {what: pair for what, pair in rq_names(connection).items() if pair[0] != pair[1]}


def test_rq_key_names_match_rq(conn: redis.Redis) -> None:
    names = rq_names(conn)
    assert len(names) >= 23
    assert _mismatches(conn) == {}


def test_own_keys_share_the_prefix_and_a_namespace() -> None:
    own = [
        keys.leases_key(QUEUE),
        keys.legacy_leases_key(QUEUE),
        keys.committed_key('j:e'),
        keys.finishing_key(),
        keys.stats_key(QUEUE),
        keys.limbo_key(QUEUE),
        keys.primaries_key(),
        keys.alive_key(),
        keys.confirm_key(),
    ]
    assert all(name.startswith(f'{keys.PREFIX}:epoch:') for name in own)
    assert len(set(own)) == len(own)


def test_an_unknown_registry_is_refused() -> None:
    with pytest.raises(ValueError):
        keys.registry_key('started', QUEUE)


def test_queue_names_from_the_set_of_queues() -> None:
    members = [keys.queue_key('b').encode(), keys.queue_key('a'), 'elsewhere:queue:c', keys.queue_key('x:y')]
    assert keys.queue_names(members) == ['a', 'b', 'x:y']


CHECK = """
import sys, redis
from tests.test_key_names import _mismatches, rq_names
from rq_epoch import keys
conn = redis.Redis.from_url(sys.argv[1])
assert keys.PREFIX == sys.argv[2], keys.PREFIX
assert all(ours.startswith(sys.argv[2] + ':') for what, (ours, _) in rq_names(conn).items() if what != 'queue name')
print(_mismatches(conn))
"""


@pytest.mark.parametrize('prefix', ['myapp', '{myapp}'])
def test_rq_key_names_match_rq_under_a_configured_prefix(server, prefix: str) -> None:
    try:
        from rq.defaults import RQ_KEY_PREFIX  # noqa: F401
    except ImportError:
        pytest.skip('RQ 2 has a fixed key prefix')
    env = dict(os.environ, RQ_KEY_PREFIX=prefix, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, '-c', CHECK, server.url, prefix],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '{}'
