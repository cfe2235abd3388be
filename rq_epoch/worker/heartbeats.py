"""Keeping a lease: the grant at the start of an execution and the heartbeat that extends it.

The worker grants a lease stamped with the server's run_id when RQ prepares an execution (the
grant script rides in RQ's transaction, see :class:`rq_epoch.jobs.job.StartedJobRegistry`) and
extends and re-stamps it at every heartbeat, in the round trip of RQ's own heartbeat. The
functions here are those two round trips; :class:`rq_epoch.Worker` calls them from RQ's hooks
(``prepare_execution``, ``maintain_heartbeats``) and its lease keeper thread from its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import redis.exceptions
from rq.job import Job as RQJob
from rq.utils import now
from rq.worker import Worker as RQWorker

from ..errors import CONNECTION_ERRORS, OutcomeRefused, RqEpochError
from ..jobs.job import EpochJobMixin, StartedJobRegistry
from ..jobs.jobclass import adopt
from ..protocol import keys, scripts, verbs
from ..protocol.durable import Durability
from ..settings import EpochSettings
from .fence import Fence

if TYPE_CHECKING:
    from redis import Redis
    from rq.executions import Execution

__all__ = ['confirm_grant', 'grant_again', 'heartbeat_round_trip', 'lease_ttl']


def lease_ttl(settings: EpochSettings, job: RQJob, working_time: float = 0.0) -> int:
    """Seconds a lease lasts past a heartbeat: the heartbeat interval plus the lease margin.

    The interval is cut to what is left of the job's timeout (at least 1 s), as RQ's own
    heartbeat TTL is. ``working_time``: seconds the job has run (read from its start if 0).
    """
    interval = settings.heartbeat_interval
    if job.timeout and job.timeout > 0:
        if not working_time and job.started_at:
            working_time = (now() - job.started_at).total_seconds()
        interval = max(1, int(min(job.timeout - working_time, interval)))
    return interval + settings.lease_margin


def grant_again(connection: Redis, job: RQJob, execution: Execution, ttl: int, job_class: type[RQJob]) -> None:
    """Grant the lease of ``execution`` on its own, after RQ's transaction found no grant script.

    The server restarted since the scripts were loaded: RQ's writes landed, the grant did
    not. The caller loads the scripts first.
    """
    registry = StartedJobRegistry(job.origin, connection=connection, job_class=job_class)
    verbs.grant(connection, registry.grant_keys(job.id), [job.id, ttl, execution.id, keys.PREFIX])


def heartbeat_round_trip(
    worker: RQWorker, job: RQJob, execution: Execution, ttl: int, connection: Redis
) -> verbs.ExtendReply:
    """One heartbeat of ``worker`` running ``job``: RQ's writes and the lease's extension, one round trip.

    RQ's heartbeat of the worker, of the execution (whose registry entry carries the extend
    script, see :class:`rq_epoch.jobs.job.StartedJobRegistry`) and of the job, on one
    pipeline sent over ``connection`` (a lease keeper thread has its own). RQ's follow-up
    writes (a job hash that was gone, a worker hash that expired) go in a second round trip
    only when needed. Returns what the extend script found.

    Raises:
        RqEpochError: the heartbeat carried no extension (the job's registry is not rq-epoch's).
    """
    worker_ttl = worker.job_monitoring_interval + 60
    registry = cast(EpochJobMixin, adopt(job)).heartbeat_registry
    registry.extend_index = None  # set again when RQ's heartbeat registers the execution
    with connection.pipeline() as pipeline:
        worker.heartbeat(worker_ttl, pipeline=pipeline)
        execution.heartbeat(registry, ttl, pipeline=pipeline)
        job_index = len(pipeline)
        job.heartbeat(now(), ttl, pipeline=pipeline, xx=True)
        results = pipeline.execute(raise_on_error=False)
        extend_index = registry.extend_index
        extend_result = results[extend_index] if extend_index is not None else None
        for index, result in enumerate(results):
            if isinstance(result, redis.exceptions.ResponseError) and index != extend_index:
                if not isinstance(result, redis.exceptions.NoScriptError):
                    raise result
        reply: verbs.ExtendReply | None = None
        if isinstance(extend_result, redis.exceptions.NoScriptError):
            scripts.load_all(connection)
            reply = verbs.extend(
                connection, registry.extend_keys(job.id), [job.id, max(ttl, 1), execution.id, keys.PREFIX]
            )
        elif isinstance(extend_result, redis.exceptions.ResponseError):
            scripts.raise_typed(extend_result)
        elif extend_result is not None:
            reply = verbs.ExtendReply.read(extend_result)
        # RQ's follow-up, on the same pipeline: sent only when there is something to send.
        if results[job_index] == 1:  # the job hash was gone: don't leave a stub (rq#1450)
            pipeline.delete(job.key)
        if results[0] == 1:  # the worker hash had expired
            pipeline.hset(worker.key, mapping=worker.serialize())
            pipeline.expire(worker.key, worker_ttl)
        pipeline.execute()
    if reply is None:
        raise RqEpochError(
            f'the heartbeat of job {job.id} carried no lease extension: its registry is not '
            "rq-epoch's StartedJobRegistry (a job class without the epoch behaviour?)"
        )
    return reply


def confirm_grant(
    durability: Durability,
    connection: Redis,
    fence: Fence,
    *,
    follow: Callable[[], bool],
    heartbeat: Callable[[], verbs.ExtendReply],
    heartbeat_every: float,
    give_up: float,
    log: logging.Logger | logging.LoggerAdapter[Any],
    name: str,
) -> OutcomeRefused | None:
    """Wait until replicas confirm the grant of ``fence``'s execution, before its job runs.

    Each confirmation carries the fence's check, on the same server: returns None once a
    server that holds this execution's lease confirmed it (or counts as written, see
    :class:`~rq_epoch.protocol.durable.Durability`), and the fence's refusal when the server
    the worker talks to does not hold it (a failover lost the grant, and the job waits in its
    queue there; or a sweep took it): the job must not run; it runs from where it waits, once.

    While it waits, ``follow()`` moves the worker to a new primary (True when it moved) and
    ``heartbeat()`` extends the lease every ``heartbeat_every`` seconds, so that no sweep
    takes a lease that waits for its replicas. At the monotonic time ``give_up`` the job
    runs unconfirmed (one warning).
    """
    waiting_since = time.monotonic()
    next_beat = waiting_since + heartbeat_every
    said = False
    check = (fence.script_keys, fence.script_args('0', 0))
    for _ in range(1_000_000):  # each turn waits up to the durable timeout (the time limit ends it)
        try:
            confirmation = durability.confirm(connection, check)
        except CONNECTION_ERRORS:
            confirmation = None  # the primary is going away: follow it, and look for the lease there
            time.sleep(0.1)
        here = confirmation.check if confirmation is not None else None
        if here is not None and not here.lands:
            # The server that answered (the primary now) does not hold this execution's lease.
            refusal = fence.refusal(here)
            log.warning(
                'Worker %s: the grant of job %s to execution %s was lost before a replica confirmed it (%s); '
                'not running it here',
                name,
                fence.job_id,
                fence.execution_id,
                refusal.describe(),
            )
            return refusal
        if confirmation is not None and confirmation.confirmed and (here is None or here.leased):
            break  # the lease is on the server that confirmed it
        if not said:
            said = True
            log.warning(
                'Worker %s: no replica confirmed the grant of job %s within %s ms; waiting before running it',
                name,
                fence.job_id,
                durability.timeout_ms,
            )
        follow()
        now = time.monotonic()
        if now >= give_up:
            log.warning(
                'Worker %s: the grant of job %s is still not confirmed after %.0fs; running it unconfirmed',
                name,
                fence.job_id,
                now - waiting_since,
            )
            return None
        if now >= next_beat and here is not None and here.leased:
            next_beat = now + heartbeat_every
            try:
                heartbeat()  # the lease is here: keep it while its replicas catch up
            except CONNECTION_ERRORS:
                continue
    if said:
        log.warning(
            'Worker %s: the grant of job %s confirmed after %.1fs; running it',
            name,
            fence.job_id,
            time.monotonic() - waiting_since,
        )
    return None
