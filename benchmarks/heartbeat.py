"""What does rq-epoch's stamp add to a worker's heartbeat: round trips, commands, time?

Two measurements, stock ``rq.Worker`` and ``rq_epoch.Worker`` on the same server:

1. **Real workers.** ``rq worker --burst`` runs jobs of about a second with a 1-second
   monitoring interval (``--job-monitoring-interval 1``; ``RQ_EPOCH_HEARTBEAT_INTERVAL=1``),
   and every heartbeat records the round trips and commands it sent
   (:mod:`benchmarks._probe_worker`). The server's commandstats show whether any
   ``SCRIPT EXISTS`` (redis-py's ``Script`` on a pipeline) was sent.
2. **Latency.** In one process, one started job per side, and ``maintain_heartbeats``
   called alternately on each, many times: time per heartbeat (p50/p99) and the ratio.

rq-epoch's worker sweep is kept out of both (``sweep_interval`` of an hour): a sweep is
periodic maintenance, not part of a heartbeat; its idle cost is reported on its own.

    python -m benchmarks.heartbeat          # 8 jobs of 1.2 s per side; 2,000 heartbeats each
    python -m benchmarks.heartbeat --quick  # 2 jobs; 50 heartbeats
"""

from __future__ import annotations

import inspect
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

import redis
import rq
from rq import Queue

import rq_epoch
from rq_epoch import Sweeper
from rq_epoch.protocol import scripts

from .harness import (
    EPOCH,
    ROOT,
    STOCK,
    command_delta,
    commandstats,
    count_traffic,
    parser,
    percentile,
    ratio,
    server,
    server_version,
    worker_argv,
    worker_env,
)
from .report import finish

NAME = 'heartbeat'
QUEUE = 'beat'
LATENCY_TARGET = 1.2
JOB_SECONDS = 1.2


# -- 1. real workers ----------------------------------------------------------------------


def real_workers(conn: redis.Redis, url: str, jobs: int, tmp: Path) -> dict[str, Any]:
    """Run ``jobs`` one-second jobs through a real burst worker of each side; per-heartbeat traffic."""
    out: dict[str, Any] = {}
    for side in (STOCK, EPOCH):
        conn.flushall()
        queue = Queue(QUEUE, connection=conn)
        for _ in range(jobs):
            queue.enqueue('benchmarks.jobs.sleep_for', JOB_SECONDS)
        probe = tmp / f'{side}.jsonl'
        env = worker_env(BENCH_PROBE_OUT=str(probe), RQ_EPOCH_HEARTBEAT_INTERVAL='1', RQ_EPOCH_SWEEP_INTERVAL='3600')
        options = ('--burst', '--job-monitoring-interval', '1')
        argv = worker_argv(url, side, [QUEUE], *options, module='benchmarks._probe_worker')
        conn.config_resetstat()
        before = commandstats(conn)
        with open(tmp / f'{side}.log', 'wb') as log:
            proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=60 + jobs * 10)
        delta = command_delta(before, commandstats(conn))
        beats = [json.loads(line) for line in probe.read_text().splitlines()] if probe.exists() else []
        out[side] = {
            'exit_code': proc.returncode,
            'jobs': jobs,
            'heartbeats': len(beats),
            'round_trips_per_heartbeat': sorted({b['round_trips'] for b in beats}),
            'commands_per_heartbeat': sorted({b['commands'] for b in beats}),
            'heartbeat_us_mean': round(mean(b['us'] for b in beats), 1) if beats else None,
            'script_exists_sent': delta.get('script|exists', 0),
            'evalsha_sent': delta.get('evalsha', 0),
            'ok': proc.returncode == 0 and len(beats) >= jobs,
        }
    return out


# -- 2. latency, in one process -----------------------------------------------------------


def _started(conn: redis.Redis, worker: Any, queue: Queue) -> tuple[Any, Any]:
    job = queue.enqueue('benchmarks.jobs.noop')
    job = worker.job_class.fetch(job.id, connection=conn)
    execution = worker.prepare_execution(job)
    worker.prepare_job_execution(job)
    job.refresh()
    return job, execution


def _heartbeat_call(worker: Any, job: Any, execution: Any) -> Callable[[], None]:
    """The worker's own heartbeat: RQ 3 passes the execution, RQ 2 keeps it on the worker."""
    if 'execution' in inspect.signature(worker.maintain_heartbeats).parameters:
        return lambda: worker.maintain_heartbeats(job, execution)
    worker.execution = execution
    return lambda: worker.maintain_heartbeats(job)


