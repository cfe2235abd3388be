"""Question 6: what a fleet of workers costs the server, idle and per job, as it grows.

Real ``rq worker`` processes, stock ``rq.Worker`` and ``rq_epoch.Worker`` each with its
defaults, W workers every one listening on all Q queues, one side after the other on a fresh
server each (the order alternates from cell to cell). Workers start in batches of 20, each
batch registered before the next starts; once all are idle and one sweep interval has passed:

1. **Idle**: over a window, the server's CPU (``INFO cpu``, ``used_cpu_sys + used_cpu_user``)
   per second, its commands per second (``INFO stats total_commands_processed``) and its
   connections (``INFO clients connected_clients``), the benchmark's own left out.
2. **Per job**: no-op jobs enqueued one at a time at a steady rate, spread over the queues,
   until every one has finished: the server CPU and commands above the idle rate, per job
   (the enqueue included); pickup latency p50/p99 (RQ's ``enqueued_at`` to ``started_at``,
   both from this machine's clock).

Then a **simulated fleet** of idle waiters (1,000 by default) on the largest Q: each waiter a
thread with a worker object of its own (``rq.SimpleWorker`` or ``rq_epoch.SimpleWorker``, in
processes of 250 threads), started with ``bootstrap()`` and looping on
``dequeue_job_and_maintain_ttl()`` then ``execute_job()`` as RQ's work loop does: each side's
real waiting, heartbeats and sweeps (stock: ``BLPOP``/``BLMOVE`` in ``Queue.dequeue_any``),
with the job run in the thread. The same figures, at a slower job rate (every idle waiter of
a thread costs Python time on this machine's two cores too).

Server figures per command (``INFO commandstats``) are kept in the JSON, to show where the
cost goes. Absolute numbers move with the machine; the ratios of one run are what count.

    python -m benchmarks.fleet                                  # W 20,60,120 × Q 1,10; 1,000 simulated
    python -m benchmarks.fleet --workers 20,60 --queues 1,10
    python -m benchmarks.fleet --quick                          # W 3 × Q 2; 20 simulated
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import redis
from rq import Queue
from rq import SimpleWorker as StockSimpleWorker
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.timeouts import TimerDeathPenalty

from rq_epoch import SimpleWorker as EpochSimpleWorker
from rq_epoch.protocol import keys

from .harness import (
    EPOCH,
    STOCK,
    comma_sizes,
    latencies_ms,
    parser,
    quiet_logging,
    ratio,
    server,
    server_version,
    start_worker,
    stats_ms,
    stop_workers,
    wait_idle,
    write_results,
)
from .report import fleet_section

NAME = 'fleet'
#: Real worker processes started at once; the next batch waits until these registered.
BATCH = 20
#: Simulated waiters per process.
PER_PROCESS = 250
#: The commands that call a script.
SCRIPT_COMMANDS = frozenset({'evalsha', 'eval', 'evalsha_ro', 'eval_ro', 'fcall', 'fcall_ro'})
#: The cells measured by default, workers × queues: one worker alone, fleets on one queue, fleets on ten.
DEFAULT_CELLS = ((1, 1), (20, 1), (60, 1), (120, 1), (60, 10), (120, 10))
#: rq-epoch's default sweep interval: both windows last whole multiples of it, and the fleet settles one first.
SWEEP_INTERVAL = 5.0


def cell_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """``1x1,60x10`` -> ((1, 1), (60, 10)): workers × queues."""
    cells = []
    for item in text.split(','):
        w, _, n = item.strip().lower().partition('x')
        cells.append((int(w), int(n)))
    return tuple(cells)


def queue_names(n: int) -> list[str]:
    return [f'fleet{i}' for i in range(n)]


# -- what the server says ---------------------------------------------------------------------


@dataclass
class Snapshot:
    """One ``INFO`` of the server, with the benchmark's own commands taken out."""

    at: float
    cpu: float
    #: The part of ``cpu`` spent in the kernel (``used_cpu_sys``): reading requests, writing
    #: replies and waking the clients they go to.
    system_cpu: float
    commands: int
    #: Requests the server read (``total_reads_processed``: a pipeline or a transaction sent
    #: at once is one), the benchmark's own left out: the clients' round trips.
    reads: int
    connections: int
    clients: dict[str, int]
    calls: dict[str, tuple[int, int]]
    client_cpu: float


