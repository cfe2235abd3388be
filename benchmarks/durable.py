"""What does ``RQ_EPOCH_DURABLE_REPLICAS=1`` cost a job: latency and one worker's throughput?

A primary and one replica on loopback (AOF, fsync every second). Three sides, each one real
``rq worker`` process with its defaults: stock RQ, rq-epoch, and rq-epoch with
``RQ_EPOCH_DURABLE_REPLICAS=1`` (each grant and each outcome confirmed by the replica with
``WAIT`` before it counts as written). For each side:

* **latency**: ``--latency-jobs`` no-op jobs, one at a time, each enqueued while the worker
  waits idle: from the enqueue call's return to the moment the job reads ``finished``
  (polled), in ms;
* **throughput**: ``-n`` no-op jobs enqueued at once, drained by one ``rq worker --burst``
  (a work-horse forked per job): jobs per second from the worker's start to its exit.

And the producer's side: ``rq_epoch.Queue.enqueue`` with ``durable_replicas=0`` and ``=1``
(each durable enqueue confirmed by the replica), in ms per call.

    python -m benchmarks.durable          # 1,000 jobs, 100 one at a time, 200 enqueues
    python -m benchmarks.durable --quick  # 20, 5, 10
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from rq.registry import FinishedJobRegistry

from rq_epoch import Queue
from rq_epoch.embedded import EmbeddedServer

from .fixture import enqueue_jobs
from .harness import (
    EPOCH,
    ROOT,
    SERVER_CONFIG,
    STOCK,
    parser,
    ratio,
    run_burst_worker,
    server,
    server_version,
    stats_ms,
    stop_workers,
    wait_idle,
    worker_argv,
    worker_env,
)
from .report import finish

NAME = 'durable'
QUEUE = 'bench'
DURABLE = 'rq-epoch durable'
SIDES = (STOCK, EPOCH, DURABLE)
DURABLE_ENV = {'RQ_EPOCH_DURABLE_REPLICAS': '1'}


def _env(side: str) -> dict[str, str]:
    return worker_env(**DURABLE_ENV) if side == DURABLE else worker_env()


def _unconfirmed(log: Path) -> int:
    """Lines of a worker's log saying that a confirmation did not come (none expected here)."""
    text = log.read_text(errors='replace') if log.exists() else ''
    return text.count('no replica confirmed') + text.count('no replica is connected')


def _argv(url: str, side: str, *options: str) -> list[str]:
    return worker_argv(url, STOCK if side == STOCK else EPOCH, [QUEUE], *options)


def throughput(conn: redis.Redis, url: str, side: str, n: int, log: Path, timeout: float) -> dict[str, Any]:
    """``n`` no-op jobs drained by one burst worker of ``side``."""
    conn.flushall()
    jobs = enqueue_jobs(conn, QUEUE, n, on_failure=False)
    start = time.perf_counter()
    rc = run_burst_worker(_argv(url, side, '--burst'), _env(side), log, timeout)
    wall = time.perf_counter() - start
    finished = FinishedJobRegistry(QUEUE, connection=conn).count
    return {
        'side': side,
        'n': n,
        'ok': rc == 0 and finished == len(jobs.job_ids) and not _unconfirmed(log),
        'wall_seconds': round(wall, 3),
        'jobs_per_second': round(n / wall, 1),
    }


def latency(conn: redis.Redis, url: str, side: str, m: int, log: Path, timeout: float) -> dict[str, Any]:
    """``m`` no-op jobs, one at a time, each enqueued while one worker of ``side`` waits idle."""
    conn.flushall()
    queue = Queue(QUEUE, connection=conn, durable_replicas=0)
    with open(log, 'wb') as fh:
        proc = subprocess.Popen(_argv(url, side), cwd=ROOT, env=_env(side), stdout=fh, stderr=subprocess.STDOUT)
    values: list[float] = []
    ok = True
    try:
        wait_idle(conn, 1)
        for _ in range(m):
            job = queue.enqueue('benchmarks.jobs.noop')
            start = time.perf_counter()
            deadline = time.monotonic() + timeout
            while conn.hget(job.key, 'status') != b'finished':
                if time.monotonic() > deadline:
                    ok = False
                    break
                time.sleep(0.0005)
            values.append((time.perf_counter() - start) * 1000.0)
            time.sleep(0.05)  # the worker back in its wait
    finally:
        stop_workers([proc])
    return {'side': side, 'm': m, 'ok': ok and not _unconfirmed(log), **stats_ms(values)}


