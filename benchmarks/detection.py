"""How long until a dead worker's job runs again, with every setting at its default?

Per side, on a fresh server: two real ``rq worker`` processes with their defaults (stock:
``rq worker``; rq-epoch: ``rq worker --worker-class rq_epoch.Worker``, no ``RQ_EPOCH_*``
variable set) on one queue, and one long job. Once the job has started, the benchmark waits
a random part of one heartbeat interval (so the kill falls anywhere between two heartbeats),
then SIGKILLs the worker running it and its work-horse, and measures the time until the job
starts again on the other worker. rq-epoch runs ``--trials`` times; stock RQ once (it takes
minutes), bounded by ``--stock-timeout``.

    python -m benchmarks.detection                  # 5 rq-epoch trials, 1 stock trial
    python -m benchmarks.detection --skip-stock     # rq-epoch only
    python -m benchmarks.detection --quick          # rq-epoch only, short settings, 1 trial
"""

from __future__ import annotations

import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from rq import Queue

from rq_epoch.pids import send_signal
from rq_epoch.settings import DEFAULTS

from .harness import (
    EPOCH,
    ROOT,
    STOCK,
    job_starts,
    parser,
    server,
    server_version,
    stop_workers,
    wait_until,
    worker_argv,
    worker_env,
)
from .report import finish

NAME = 'detection'
QUEUE = 'detect'
TARGET = 40.0
#: The heartbeat stock RQ uses by default (``DEFAULT_JOB_MONITORING_INTERVAL``).
STOCK_HEARTBEAT = 30
#: Short settings for ``--quick`` (not the defaults: quick mode only checks that it runs).
QUICK_ENV = {'RQ_EPOCH_HEARTBEAT_INTERVAL': '1', 'RQ_EPOCH_LEASE_MARGIN': '2', 'RQ_EPOCH_SWEEP_INTERVAL': '1'}


def one_trial(
    conn: redis.Redis, url: str, side: str, folder: Path, index: int, timeout: float, env_extra: dict[str, str]
) -> dict[str, Any]:
    """Start two workers, kill the one running the job, time the job's next start."""
    conn.flushall()
    ledger = folder / f'{side}-{index}.starts'
    env = worker_env(**env_extra)
    workers = []
    for n in range(2):
        with open(folder / f'{side}-{index}-worker-{n}.log', 'wb') as log:
            argv = worker_argv(url, side, [QUEUE])
            workers.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        Queue(QUEUE, connection=conn).enqueue(
            'benchmarks.jobs.record_start_then_sleep', str(ledger), timeout + 600, job_timeout=int(timeout + 900)
        )
        first = wait_until(lambda: job_starts(ledger), 60)
        if not first:
            return {'side': side, 'ok': False, 'error': 'the job never started'}
        heartbeat = int(env_extra.get('RQ_EPOCH_HEARTBEAT_INTERVAL', 0)) or (
            DEFAULTS.heartbeat_interval if side == EPOCH else STOCK_HEARTBEAT
        )
        time.sleep(random.uniform(0, heartbeat))  # anywhere between two heartbeats
        _, horse, worker = first[0]
        for pid in (worker, horse):
            send_signal(pid, signal.SIGKILL)
        killed = time.time()
        again = wait_until(lambda: len(job_starts(ledger)) > 1 and job_starts(ledger), timeout, interval=0.2)
        if not again:
            return {'side': side, 'ok': False, 'error': f'not restarted within {timeout:.0f} s'}
        return {'side': side, 'ok': True, 'detection_seconds': round(again[1][0] - killed, 2)}
    finally:
        stop_workers(workers, grace=0.0)  # and the work-horse running the long job


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--trials', type=int, default=5, help='rq-epoch trials (default 5)')
    p.add_argument('--skip-stock', action='store_true', help='do not run the stock trial')
    p.add_argument('--stock-timeout', type=float, default=1200.0, help='longest wait for stock RQ (s)')
    args = p.parse_args(argv)
    trials = 1 if args.quick else args.trials
    env_extra = QUICK_ENV if args.quick else {}
    sides = [EPOCH] * trials + ([] if args.quick or args.skip_stock else [STOCK])
    runs = []
    with server(args.server) as srv, tempfile.TemporaryDirectory(prefix='rq-epoch-detect-') as tmp:
        conn = srv.client()
        for index, side in enumerate(sides):
            timeout = args.stock_timeout if side == STOCK else 120.0
            runs.append(one_trial(conn, srv.url, side, Path(tmp), index, timeout, env_extra))
            print(f'  trial {index + 1}: {side:<8} {runs[-1]}', flush=True)
        epoch = [r['detection_seconds'] for r in runs if r['side'] == EPOCH and r['ok']]
        stock = [r['detection_seconds'] for r in runs if r['side'] == STOCK and r['ok']]
        summary = {
            'defaults': {
                'heartbeat_interval': DEFAULTS.heartbeat_interval,
                'lease_margin': DEFAULTS.lease_margin,
                'sweep_interval': DEFAULTS.sweep_interval,
            },
            'settings_used': env_extra or 'defaults',
            EPOCH: {'max': max(epoch, default=None), 'min': min(epoch, default=None), 'n': len(epoch)},
            STOCK: {'max': max(stock, default=None), 'n': len(stock)},
            'target_seconds': TARGET,
            'target_met': bool(epoch) and max(epoch) <= TARGET and not args.quick,
        }
        doc = {'quick': args.quick, 'server': server_version(conn), 'runs': runs, 'summary': summary}
        return finish(NAME, doc, args.out, all(r['ok'] for r in runs), conn)


if __name__ == '__main__':
    raise SystemExit(main())
