"""The cron-like sweeper of one side (``python -m benchmarks.chaos sweeper``)."""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

import rq_epoch
from rq_epoch.compat import text as _text
from rq_epoch.protocol import keys
from rq_epoch.worker.failover import is_outage

from .plan import EPOCH, QUEUE, SERVER_ERRORS, SIDES


def sweeper_main(argv: Sequence[str]) -> int:
    """``python -m benchmarks.chaos sweeper``: sweep every ``--interval`` s until SIGTERM.

    rq-epoch: :class:`rq_epoch.Sweeper` (settings from ``RQ_EPOCH_*``); stock:
    ``StartedJobRegistry.cleanup()``. Verdicts (and, for stock, the job ids found expired
    before each cleanup) are appended to ``--out`` as JSON lines. Server outages are
    ridden out; the loop ends after ``--limit`` seconds at most.
    """
    p = argparse.ArgumentParser(prog='python -m benchmarks.chaos sweeper')
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument('--url')
    where.add_argument('--sentinel', help='host:port,... of the sentinels (a new connection each sweep, as cron)')
    p.add_argument('--side', choices=SIDES, required=True)
    p.add_argument('--queue', action='append', default=None, help='a queue to sweep (repeatable; default chaos)')
    p.add_argument('--interval', type=float, default=1.0)
    p.add_argument('--out', type=Path, required=True)
    p.add_argument('--limit', type=float, default=3600.0)
    ns = p.parse_args(list(argv))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def connect() -> redis.Redis:
        if ns.url:
            return redis.Redis.from_url(ns.url, socket_timeout=5, socket_connect_timeout=1)
        from redis.sentinel import Sentinel

        from tests.sentinel import MASTER_NAME

        instances = [(h, int(p)) for h, p in (x.rsplit(':', 1) for x in ns.sentinel.split(','))]
        sentinel = Sentinel(instances, socket_timeout=2, socket_connect_timeout=1)
        return sentinel.master_for(MASTER_NAME, socket_timeout=5, socket_connect_timeout=1)

    client = connect()
    deadline = time.monotonic() + ns.limit
    unreachable = False
    with open(ns.out, 'a', encoding='utf-8') as out:
        while not stop.is_set() and time.monotonic() < deadline:
            if ns.sentinel:
                client.close()
                client = connect()
            try:
                records = _sweep_once(client, ns.side, ns.queue or [QUEUE])
                if unreachable:
                    records.append({'event': 'server back'})
                unreachable = False
            except (*SERVER_ERRORS, redis.exceptions.ResponseError) as exc:
                if isinstance(exc, redis.exceptions.ResponseError) and not is_outage(exc):
                    raise
                # Unreachable, or cannot take writes now (NOREPLICAS, READONLY...): as cron, try later.
                records = [] if unreachable else [{'event': 'server unreachable', 'error': str(exc)}]
                unreachable = True
            for record in records:
                out.write(json.dumps({'t': round(time.time(), 3), **record}) + '\n')
            out.flush()
            stop.wait(ns.interval)
    client.close()
    return 0


def _sweep_once(client: redis.Redis, side: str, queues: Sequence[str]) -> list[dict[str, Any]]:
    """One sweep of ``queues``: rq-epoch's sweep or stock cleanup; the records to log."""
    if side == EPOCH:
        report = rq_epoch.Sweeper(client).sweep(list(queues))
        return [
            {
                'job_id': v.job_id,
                'verdict': v.verdict,
                'stalled': v.stalled,
                'lease_epoch': v.lease_epoch,
                'run_id': v.run_id,
            }
            for v in report.verdicts
            if v.verdict != 'deferred'
        ]
    from rq.registry import StartedJobRegistry

    records = []
    for queue in queues:
        seconds, _ = client.time()
        expired = [_text(m).split(':', 1)[0] for m in client.zrangebyscore(keys.wip_key(queue), 0, seconds)]
        StartedJobRegistry(queue, connection=client).cleanup()
        records += [{'job_id': job_id, 'verdict': 'abandoned (stock cleanup)'} for job_id in expired]
    return records
