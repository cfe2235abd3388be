"""How long until a job cut short by a deploy runs again on another worker?

Per trial, on one server: two real ``rq worker`` processes of one side on one queue, and one
long job. Once the job runs, the worker running it is stopped as an orchestrator stops it,
and the benchmark measures the seconds from the stop signal until the job starts again on
the other worker (its ledger line), or says what became of the job instead. Two stop
sequences, each with a long and a short grace:

* ``term-then-kill``: SIGTERM to the worker, SIGKILL to the worker and its work-horse once the
  grace is over (Kubernetes, ECS, ``docker stop``, Cloud Run, systemd ``KillMode=mixed``);
* ``term-all-then-kill``: SIGTERM to the worker and its work-horse at once, then the same
  SIGKILL (systemd's default ``KillMode=control-group``, Heroku).

Stock RQ's idle worker runs its maintenance only when its blocking dequeue wakes up (minutes),
so, as a cron job or ``rq info`` would, the benchmark runs stock's ``StartedJobRegistry.cleanup()``
every second while it waits for stock's job; rq-epoch's workers sweep by themselves.

A long grace is the shutdown timeout plus 5 s: rq-epoch's worker hands the job back when its
shutdown timeout is over. A short grace (1 s) kills the worker before it could: its lease was
marked stopping, and a sweep requeues the job uncounted (verdict ``stopping``). Stock RQ gets
the same stops, once per cell: its job is then failed, or left started and never run again
within ``--stock-bound`` seconds, and the table says so.

Short settings, from ``RQ_EPOCH_*`` variables (rq-epoch) and the same heartbeat and maintenance
interval given to stock RQ's workers (``--job-monitoring-interval 1 --maintenance-interval 1``),
so that the run takes a few minutes:

    python -m benchmarks.deploy                 # 3 rq-epoch trials per cell, 1 stock trial per cell
    python -m benchmarks.deploy --quick         # 1 trial per cell, stock only where it is quick
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import redis
from rq import Queue
from rq.registry import StartedJobRegistry

from rq_epoch.compat import text
from rq_epoch.pids import children_of, send_signal
from rq_epoch.protocol import keys

from .harness import EPOCH, ROOT, STOCK, parser, server, server_version, stop_workers, worker_argv, worker_env
from .report import finish

NAME = 'deploy'
QUEUE = 'deploy'
#: The settings of both sides' workers (stock: the same heartbeat and maintenance interval).
HEARTBEAT = 1
EPOCH_ENV = {
    'RQ_EPOCH_HEARTBEAT_INTERVAL': str(HEARTBEAT),
    'RQ_EPOCH_LEASE_MARGIN': '2',
    'RQ_EPOCH_SWEEP_INTERVAL': '1',
    'RQ_EPOCH_RESTART_GRACE': '4',
    'RQ_EPOCH_SHUTDOWN_TIMEOUT': '3',
}
STOCK_OPTIONS = ('--job-monitoring-interval', str(HEARTBEAT), '--maintenance-interval', '1')
#: Seconds the long grace leaves after the shutdown timeout; the short grace.
LONG_GRACE_EXTRA = 5.0
SHORT_GRACE = 1.0
SEQUENCES = ('term-then-kill', 'term-all-then-kill')
#: How long a job runs when nobody stops it (longer than any trial).
JOB_SECONDS = 600
#: Bound on the wait for rq-epoch's job to run again.
EPOCH_BOUND = 60.0


def _starts(path: Path) -> list[tuple[float, int, int]]:
    """(time, work-horse pid, worker pid) of each start of the job, from its ledger."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        t, pid, ppid = line.split()
        rows.append((float(t), int(pid), int(ppid)))
    return rows


