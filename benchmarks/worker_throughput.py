"""How many jobs per second does ``rq worker`` run with ``rq_epoch.Worker``, against stock RQ's?

The same N no-op jobs (``benchmarks.jobs.noop``) on the same queue, drained by one real
``rq worker --burst`` process (a work-horse forked per job), three runs per side in the
order stock, rq-epoch, rq-epoch, stock, stock, rq-epoch (so that drift on a shared machine
falls on both sides alike). Both
run with their defaults. Two rates per run: over the worker process's whole life (start-up
included), and from the first job's start to the last job's end (the steady rate).

Round trips are counted by the server: ``total_reads_processed`` (one read event per
request the worker sends, a pipeline or a MULTI/EXEC being one request) and
``total_commands_processed`` from ``INFO stats``, and the script calls from ``INFO
commandstats``, before and after the run, per job. A
fenced commit is RQ's own outcome transaction carried by one script call, so it should
show no more reads per job than stock.

The worker's own cost is read from the kernel, which is much less noisy than a rate on a
shared machine: CPU time (user + system) and minor page faults of the worker process and its
work-horses together (``RUSAGE_CHILDREN`` of this process: the worker reaps each work-horse),
per job, and how much of that CPU time the kernel spent; and the server's CPU per job (``INFO
cpu``). A work-horse is a forked copy of the worker, so each page either of them writes while
the other lives is copied: a fault, handled by the kernel.

The server's time inside script calls (``INFO commandstats``: the ``usec`` of ``EVALSHA`` and
``EVAL``, the commands the scripts run included) is reported per job too: it is the part of
the server's time that rq-epoch's grant and fenced commit add.

With ``--parts``, two more sides run in the same alternating order, each leaving one part of
rq-epoch out (:mod:`benchmarks.parts`): stock RQ's worker in a process that imported rq-epoch
(the size of the process a fork copies), and rq-epoch's worker without the fence (its outcomes
sent as RQ's own transaction). What each part costs is then its side's distance to stock.

Only the forking workers are compared (``rq_epoch.SimpleWorker`` runs jobs in-process).

    python -m benchmarks.worker_throughput          # 2,000 jobs per run, 6 runs
    python -m benchmarks.worker_throughput --parts  # and 3 runs of each part left out
    python -m benchmarks.worker_throughput --quick  # 30 jobs, 2 runs
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

import redis
from rq import Queue
from rq.registry import FinishedJobRegistry
from rq.utils import str_to_date

from rq_epoch.protocol import keys

from .fixture import enqueue_jobs
from .harness import EPOCH, STOCK, parser, ratio, run_burst_worker, server, server_version, worker_argv, worker_env
from .parts import BESIDE, PARTS, UNFENCED
from .report import THROUGHPUT_FIGURES, THROUGHPUT_RATIOS, finish

NAME = 'worker_throughput'
QUEUE = 'bench'
TARGET = 0.97
ORDER_FULL = (STOCK, EPOCH, EPOCH, STOCK, STOCK, EPOCH)
ORDER_QUICK = (STOCK, EPOCH)
ORDER_PARTS = (STOCK, EPOCH, UNFENCED, BESIDE, BESIDE, UNFENCED, EPOCH, STOCK, STOCK, EPOCH, UNFENCED, BESIDE)
ORDER_PARTS_QUICK = (STOCK, EPOCH, UNFENCED, BESIDE)


def steady_seconds(conn: redis.Redis, job_ids: list[str]) -> float:
    """From the first job's ``started_at`` to the last job's ``ended_at``."""
    with conn.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job_key(job_id), 'started_at', 'ended_at')
        rows = pipe.execute()
    starts = [str_to_date(r[0]).timestamp() for r in rows if r[0]]
    ends = [str_to_date(r[1]).timestamp() for r in rows if r[1]]
    return max(ends) - min(starts) if starts and ends else 0.0


def script_calls(conn: redis.Redis) -> tuple[int, float]:
    """Script calls (``EVALSHA``, ``EVAL``) the server ran so far, and the seconds it spent in
    them, the commands they ran included (``INFO commandstats``)."""
    stats = conn.info('commandstats')
    mine = [stats.get(f'cmdstat_{name}', {}) for name in ('evalsha', 'eval')]
    return sum(int(s.get('calls', 0)) for s in mine), sum(int(s.get('usec', 0)) for s in mine) / 1e6


def server_cpu(conn: redis.Redis) -> float:
    """Seconds of CPU the server used so far (``INFO cpu``: system + user)."""
    cpu = conn.info('cpu')
    return float(cpu['used_cpu_sys']) + float(cpu['used_cpu_user'])


def one_run(
    conn: redis.Redis, url: str, side: str, n: int, log_dir: Path, index: int, timeout: float
) -> dict[str, Any]:
    """Enqueue ``n`` no-op jobs and drain them with one burst worker of ``side`` (stock, rq-epoch,
    or one of :data:`benchmarks.parts.PARTS`)."""
    conn.flushall()
    jobs = enqueue_jobs(conn, QUEUE, n, on_failure=False)
    log = log_dir / f'{index}-{side.replace(" ", "-")}.log'
    if side in PARTS:
        argv = worker_argv(url, STOCK, [QUEUE], '--burst', '--worker-class', PARTS[side])
    else:
        argv = worker_argv(url, side, [QUEUE], '--burst')
    before, (before_calls, before_script), before_cpu = conn.info('stats'), script_calls(conn), server_cpu(conn)
    before_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    rc = run_burst_worker(argv, worker_env(), log, timeout)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    after, (after_calls, after_script), after_cpu = conn.info('stats'), script_calls(conn), server_cpu(conn)
    worker_cpu = usage.ru_utime + usage.ru_stime - before_usage.ru_utime - before_usage.ru_stime
    finished = FinishedJobRegistry(QUEUE, connection=conn).count
    steady = steady_seconds(conn, jobs.job_ids)
    return {
        'side': side,
        'n': n,
        'exit_code': rc,
        'finished': finished,
        'left_queued': Queue(QUEUE, connection=conn).count,
        'ok': rc == 0 and finished == n,
        'wall_seconds': round(wall, 3),
        'steady_seconds': round(steady, 3),
        'jobs_per_second': round(n / wall, 1),
        'steady_jobs_per_second': round(n / steady, 1) if steady else None,
        # The two INFO calls add one read and one command each.
        'reads_per_job': round((after['total_reads_processed'] - before['total_reads_processed'] - 1) / n, 2),
        'commands_per_job': round((after['total_commands_processed'] - before['total_commands_processed'] - 1) / n, 2),
        'scripts_per_job': round((after_calls - before_calls) / n, 2),
        # The worker and its work-horses; the worker process's start-up is included.
        'worker_cpu_ms_per_job': round(worker_cpu / n * 1000, 3),
        # Of it, the kernel's: the fork, the copies of the pages either process writes, the exit.
        'worker_system_cpu_ms_per_job': round((usage.ru_stime - before_usage.ru_stime) / n * 1000, 3),
        'page_faults_per_job': round((usage.ru_minflt - before_usage.ru_minflt) / n, 1),
        'server_cpu_ms_per_job': round((after_cpu - before_cpu) / n * 1000, 3),
        'script_server_ms_per_job': round((after_script - before_script) / n * 1000, 3),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean figures per side, the ratio rq-epoch / stock, and each part's ratios to stock."""
    out: dict[str, Any] = {}
    sides = [side for side in (STOCK, EPOCH, *PARTS) if any(r['side'] == side for r in runs)]
    for side in sides:
        mine = [r for r in runs if r['side'] == side]
        out[side] = {
            figure: round(mean(r[figure] or 0 for r in mine), digits) for figure, digits in THROUGHPUT_FIGURES.items()
        }
    out['ratio'] = ratio(out[EPOCH]['jobs_per_second'], out[STOCK]['jobs_per_second'])
    out['steady_ratio'] = ratio(out[EPOCH]['steady_jobs_per_second'], out[STOCK]['steady_jobs_per_second'])
    for key in THROUGHPUT_RATIOS:
        out[f'{key}_ratio'] = ratio(out[EPOCH][key], out[STOCK][key])
    for side in sides:
        if side in PARTS:
            out[side]['ratio'] = ratio(out[side]['jobs_per_second'], out[STOCK]['jobs_per_second'])
            for key in THROUGHPUT_RATIOS:
                out[side][f'{key}_ratio'] = ratio(out[side][key], out[STOCK][key])
    out['target'] = TARGET
    out['target_met'] = out['ratio'] is not None and out['ratio'] >= TARGET
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('-n', type=int, default=None, help='jobs per run (default 2000; quick 30)')
    p.add_argument('--timeout', type=float, default=600.0, help='longest a run may take (s)')
    p.add_argument(
        '--parts', action='store_true', help='also run the workers that leave one part out (benchmarks.parts)'
    )
    args = p.parse_args(argv)
    n = args.n or (30 if args.quick else 2000)
    if args.parts:
        order = ORDER_PARTS_QUICK if args.quick else ORDER_PARTS
    else:
        order = ORDER_QUICK if args.quick else ORDER_FULL
    with server(args.server) as srv, tempfile.TemporaryDirectory(prefix='rq-epoch-bench-') as tmp:
        conn = srv.client()
        runs = []
        for index, side in enumerate(order):
            runs.append(one_run(conn, srv.url, side, n, Path(tmp), index, args.timeout))
            print(
                f'  run {index + 1}: {side:<21} {runs[-1]["jobs_per_second"]:8.1f} jobs/s  '
                f'worker CPU {runs[-1]["worker_cpu_ms_per_job"]:6.2f} ms/job  load {os.getloadavg()[0]:.2f}  '
                f'ok={runs[-1]["ok"]}',
                flush=True,
            )
        doc = {
            'quick': args.quick,
            'server': server_version(conn),
            'runs': runs,
            'summary': summary(runs),
            'load_average': round(os.getloadavg()[0], 2),
        }
        return finish(NAME, doc, args.out, all(r['ok'] for r in runs), conn)


if __name__ == '__main__':
    raise SystemExit(main())