def latency(conn: redis.Redis, beats: int) -> dict[str, Any]:
    """Alternate heartbeats of a stock and an rq-epoch worker; time and count each."""
    conn.flushall()
    stock_queue = Queue('beat-stock', connection=conn)
    epoch_queue = rq_epoch.Queue('beat-epoch', connection=conn)
    stock = rq.Worker([stock_queue], connection=conn, name='beat-stock', job_monitoring_interval=1)
    epoch = rq_epoch.Worker(
        [epoch_queue], connection=conn, name='beat-epoch', heartbeat_interval=1, sweep_interval=86_400
    )
    scripts.load_all(conn)
    epoch.contact.run_id = str(conn.info('server')['run_id'])
    epoch._last_sweep = time.monotonic()
    for worker in (stock, epoch):
        worker.register_birth()
    subjects = {
        STOCK: (stock, *_started(conn, stock, stock_queue)),
        EPOCH: (epoch, *_started(conn, epoch, epoch_queue)),
    }
    calls = {side: _heartbeat_call(*subject) for side, subject in subjects.items()}
    samples: dict[str, list[float]] = {STOCK: [], EPOCH: []}
    traffic_seen: dict[str, set[tuple[int, int]]] = {STOCK: set(), EPOCH: set()}
    for i in range(beats):
        order = (STOCK, EPOCH) if i % 2 == 0 else (EPOCH, STOCK)
        for side in order:
            beat = calls[side]
            with count_traffic() as traffic:
                start = time.perf_counter()
                beat()
                samples[side].append((time.perf_counter() - start) * 1e6)
            traffic_seen[side].add((traffic.round_trips, traffic.commands))
    out: dict[str, Any] = {}
    for side in (STOCK, EPOCH):
        values = samples[side]
        out[side] = {
            'heartbeats': len(values),
            'p50_us': round(percentile(values, 50), 1),
            'p99_us': round(percentile(values, 99), 1),
            'mean_us': round(mean(values), 1),
            'round_trips': sorted({rt for rt, _ in traffic_seen[side]}),
            'commands': sorted({c for _, c in traffic_seen[side]}),
        }
    out['ratio_p50'] = ratio(out[EPOCH]['p50_us'], out[STOCK]['p50_us'])
    out['ratio_mean'] = ratio(out[EPOCH]['mean_us'], out[STOCK]['mean_us'])
    out['target'] = LATENCY_TARGET
    out['target_met'] = out['ratio_p50'] is not None and out['ratio_p50'] <= LATENCY_TARGET
    return out


def idle_sweep(conn: redis.Redis, repeats: int) -> dict[str, Any]:
    """Round trips and time of a worker's periodic sweep when nothing has expired."""
    sweeper = Sweeper(conn, restart_grace=0)
    times = []
    traffic_seen = set()
    for _ in range(repeats):
        with count_traffic() as traffic:
            start = time.perf_counter()
            sweeper.sweep(['beat-epoch'])
            times.append((time.perf_counter() - start) * 1e6)
        traffic_seen.add((traffic.round_trips, traffic.commands))
    return {
        'p50_us': round(percentile(times, 50), 1),
        'round_trips': sorted({rt for rt, _ in traffic_seen}),
        'commands': sorted({c for _, c in traffic_seen}),
    }


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--jobs', type=int, default=None, help='one-second jobs per real worker (default 8; quick 2)')
    p.add_argument('--beats', type=int, default=None, help='heartbeats per side for latency (default 2000; quick 50)')
    args = p.parse_args(argv)
    jobs = args.jobs or (2 if args.quick else 8)
    beats = args.beats or (50 if args.quick else 2000)
    with server(args.server) as srv, tempfile.TemporaryDirectory(prefix='rq-epoch-bench-') as tmp:
        conn = srv.client()
        real = real_workers(conn, srv.url, jobs, Path(tmp))
        lat = latency(conn, beats)
        idle = idle_sweep(conn, 20 if args.quick else 200)
        extra_rt = {side: max(real[side]['round_trips_per_heartbeat'], default=0) for side in (STOCK, EPOCH)}
        no_extra = extra_rt[EPOCH] <= extra_rt[STOCK] and real[EPOCH]['script_exists_sent'] == 0
        doc = {
            'quick': args.quick,
            'server': server_version(conn),
            'real_workers': real,
            'latency': lat,
            'idle_sweep': idle,
            'targets': {'no_extra_round_trip': no_extra, 'latency_ratio_met': lat['target_met']},
        }
        return finish(NAME, doc, args.out, all(real[s]['ok'] for s in (STOCK, EPOCH)), conn)


if __name__ == '__main__':
    raise SystemExit(main())
