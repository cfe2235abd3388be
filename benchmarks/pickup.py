"""How soon does a worker on several queues start a job that was just enqueued?

A worker on several queues takes jobs with rq-epoch's ``take`` script (one atomic move into
the queue's intermediate list) and waits for the next job with client tracking; stock RQ
pops with ``BLPOP``. Real ``rq worker`` processes on three queues, one side at a time on the
same server, in the order stock, rq-epoch, rq-epoch, stock, stock, rq-epoch (quick: stock,
rq-epoch), each with its defaults; the jobs are ``benchmarks.jobs.noop``:

1. **After idle.** The worker has been idle for 1 to 1.25 s; one job is enqueued; the
   latency from ``enqueued_at`` to ``started_at`` (both written by RQ). Repeated.
2. **Under load.** Jobs enqueued at a steady rate across the three queues; the same
   latency, p50/p90/p99/mean, and the ratio rq-epoch / stock.
3. **Backlog.** Jobs already waiting on the three queues: jobs per second, and requests
   (the server's ``total_reads_processed``) per job.
4. **The wait alone.** In one process, no work-horse: a thread enqueues a job while the
   other waits in stock's ``Queue.dequeue_any`` (``BLPOP``, then the job's ``HGETALL``) or in
   rq-epoch's ``Taker.dequeue_any`` (wake-up, ``EXISTS``, take, ``HGETALL``); the time from
   the enqueue call to the dequeue's return, alternating the sides.

What idle workers cost the server, and pickup as the fleet grows: :mod:`benchmarks.fleet`.

    python -m benchmarks.pickup          # about 5 minutes
    python -m benchmarks.pickup --quick  # under a minute
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from pathlib import Path
from statistics import mean
from typing import Any

import redis
from rq import Queue

from rq_epoch import Job as EpochJob
from rq_epoch.worker.take import Taker

from . import harness
from .harness import EPOCH, STOCK
from .report import finish

NAME = 'pickup'
QUEUES = ('pick1', 'pick2', 'pick3')
ORDER_FULL = (STOCK, EPOCH, EPOCH, STOCK, STOCK, EPOCH)
ORDER_QUICK = (STOCK, EPOCH)
#: rq-epoch's pickup latency under load may be at most this times stock's (p50).
LOAD_TARGET = 1.1


def one_run(conn: redis.Redis, url: str, side: str, sizes: dict[str, Any], log: Path) -> dict[str, Any]:
    """Start one worker of ``side`` on the three queues and measure 1-3 with it."""
    conn.flushall()
    queues = [Queue(name, connection=conn) for name in QUEUES]
    proc = harness.start_worker(url, side, log, QUEUES)
    try:
        harness.wait_idle(conn, 1)
        after_idle: list[float] = []
        jitter = random.Random(7)  # the same gaps for every side
        for i in range(sizes['idle_rounds']):
            time.sleep(sizes['idle_gap'] + jitter.uniform(0.0, 0.25))
            job = queues[(i + 2) % 3].enqueue('benchmarks.jobs.noop')
            if not harness.wait_finished(conn, [job.id], 30):
                raise RuntimeError(f'{side}: job after idle not finished')
            after_idle += harness.latencies_ms(conn, [job.id])
        ids = []
        next_at = time.perf_counter()
        for i in range(sizes['load_jobs']):
            ids.append(queues[i % 3].enqueue('benchmarks.jobs.noop').id)
            next_at += 1.0 / sizes['rate']
            time.sleep(max(0.0, next_at - time.perf_counter()))
        load_ok = harness.wait_finished(conn, ids, 120)
        under_load = harness.latencies_ms(conn, ids)
        with conn.pipeline() as pipe:
            backlog = [queues[i % 3].enqueue('benchmarks.jobs.noop', pipeline=pipe).id for i in range(sizes['backlog'])]
            pipe.execute()
        reads_before, start = conn.info('stats')['total_reads_processed'], time.monotonic()
        polls = harness.wait_finished(conn, backlog, 300)
        drained = time.monotonic() - start
        # the worker's requests: the benchmark's polls and its second INFO left out
        reads = conn.info('stats')['total_reads_processed'] - reads_before - polls - 1
    finally:
        harness.stop_workers([proc], grace=30.0)
    return {
        'side': side,
        'ok': bool(load_ok and polls),
        'after_idle': harness.stats_ms(after_idle),
        'under_load': harness.stats_ms(under_load),
        'backlog': {
            'jobs': sizes['backlog'],
            'seconds': round(drained, 3),
            'jobs_per_second': round(sizes['backlog'] / drained, 1),
            'reads_per_job': round(reads / sizes['backlog'], 2),
        },
    }


def wait_alone(conn: redis.Redis, url: str, samples: int) -> dict[str, Any]:
    """Time from an enqueue call to the dequeue returning that job, stock vs the take (no fork)."""
    conn.flushall()
    client = redis.Redis.from_url(url)
    waiting = [Queue(name, connection=client) for name in QUEUES]
    producer = [Queue(name, connection=conn) for name in QUEUES]
    taker = Taker(client)
    jitter = random.Random(11)
    times: dict[str, list[float]] = {STOCK: [], EPOCH: []}
    for i in range(samples):
        for side in (STOCK, EPOCH) if i % 2 == 0 else (EPOCH, STOCK):
            sent: list[float] = []

            delay = 0.02 + jitter.uniform(0.0, 0.02)

            def push(queue: Queue = producer[i % 3], delay: float = delay, sent: list[float] = sent) -> None:
                time.sleep(delay)
                sent.append(time.perf_counter())
                queue.enqueue('benchmarks.jobs.noop')

            thread = threading.Thread(target=push, daemon=True)
            thread.start()
            if side == STOCK:
                result = Queue.dequeue_any(waiting, 5, connection=client)
            else:
                result = taker.dequeue_any(waiting, 5, job_class=EpochJob)
            done = time.perf_counter()
            thread.join(5)
            if result is None or not sent:
                raise RuntimeError(f'{side}: the dequeue returned no job')
            times[side].append((done - sent[0]) * 1000.0)
            conn.delete(*[queue.intermediate_queue_key for queue in waiting])
    taker.close()
    client.close()
    out: dict[str, Any] = {side: harness.stats_ms(values) for side, values in times.items()}
    out['added_p50_ms'] = round(out[EPOCH]['p50_ms'] - out[STOCK]['p50_ms'], 3)
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means per side and the ratios rq-epoch / stock."""
    out: dict[str, Any] = {}
    for side in (STOCK, EPOCH):
        mine = [r for r in runs if r['side'] == side]
        out[side] = {
            'after_idle_p50_ms': round(mean(r['after_idle']['p50_ms'] for r in mine), 2),
            'after_idle_max_ms': round(max(r['after_idle']['max_ms'] for r in mine), 2),
            'load_p50_ms': round(mean(r['under_load']['p50_ms'] for r in mine), 2),
            'load_p99_ms': round(mean(r['under_load']['p99_ms'] for r in mine), 2),
            'load_mean_ms': round(mean(r['under_load']['mean_ms'] for r in mine), 2),
            'backlog_jobs_per_second': round(mean(r['backlog']['jobs_per_second'] for r in mine), 1),
            'backlog_reads_per_job': round(mean(r['backlog']['reads_per_job'] for r in mine), 2),
        }
    s, e = out[STOCK], out[EPOCH]
    out['ratio'] = {
        'after_idle_p50': harness.ratio(e['after_idle_p50_ms'], s['after_idle_p50_ms']),
        'load_p50': harness.ratio(e['load_p50_ms'], s['load_p50_ms']),
        'load_mean': harness.ratio(e['load_mean_ms'], s['load_mean_ms']),
        'backlog_jobs_per_second': harness.ratio(e['backlog_jobs_per_second'], s['backlog_jobs_per_second']),
    }
    out['load_target'] = LOAD_TARGET
    out['load_target_met'] = out['ratio']['load_p50'] is not None and out['ratio']['load_p50'] <= LOAD_TARGET
    return out


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    sizes = {
        'idle_rounds': 3 if args.quick else 20,
        'idle_gap': 0.5 if args.quick else 1.0,
        'rate': 20.0,
        'load_jobs': 20 if args.quick else 400,
        'backlog': 30 if args.quick else 500,
    }
    with harness.server(args.server) as srv, tempfile.TemporaryDirectory(prefix='rq-epoch-bench-') as tmp:
        conn = srv.client()
        runs = []
        for index, side in enumerate(ORDER_QUICK if args.quick else ORDER_FULL):
            runs.append(one_run(conn, srv.url, side, sizes, Path(tmp) / f'{index}-{side}.log'))
            r = runs[-1]
            print(
                f'  run {index + 1}: {side:<8} after idle p50 {r["after_idle"]["p50_ms"]:6.1f} ms; '
                f'load p50 {r["under_load"]["p50_ms"]:6.1f} ms; backlog {r["backlog"]["jobs_per_second"]:6.1f} jobs/s',
                flush=True,
            )
        doc = {'quick': args.quick, 'server': harness.server_version(conn), 'queues': len(QUEUES), 'sizes': sizes}
        doc.update(runs=runs, wait_alone=wait_alone(conn, srv.url, 20 if args.quick else 300), summary=summary(runs))
        return finish(NAME, doc, args.out, all(r['ok'] for r in runs), conn)


if __name__ == '__main__':
    raise SystemExit(main())
