"""The producer of one side: enqueues the planned workload at its planned times."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from rq import Callback, Retry
from rq.job import Dependency
from rq.queue import Queue as RQQueue

import rq_epoch
from rq_epoch.protocol import keys
from rq_epoch.worker.failover import is_outage

from .plan import EPOCH, ON_FAILURE, PILL, RESULT_TTL, SERVER_ERRORS, WORK, Config, JobSpec, Plan


class Producer(threading.Thread):
    """Enqueues the planned jobs at their times, riding out server outages."""

    def __init__(
        self, side: str, cfg: Config, plan: Plan, connect: Callable[[], redis.Redis], ledger: Path, t0: float
    ) -> None:
        """A producer for ``side`` that enqueues ``plan`` through ``connect()``, timed from ``t0``.

        Under Sentinel ``connect`` asks the sentinels: a new connection is made for every job,
        as a short-lived producer would, so that no job is enqueued on a demoted primary.
        """
        super().__init__(name=f'producer-{side}', daemon=True)
        self.side = side
        self.cfg = cfg
        self.plan = plan
        self.connect = connect
        self.ledger = ledger
        self.t0 = t0
        self.stop = threading.Event()
        #: Cleared by the harness while a manual failover is under way: the producer stands for
        #: clients that are not under test, and a job enqueued on the old primary in the instant
        #: after the promotion would be lost with every other write there.
        self.calm = threading.Event()
        self.calm.set()
        self.enqueued: list[str] = []
        self.errors: list[str] = []
        #: Jobs whose durable enqueue (``RQ_EPOCH_DURABLE_REPLICAS``) no replica confirmed in
        #: time: the producer was told they may or may not exist (``EnqueueNotConfirmed``).
        self.unconfirmed: list[str] = []

    def run(self) -> None:
        """Enqueue every planned job at its time (stops early when :attr:`stop` is set)."""
        queue_class = rq_epoch.Queue if self.side == EPOCH else RQQueue
        fresh = self.cfg.topology == 'sentinel'
        client = self.connect()
        try:
            for spec in self.plan.jobs:
                delay = self.t0 + spec.at - time.time()
                if delay > 0 and self.stop.wait(delay):
                    return
                if self.stop.is_set():
                    return
                self.calm.wait(60)
                if fresh:
                    client.close()
                    client = self.connect()
                self._enqueue(queue_class(self.cfg.queue_of(spec.id), connection=client), client, spec)
        finally:
            client.close()

    def _enqueue(self, queue: Any, client: redis.Redis, spec: JobSpec) -> None:
        """Enqueue one job; after a connection error, check whether it landed before trying again."""
        kwargs: dict[str, Any] = {
            'job_id': spec.id,
            'result_ttl': RESULT_TTL,
            'failure_ttl': RESULT_TTL,
            'timeout': 180,
        }
        if self.cfg.retry_budget:
            kwargs['retry'] = Retry(max=self.cfg.retry_budget)
        if spec.callback:
            kwargs['on_failure'] = Callback(ON_FAILURE)
        if spec.parent:
            kwargs['depends_on'] = Dependency(jobs=[spec.parent], allow_failure=True)
        args: tuple[Any, ...]
        if spec.kind == 'pill':
            func, args = PILL, (str(self.ledger), spec.id)
            if self.side == EPOCH:
                kwargs['max_stalled'] = self.cfg.max_stalled
        else:
            func, args = WORK, (str(self.ledger), spec.id, spec.seconds)
        deadline = time.monotonic() + 120
        attempt = 0
        while not self.stop.is_set():
            try:
                if attempt and client.exists(keys.job_key(spec.id)):
                    break  # the enqueue (one transaction) landed before the connection dropped
                queue.enqueue_call(func, args=args, **kwargs)
                break
            except rq_epoch.EnqueueNotConfirmed:
                self.unconfirmed.append(spec.id)  # reported to the producer; the audit finds whether it ran
                break
            except (*SERVER_ERRORS, redis.exceptions.ResponseError) as exc:
                if isinstance(exc, redis.exceptions.ResponseError) and not is_outage(exc):
                    raise  # NOREPLICAS, READONLY...: the server cannot take writes now; anything else is a bug
                attempt += 1
                if time.monotonic() > deadline:
                    self.errors.append(f'{spec.id}: server unreachable for 120 s, not enqueued')
                    return
                time.sleep(0.2)
        self.enqueued.append(spec.id)