def enqueues(conn: redis.Redis, k: int) -> dict[str, Any]:
    """``k`` calls of ``rq_epoch.Queue.enqueue`` without and with ``durable_replicas=1``."""
    conn.flushall()
    out: dict[str, Any] = {}
    for replicas in (0, 1):
        queue = Queue(QUEUE, connection=conn, durable_replicas=replicas)
        values = []
        for _ in range(k):
            start = time.perf_counter()
            queue.enqueue('benchmarks.jobs.noop')
            values.append((time.perf_counter() - start) * 1000.0)
        out[f'durable_replicas={replicas}'] = stats_ms(values)
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('-n', type=int, default=None, help='jobs of the throughput run (default 1000; quick 20)')
    p.add_argument('--latency-jobs', type=int, default=None, help='jobs one at a time (default 100; quick 5)')
    p.add_argument('--enqueues', type=int, default=None, help='enqueue calls per setting (default 200; quick 10)')
    p.add_argument('--timeout', type=float, default=600.0, help='longest a run may take (s)')
    args = p.parse_args(argv)
    n = args.n or (20 if args.quick else 1000)
    m = args.latency_jobs or (5 if args.quick else 100)
    k = args.enqueues or (10 if args.quick else 200)
    with server(args.server) as srv, tempfile.TemporaryDirectory(prefix='rq-epoch-bench-') as tmp:
        replica = EmbeddedServer(
            args.server, extra_config={**SERVER_CONFIG, 'replicaof': f'127.0.0.1 {srv.port}'}
        ).start()
        try:
            conn = srv.client()
            replica_client = replica.client()
            deadline = time.monotonic() + 30
            while replica_client.info('replication').get('master_link_status') != 'up':
                if time.monotonic() > deadline:
                    raise RuntimeError('the replica did not sync within 30 s')
                time.sleep(0.05)
            latencies, rates = [], []
            for side in SIDES:
                latencies.append(latency(conn, srv.url, side, m, Path(tmp) / f'latency-{side}.log', args.timeout))
                print(f'  latency {side:<17} p50 {latencies[-1]["p50_ms"]} ms', flush=True)
            for side in SIDES:
                rates.append(throughput(conn, srv.url, side, n, Path(tmp) / f'rate-{side}.log', args.timeout))
                print(f'  throughput {side:<17} {rates[-1]["jobs_per_second"]} jobs/s', flush=True)
            producer = enqueues(conn, k)
            by_side = {r['side']: r for r in rates}
            lat = {r['side']: r for r in latencies}
            doc = {
                'quick': args.quick,
                'server': server_version(conn),
                'replicas': int(conn.info('replication').get('connected_slaves', 0)),
                'latency': latencies,
                'throughput': rates,
                'enqueue': producer,
                'summary': {
                    'throughput_durable_over_epoch': ratio(
                        by_side[DURABLE]['jobs_per_second'], by_side[EPOCH]['jobs_per_second']
                    ),
                    'throughput_durable_over_stock': ratio(
                        by_side[DURABLE]['jobs_per_second'], by_side[STOCK]['jobs_per_second']
                    ),
                    'latency_p50_added_ms': round(lat[DURABLE]['p50_ms'] - lat[EPOCH]['p50_ms'], 2),
                },
            }
            ok = all(r['ok'] for r in latencies + rates)
            return finish(NAME, doc, args.out, ok, conn)
        finally:
            replica.close()


if __name__ == '__main__':
    raise SystemExit(main())