def _wait(condition: Any, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    return None


def _stats(conn: redis.Redis) -> dict[str, int]:
    """rq-epoch's per-queue counters (hand-backs, verdicts; the hash's timestamps left out)."""
    fields = {text(k): text(v) for k, v in conn.hgetall(keys.stats_key(QUEUE)).items()}
    return {k: int(v) for k, v in fields.items() if v.isdigit()}


def one_trial(
    conn: redis.Redis, url: str, side: str, sequence: str, grace: float, folder: Path, index: int, bound: float
) -> dict[str, Any]:
    """Start two workers of ``side``, stop the one running the job with ``sequence`` and ``grace``,
    then time the job's next start (or report what became of it)."""
    conn.flushall()
    ledger = folder / f'{side}-{index}.starts'
    options = () if side == EPOCH else STOCK_OPTIONS
    env = worker_env(**EPOCH_ENV) if side == EPOCH else worker_env()
    workers: list[subprocess.Popen[bytes]] = []
    for n in range(2):
        with open(folder / f'{side}-{index}-worker-{n}.log', 'wb') as log:
            argv = worker_argv(url, side, [QUEUE], *options)
            workers.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    row: dict[str, Any] = {'side': side, 'sequence': sequence, 'grace': grace}
    try:
        job = Queue(QUEUE, connection=conn).enqueue(
            'benchmarks.jobs.record_start_then_sleep', str(ledger), JOB_SECONDS, job_timeout=JOB_SECONDS + 60
        )
        first = _wait(lambda: _starts(ledger), 60)
        if not first:
            return {**row, 'ok': False, 'outcome': 'the job never started'}
        time.sleep(0.5)  # the job is well under way
        _, horse, worker = first[0]
        stopped = time.time()
        send_signal(worker, signal.SIGTERM)
        if sequence == 'term-all-then-kill':
            send_signal(horse, signal.SIGTERM)
        proc = next(p for p in workers if p.pid == worker)
        try:
            proc.wait(grace)
            exited = round(time.time() - stopped, 2)
            row['worker_exit'] = {'code': proc.returncode, 'seconds': exited}
        except subprocess.TimeoutExpired:
            for pid in [worker, *children_of(worker), horse]:  # the group, as the orchestrator kills it
                send_signal(pid, signal.SIGKILL)
            proc.wait(10)
            row['worker_exit'] = {'code': 'SIGKILL', 'seconds': round(grace, 2)}

        def again() -> Any:
            starts = _starts(ledger)
            if len(starts) > 1:
                return starts[1]
            if job.get_status(refresh=True) == 'failed':
                return 'failed'
            return None

        if side == STOCK:
            registry = StartedJobRegistry(QUEUE, connection=conn)
            cleaned = [0.0]

            def again_after_cleanup() -> Any:
                if time.monotonic() - cleaned[0] >= 1.0:  # a cleanup every second, as a cron would
                    registry.cleanup()
                    cleaned[0] = time.monotonic()
                return again()

            found = _wait(again_after_cleanup, bound, interval=0.1)
        else:
            found = _wait(again, bound, interval=0.1)
        job.refresh()
        status = job.get_status()
        row.update(status=getattr(status, 'value', status), stalled=int(conn.hget(job.key, 'stalled') or 0))
        if side == EPOCH:
            row['counters'] = _stats(conn)
        if isinstance(found, tuple):
            row.update(outcome='ran again', seconds=round(found[0] - stopped, 2), ok=True)
        elif found == 'failed':
            failed_after = round(time.time() - stopped, 1)  # within one poll (stock: one cleanup) of it
            latest = job.latest_result()
            lines = (getattr(latest, 'exc_string', '') or '').strip().splitlines()
            reason = lines[-1].split(', at ')[0][:160] if lines else ''
            row.update(outcome='failed', reason=reason, failed_seconds=failed_after, seconds=None)
            row['ok'] = side == STOCK
        else:
            row.update(outcome=f'not run again within {bound:.0f} s', seconds=None, ok=side == STOCK)
        if side == EPOCH:
            expected = 'handed_back' if grace > float(EPOCH_ENV['RQ_EPOCH_SHUTDOWN_TIMEOUT']) else 'stopping'
            row['expected_counter'] = expected
            row['ok'] = row['ok'] and row['counters'].get(expected, 0) == 1 and row['stalled'] == 0
        return row
    finally:
        stop_workers(workers, grace=0.0)  # and the work-horse running the long job


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per side, sequence and grace: the median and worst seconds, or the outcome."""
    cells: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault((run['side'], run['sequence'], run['grace']), []).append(run)
    rows = []
    for (side, sequence, grace), group in cells.items():
        seconds = [r['seconds'] for r in group if r.get('seconds') is not None]
        outcomes = sorted({r['outcome'] for r in group})
        failed = [r['failed_seconds'] for r in group if r.get('failed_seconds') is not None]
        rows.append(
            {
                'side': side,
                'sequence': sequence,
                'grace': grace,
                'trials': len(group),
                'median_seconds': round(median(seconds), 2) if seconds else None,
                'max_seconds': max(seconds) if seconds else None,
                'outcomes': outcomes,
                'reasons': sorted({r['reason'] for r in group if r.get('reason')}),
                'failed_seconds': max(failed) if failed else None,
                'stalled': max(r.get('stalled', 0) for r in group),
                'ok': all(r['ok'] for r in group),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--trials', type=int, default=3, help='rq-epoch trials per cell (default 3)')
    p.add_argument('--skip-stock', action='store_true', help='do not run stock RQ')
    p.add_argument(
        '--stock-bound',
        type=float,
        default=100.0,
        help="longest wait for stock RQ's job (s; default 100: past its 61 s heartbeat TTL)",
    )
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the workers and the server are ended
    trials = 1 if args.quick else args.trials
    timeout = float(EPOCH_ENV['RQ_EPOCH_SHUTDOWN_TIMEOUT'])
    graces = (timeout + LONG_GRACE_EXTRA, SHORT_GRACE)
    plan: list[tuple[str, str, float]] = []
    for sequence in SEQUENCES:
        for grace in graces:
            plan += [(EPOCH, sequence, grace)] * trials
    if not args.skip_stock:
        for sequence in SEQUENCES:
            for grace in graces:
                # Quick mode: only the stock stop that ends at once (the work-horse dies of the SIGTERM).
                if not args.quick or (sequence == 'term-all-then-kill' and grace == SHORT_GRACE):
                    plan.append((STOCK, sequence, grace))
    runs = []
    with server(args.server) as srv, tempfile.TemporaryDirectory(prefix='rq-epoch-deploy-') as tmp:
        conn = srv.client()
        for index, (side, sequence, grace) in enumerate(plan):
            bound = EPOCH_BOUND if side == EPOCH else (10.0 if args.quick else args.stock_bound)
            runs.append(one_trial(conn, srv.url, side, sequence, grace, Path(tmp), index, bound))
            print(f'  trial {index + 1}/{len(plan)}: {runs[-1]}', flush=True)
        doc = {
            'quick': args.quick,
            'server': server_version(conn),
            'settings': {
                'rq-epoch': ' '.join(f'{k}={v}' for k, v in EPOCH_ENV.items()),
                'stock': ' '.join(STOCK_OPTIONS),
            },
            'graces': {'long': graces[0], 'short': graces[1]},
            'runs': runs,
            'summary': summary(runs),
        }
        return finish(NAME, doc, args.out, all(r['ok'] for r in runs), conn)


if __name__ == '__main__':
    raise SystemExit(main())