def process_cpu(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far (0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            text = Path(f'/proc/{pid}/stat').read_text()
        except OSError:
            continue
        fields = text[text.rindex(')') + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf('SC_CLK_TCK')


class Probe:
    """The benchmark's one connection: it enqueues, reads ``INFO`` and polls, and counts what it sent.

    The enqueues are left in the counts (a job's cost includes its enqueue); the ``INFO``
    calls and the polls are taken out. The server counts a command once it has run, so the
    ``INFO`` that takes a snapshot is counted in the next one.
    """

    def __init__(self, conn: redis.Redis) -> None:
        self.conn = conn
        self.own: Counter[str] = Counter()
        #: Requests the benchmark sent besides its enqueues (each ``INFO``, each poll).
        self.own_reads = 0
        #: The fleet's processes, whose own CPU is read beside the server's.
        self.clients: list[int] = []

    def snapshot(self) -> Snapshot:
        info = self.conn.info('cpu', 'stats', 'clients', 'commandstats')
        calls = {
            name.removeprefix('cmdstat_'): (int(v['calls']) - self.own[name.removeprefix('cmdstat_')], int(v['usec']))
            for name, v in info.items()
            if name.startswith('cmdstat_')
        }
        snap = Snapshot(
            at=time.monotonic(),
            cpu=float(info['used_cpu_sys']) + float(info['used_cpu_user']),
            system_cpu=float(info['used_cpu_sys']),
            commands=int(info['total_commands_processed']) - sum(self.own.values()),
            reads=int(info['total_reads_processed']) - self.own_reads,
            connections=int(info['connected_clients']) - 1,
            clients={k: int(info[k]) for k in ('blocked_clients', 'tracking_clients', 'pubsub_clients') if k in info},
            calls=calls,
            client_cpu=process_cpu(self.clients),
        )
        self.own['info'] += 1
        self.own_reads += 1
        return snap

    def finished(self, queues: Sequence[Queue], n: int, timeout: float) -> bool:
        """Until ``n`` jobs of ``queues`` have finished (True), one failed, or ``timeout`` (False)."""
        registries = [
            r(q.name, connection=self.conn).key for q in queues for r in (FinishedJobRegistry, FailedJobRegistry)
        ]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.conn.pipeline(transaction=False) as pipe:
                for key in registries:
                    pipe.zcard(key)
                counts = pipe.execute()
            self.own['zcard'] += len(registries)
            self.own_reads += 1
            if sum(counts[1::2]):
                return False
            if sum(counts[0::2]) >= n:
                return True
            time.sleep(0.05)
        return False


def window(a: Snapshot, b: Snapshot) -> dict[str, Any]:
    """Seconds, server CPU seconds and commands between two snapshots, and the busiest commands."""
    per_command = {
        name: (calls - a.calls.get(name, (0, 0))[0], usec - a.calls.get(name, (0, 0))[1])
        for name, (calls, usec) in b.calls.items()
    }
    busiest = sorted(((n, c, u) for n, (c, u) in per_command.items() if c > 0), key=lambda x: -x[2])[:8]
    return {
        'seconds': b.at - a.at,
        'cpu': b.cpu - a.cpu,
        'system_cpu': b.system_cpu - a.system_cpu,
        'commands': b.commands - a.commands,
        'reads': b.reads - a.reads,
        'scripts': sum(c for n, (c, _u) in per_command.items() if n in SCRIPT_COMMANDS),
        'clients_cpu_percent': round((b.client_cpu - a.client_cpu) * 100.0 / (b.at - a.at), 1),
        'busiest': {n: {'calls': c, 'usec': u} for n, c, u in busiest},
        'calls': {n: c for n, (c, _u) in per_command.items() if c > 0},
    }


def measure(probe: Probe, queues: Sequence[Queue], sizes: dict[str, Any]) -> dict[str, Any]:
    """Settle, then the idle window, then the paced jobs: the figures of one fleet."""
    time.sleep(sizes['settle'])
    a = probe.snapshot()
    time.sleep(sizes['idle'])
    b = probe.snapshot()
    idle = window(a, b)
    cpu_rate, commands_rate = idle['cpu'] / idle['seconds'], idle['commands'] / idle['seconds']
    reads_rate, scripts_rate = idle['reads'] / idle['seconds'], idle['scripts'] / idle['seconds']
    system_rate = idle['system_cpu'] / idle['seconds']
    ids, interval = [], 1.0 / sizes['rate']
    next_at = time.perf_counter()
    for i in range(sizes['jobs']):
        ids.append(queues[i % len(queues)].enqueue('benchmarks.jobs.noop').id)
        next_at += interval
        time.sleep(max(0.0, next_at - time.perf_counter()))
    ok = probe.finished(queues, len(ids), timeout=60.0)
    # A whole number of sweep intervals, as the idle window: the workers' periodic work weighs alike in both.
    elapsed = time.monotonic() - b.at
    time.sleep(math.ceil(elapsed / SWEEP_INTERVAL) * SWEEP_INTERVAL - elapsed)
    c = probe.snapshot()
    busy = window(b, c)
    n = len(ids)
    return {
        'ok': ok,
        'jobs': n,
        'idle_seconds': round(idle['seconds'], 2),
        'idle_cpu_ms_per_second': round(cpu_rate * 1000.0, 3),
        'idle_commands_per_second': round(commands_rate, 1),
        'connections': b.connections,
        'clients': b.clients,
        'jobs_seconds': round(busy['seconds'], 2),
        'cpu_ms_per_job': round((busy['cpu'] - cpu_rate * busy['seconds']) * 1000.0 / n, 3),
        # Of which in the kernel: it grows with the requests and the clients woken per job.
        'system_cpu_ms_per_job': round((busy['system_cpu'] - system_rate * busy['seconds']) * 1000.0 / n, 3),
        'commands_per_job': round((busy['commands'] - commands_rate * busy['seconds']) / n, 1),
        # Script calls (EVALSHA) and requests (round trips) per job above the idle rate; the
        # requests include the enqueue's (one per job, both sides).
        'scripts_per_job': round((busy['scripts'] - scripts_rate * busy['seconds']) / n, 2),
        'requests_per_job': round((busy['reads'] - reads_rate * busy['seconds']) / n, 2),
        'pickup': stats_ms(latencies_ms(probe.conn, ids)),
        # The fleet's own processes, % of one core: on this machine's two cores, near 100 % or more
        # means the clients, not the server, set the pace.
        'clients_cpu_percent_idle': idle['clients_cpu_percent'],
        'clients_cpu_percent_jobs': busy['clients_cpu_percent'],
        'idle_busiest': idle['busiest'],
        'jobs_busiest': busy['busiest'],
        # Every command's calls per job above the idle rate: where the commands per job go.
        'calls_per_job': {
            name: round((calls - idle['calls'].get(name, 0) * busy['seconds'] / idle['seconds']) / n, 2)
            for name, calls in sorted(busy['calls'].items())
        },
        'load_average': round(os.getloadavg()[0], 2),
        'server': server_version(probe.conn),
    }


# -- real worker processes --------------------------------------------------------------------


def wait_registered(conn: redis.Redis, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while conn.scard(keys.workers_key()) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f'{n} workers did not register within {timeout} s')
        time.sleep(0.1)


def real_fleet(kind: str, side: str, workers: int, n_queues: int, sizes: dict[str, Any], log: Path) -> dict[str, Any]:
    """``workers`` real ``rq worker`` processes of ``side`` on ``n_queues`` queues, on a fresh server."""
    names = queue_names(n_queues)
    with server(kind) as srv:
        probe = Probe(srv.client())
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for first in range(0, workers, BATCH):
                procs += [start_worker(srv.url, side, log, names) for _ in range(min(BATCH, workers - first))]
                wait_registered(probe.conn, len(procs), timeout=120.0)
            wait_idle(probe.conn, workers, timeout=120.0)
            probe.clients = [proc.pid for proc in procs]
            figures = measure(probe, [Queue(name, connection=probe.conn) for name in names], sizes)
        finally:
            stop_workers(procs)
    return {'side': side, 'workers': workers, 'queues': n_queues, **figures}


# -- simulated waiters ------------------------------------------------------------------------


def _waiter(url: str, side: str, names: list[str], reports: Any, stop: Any) -> None:
    """One simulated worker: RQ's work loop without its signals (a thread cannot have them)."""
    try:
        conn = redis.Redis.from_url(url)
        worker_class = EpochSimpleWorker if side == EPOCH else StockSimpleWorker
        worker = worker_class([Queue(name, connection=conn) for name in names], connection=conn)
        worker.death_penalty_class = TimerDeathPenalty  # SIGALRM's penalty needs the main thread
        worker.bootstrap(logging_level='WARNING')
        reports.put(('ready', ''))
        while not stop.is_set():
            result = worker.dequeue_job_and_maintain_ttl(worker.dequeue_timeout)
            if result is not None:
                worker.execute_job(*result)
    except Exception as exc:
        reports.put(('error', f'{type(exc).__name__}: {exc}'))


def _waiters(url: str, side: str, names: list[str], count: int, reports: Any, stop: Any) -> None:
    """A process of ``count`` waiter threads, until ``stop`` is set (at most an hour)."""
    for name in [k for k in os.environ if k.startswith('RQ_EPOCH_')]:
        del os.environ[name]
    quiet_logging()
    for _ in range(count):
        threading.Thread(target=_waiter, args=(url, side, names, reports, stop), daemon=True).start()
    stop.wait(3600)
    os._exit(0)


def simulated_fleet(kind: str, side: str, waiters: int, n_queues: int, sizes: dict[str, Any]) -> dict[str, Any]:
    """``waiters`` simulated workers of ``side`` on ``n_queues`` queues, on a fresh server."""
    names = queue_names(n_queues)
    ctx = multiprocessing.get_context('spawn')
    reports, stop = ctx.Queue(), ctx.Event()
    counts = [min(PER_PROCESS, waiters - first) for first in range(0, waiters, PER_PROCESS)]
    with server(kind) as srv:
        probe = Probe(srv.client())
        procs = [
            ctx.Process(target=_waiters, args=(srv.url, side, names, n, reports, stop), daemon=True) for n in counts
        ]
        try:
            for proc in procs:
                proc.start()
            ready, deadline = 0, time.monotonic() + 300.0
            while ready < waiters:
                if time.monotonic() > deadline or any(proc.exitcode is not None for proc in procs):
                    raise RuntimeError(f'{side}: {ready} of {waiters} simulated waiters started (in 300 s at most)')
                try:
                    what, text = reports.get(timeout=1.0)
                except queue.Empty:
                    continue
                if what == 'error':
                    raise RuntimeError(f'{side}: a simulated waiter failed: {text}')
                ready += 1
            wait_idle(probe.conn, waiters, timeout=120.0)
            probe.clients = [proc.pid for proc in procs if proc.pid is not None]
            figures = measure(probe, [Queue(name, connection=probe.conn) for name in names], sizes)
        finally:
            stop.set()
            for proc in procs:
                if proc.pid is None:  # never started
                    continue
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
                    proc.join(10)
    errors = []
    while not reports.empty():
        what, text = reports.get_nowait()
        if what == 'error':
            errors.append(text)
    figures['ok'] = figures['ok'] and not errors
    return {'side': side, 'workers': waiters, 'queues': n_queues, 'simulated': True, 'errors': errors[:5], **figures}


# -- the comparison ---------------------------------------------------------------------------

#: Figures compared side by side, rq-epoch / stock.
FIGURES = (
    'idle_cpu_ms_per_second',
    'idle_commands_per_second',
    'connections',
    'cpu_ms_per_job',
    'system_cpu_ms_per_job',
    'commands_per_job',
    'scripts_per_job',
    'requests_per_job',
)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side of a cell from its repeated fleets: the median of each compared figure and of
    each pickup percentile; the rest (the busiest commands, the calls per job) is the last
    fleet's, and the fleets themselves are kept under ``repeats``. One fleet stands as it is.

    A ratio of one pair of fleets moves by more than the targets' margins on a shared machine
    (stock's own server CPU per job has moved by a third between runs of the same code); the
    median of a few pairs, run in alternating order, is steadier.
    """
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[-1])
    for figure in (*FIGURES, 'load_average'):
        values = [r[figure] for r in runs]
        middle = median(values)
        out[figure] = round(middle) if all(isinstance(v, int) for v in values) else round(middle, 3)
    out['pickup'] = {k: round(median(r['pickup'][k] for r in runs), 2) for k in runs[0]['pickup']}
    out['ok'] = all(r['ok'] for r in runs)
    out['repeats'] = runs
    return out


def compare(stock: dict[str, Any], epoch: dict[str, Any]) -> dict[str, Any]:
    """One cell: both sides' figures and the ratios rq-epoch / stock."""
    out: dict[str, Any] = {'workers': stock['workers'], 'queues': stock['queues'], STOCK: stock, EPOCH: epoch}
    out['ratio'] = {f: ratio(epoch[f], stock[f]) for f in FIGURES}
    for f in ('cpu_ms_per_job', 'system_cpu_ms_per_job', 'commands_per_job', 'requests_per_job'):
        if min(epoch[f], stock[f]) <= 0:  # less than the idle rate: the clients could not keep up, no figure
            out['ratio'][f] = None
    out['ratio']['pickup_p50'] = ratio(epoch['pickup']['p50_ms'], stock['pickup']['p50_ms'])
    out['ratio']['pickup_p99'] = ratio(epoch['pickup']['p99_ms'], stock['pickup']['p99_ms'])
    out['ratio']['scripts_per_job'] = None  # stock calls none
    return out


def growth(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per queue count and side: per-job cost at the largest W over the smallest (target ≤ 1.1×, flat)."""
    out = []
    for n_queues in sorted({c['queues'] for c in cells}):
        # A fleet's growth: the worker alone (1 × 1) is no fleet.
        mine = sorted((c for c in cells if c['queues'] == n_queues and c['workers'] > 1), key=lambda c: c['workers'])
        if len(mine) < 2:
            continue
        low, high = mine[0], mine[-1]
        for side in (STOCK, EPOCH):
            out.append(
                {
                    'queues': n_queues,
                    'side': side,
                    'from_workers': low['workers'],
                    'to_workers': high['workers'],
                    'cpu_per_job': ratio(high[side]['cpu_ms_per_job'], low[side]['cpu_ms_per_job']),
                    'commands_per_job': ratio(high[side]['commands_per_job'], low[side]['commands_per_job']),
                }
            )
    return out


def targets(
    cells: list[dict[str, Any]], sims: list[dict[str, Any]], grown: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The targets of the fleet work, judged on the cells this run measured."""
    out: list[dict[str, Any]] = []

    def check(what: str, value: float | None, limit: float) -> None:
        out.append({'what': what, 'value': value, 'limit': limit, 'met': value is not None and value <= limit})

    for c in cells:
        at = f'{c["workers"]} × {c["queues"]}'
        if c['queues'] >= 10 and c['workers'] >= 60:
            check(f'{at}: server CPU per job, rq-epoch / stock', c['ratio']['cpu_ms_per_job'], 1.25)
            check(f'{at}: commands per job, rq-epoch / stock', c['ratio']['commands_per_job'], 1.4)
        if c['queues'] == 1 and c['workers'] >= 60:
            check(f'{at}: idle server CPU, rq-epoch / stock', c['ratio']['idle_cpu_ms_per_second'], 1.5)
        if c['workers'] > 1:
            check(f'{at}: pickup p50, rq-epoch / stock', c['ratio']['pickup_p50'], 1.1)
    for g in grown:
        if g['side'] == EPOCH:
            at = f'{g["from_workers"]} → {g["to_workers"]} workers × {g["queues"]}'
            check(f'{at}: rq-epoch server CPU per job grows', g['cpu_per_job'], 1.1)
    for c in sims:
        at = f'{c["workers"]:,} simulated × {c["queues"]}'
        check(f'{at}: rq-epoch idle server CPU, % of one core', c[EPOCH]['idle_cpu_ms_per_second'] / 10.0, 5.0)
        check(f'{at}: server CPU per job, rq-epoch / stock', c['ratio']['cpu_ms_per_job'], 1.5)
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--workers', type=comma_sizes, default=None, help='worker counts W, each with every --queues')
    p.add_argument('--queues', type=comma_sizes, default=None, help='queue counts Q, each with every --workers')
    p.add_argument(
        '--cells',
        type=cell_sizes,
        default=None,
        help='cells WxQ (default 1x1,20x1,60x1,120x1,60x10,120x10; quick 3x2); --workers/--queues make a grid instead',
    )
    p.add_argument('--jobs', type=int, default=None, help='paced jobs per fleet (default 200; quick 6)')
    p.add_argument('--rate', type=float, default=20.0, help='jobs enqueued per second (default 20)')
    p.add_argument('--idle-seconds', type=float, default=None, help='idle window (default 20; quick 5)')
    p.add_argument('--simulated', type=int, default=None, help='simulated waiters, 0: none (default 1000; quick 20)')
    p.add_argument(
        '--repeat',
        type=int,
        default=1,
        help="fleets per side and cell, the order alternating; each side's figures are their medians (default 1)",
    )
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error('--repeat must be at least 1')
    q = args.quick
    sizes = {
        'settle': 1.0 if q else SWEEP_INTERVAL + 1.0,
        'idle': args.idle_seconds or (SWEEP_INTERVAL if q else 4 * SWEEP_INTERVAL),
        'jobs': args.jobs or (6 if q else 200),
        'rate': args.rate,
    }
    # Every idle waiter of a thread wakes in Python too: fewer, slower jobs, so that the clients keep up.
    simulated_sizes = {**sizes, 'jobs': 4 if q else 40, 'rate': min(args.rate, 2.0)}
    if args.workers or args.queues:
        grid = [(w, n) for n in args.queues or (1, 10) for w in args.workers or (20, 60, 120)]
    else:
        grid = list(args.cells or (((3, 2),) if q else DEFAULT_CELLS))
    simulated = args.simulated if args.simulated is not None else (20 if q else 1000)
    started = time.monotonic()
    cells, sims = [], []
    with tempfile.TemporaryDirectory(prefix='rq-epoch-fleet-') as tmp:
        for index, (w, n_queues) in enumerate(grid):
            repeats: dict[str, list[dict[str, Any]]] = {STOCK: [], EPOCH: []}
            for turn in range(args.repeat):
                for side in (STOCK, EPOCH) if (index + turn) % 2 == 0 else (EPOCH, STOCK):
                    log = Path(tmp) / f'{w}x{n_queues}-{side}-{turn}.log'
                    r = real_fleet(args.server, side, w, n_queues, sizes, log)
                    repeats[side].append(r)
                    print(
                        f'  {w:>4} × {n_queues:<2} {side:<8}  idle {r["idle_cpu_ms_per_second"]:7.2f} ms/s '
                        f'{r["idle_commands_per_second"]:8.1f} cmd/s {r["connections"]:5} conns; per job '
                        f'{r["cpu_ms_per_job"]:6.2f} ms ({r["system_cpu_ms_per_job"]:5.2f} in the kernel) '
                        f'{r["commands_per_job"]:7.1f} cmds; pickup p50 '
                        f'{r["pickup"]["p50_ms"]:6.1f} ms; {r["scripts_per_job"]:5.2f} scripts '
                        f'{r["requests_per_job"]:6.2f} requests per job; load {r["load_average"]}  ok={r["ok"]}',
                        file=sys.stderr,
                        flush=True,
                    )
            cells.append(compare(median_run(repeats[STOCK]), median_run(repeats[EPOCH])))
        if simulated:
            n_queues = max(n for _w, n in grid)
            runs = {
                side: simulated_fleet(args.server, side, simulated, n_queues, simulated_sizes)
                for side in (STOCK, EPOCH)
            }
            sims.append(compare(runs[STOCK], runs[EPOCH]))
            print(f'  simulated {simulated} × {n_queues}: ok={[runs[s]["ok"] for s in runs]}', file=sys.stderr)
    runs_all = [c[side] for c in cells + sims for side in (STOCK, EPOCH)]
    doc = {
        'quick': q,
        'repeat': args.repeat,
        'server': runs_all[0]['server'] if runs_all else args.server,
        'sizes': sizes,
        'simulated_sizes': simulated_sizes,
        'cells': cells,
        'simulated': sims,
        'growth': growth(cells),
        'targets': targets(cells, sims, growth(cells)),
        'seconds': round(time.monotonic() - started, 1),
    }
    print(fleet_section(doc))
    write_results(NAME, doc, args.out)
    return 0 if runs_all and all(r['ok'] for r in runs_all) else 1


if __name__ == '__main__':
    raise SystemExit(main())
