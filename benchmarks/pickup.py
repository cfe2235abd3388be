"""Question 5: what the take costs a worker on several queues: pickup latency and idle cost.

A worker on several queues takes jobs with rq-epoch's ``take`` script (one atomic move into
the queue's intermediate list) and waits for the next job with client tracking; stock RQ
pops with ``BLPOP``. Real ``rq worker`` processes on three queues, one side at a time on the
same server, in the order stock, rq-epoch, rq-epoch, stock, stock, rq-epoch (quick: stock,
rq-epoch), then rq-epoch with the wait by polling (``benchmarks._polling_worker``, the
alternative):

1. **Idle cost.** The worker idles for a window. The wait for a job (``BLPOP``; the take
   and the wake-up's ``EXISTS``) is timed command by command by the server (SLOWLOG with a
   threshold of 0 µs; a script's time includes what it ran): calls and server µs per
   second. The whole worker (heartbeats, sweeps) is counted in requests per second (the
   server's ``total_reads_processed``). The server time of one empty take and of one
   ``EXISTS`` is also measured alone (``INFO commandstats``, many calls), since SLOWLOG
   times on a busy machine include moments the server was not scheduled.
2. **Pickup after idle.** The worker has been idle for 1 to 1.25 s; one job is enqueued;
   the latency from ``enqueued_at`` to ``started_at`` (both written by RQ). Repeated.
3. **Pickup under load.** No-op jobs enqueued at a steady rate across the three queues;
   the same latency, p50/p90/p99/mean, and the ratio rq-epoch / stock.
4. **Backlog.** Jobs already waiting on the three queues: jobs per second, and requests
   (the server's ``total_reads_processed``) per job.
5. **Idle fleet.** Several idle workers of one side on the same queues, a job every 100 ms:
   what each job costs the server, since every idle rq-epoch worker wakes at an enqueue
   (client tracking tells them all) and all but one find nothing.
6. **The wait alone.** In one process, no work-horse: a thread enqueues a job while the
   other waits in stock's ``Queue.dequeue_any`` (``BLPOP``, then the job's ``HGETALL``) or in
   rq-epoch's ``Taker.dequeue_any`` (wake-up, ``EXISTS``, take, ``HGETALL``); the time from
   the enqueue call to the dequeue's return, alternating the sides.

Jobs are ``benchmarks.jobs.noop``; each side runs with its defaults.

    python -m benchmarks.pickup          # about 6 minutes
    python -m benchmarks.pickup --quick  # about a minute
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

import redis
from rq import Queue
from rq.utils import str_to_date

from rq_epoch import keys, scripts

from .common import EPOCH, ROOT, STOCK, parser, percentile, ratio, server, server_version, table, write_results
from .worker_throughput import worker_env

NAME = 'pickup'
QUEUES = ('pick1', 'pick2', 'pick3')
POLL = 'rq-epoch, polling'
ORDER_FULL = (STOCK, EPOCH, EPOCH, STOCK, STOCK, EPOCH, POLL)
ORDER_QUICK = (STOCK, EPOCH, POLL)
#: rq-epoch's pickup latency under load may be at most this times stock's (p50 and mean).
LOAD_TARGET = 1.1
#: Pickup after idle, at most (ms).
IDLE_PICKUP_TARGET_MS = 250.0
#: What an idle worker's wait may cost: calls per second, server µs per second.
IDLE_CALLS_TARGET = 5.0
IDLE_US_TARGET = 30.0
#: Client name of the benchmark's own connection; its commands are left out of the counts.
BENCH_CLIENT = 'pickup-bench'
#: Commands of the wait for a job (the rest of an idle worker's calls are heartbeats and sweeps).
WAIT_COMMANDS = frozenset({'BLPOP', 'BLMOVE', 'EVALSHA:take', 'EXISTS:queues'})

WORKER_CLASSES = {
    STOCK: None,
    EPOCH: 'rq_epoch.Worker',
    POLL: 'benchmarks._polling_worker.PollingWorker',
}


# -- workers and the server's timing of their commands --------------------------------------


def start_worker(url: str, side: str, log: Path, queues: Sequence[str] = QUEUES) -> subprocess.Popen[bytes]:
    """A real ``rq worker`` of ``side`` on ``queues`` (by default the three queues; not burst)."""
    argv = [sys.executable, '-m', 'rq.cli', 'worker', '--url', url]
    worker_class = WORKER_CLASSES[side]
    if worker_class:
        argv += ['--worker-class', worker_class]
    argv += list(queues)
    with open(log, 'ab') as fh:
        return subprocess.Popen(argv, cwd=ROOT, env=worker_env(), stdout=fh, stderr=subprocess.STDOUT)


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_idle(conn: redis.Redis, workers: int, timeout: float = 60.0) -> None:
    """Until ``workers`` workers are registered and idle, then one more second to settle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        registered = conn.smembers(keys.workers_key())
        with conn.pipeline(transaction=False) as pipe:
            for key in registered:
                pipe.hget(key, 'state')
            states = pipe.execute()
        if len(registered) >= workers and all(state == b'idle' for state in states):
            time.sleep(1.0)
            return
        time.sleep(0.05)
    raise RuntimeError(f'{workers} worker(s) did not become idle within {timeout} s')


def reset_slowlog(conn: redis.Redis) -> None:
    conn.config_set('slowlog-log-slower-than', 0)
    conn.config_set('slowlog-max-len', 1_000_000)
    conn.slowlog_reset()


def _script_names() -> dict[str, str]:
    return {
        script().sha: script().name
        for script in (
            scripts.take, scripts.sweep, scripts.rescue, scripts.grant, scripts.extend, scripts.commit, scripts.claim
        )
    }


def read_slowlog(conn: redis.Redis) -> list[tuple[str, float]]:
    """(command, µs) of every command since :func:`reset_slowlog`, the benchmark's own left out.

    A script call is named ``EVALSHA:<script>``; an ``EXISTS`` of queues, ``EXISTS:queues``.
    """
    names = _script_names()
    out = []
    for entry in conn.slowlog_get(1_000_000):
        client_name = entry.get('client_name') or b''
        if (client_name.decode() if isinstance(client_name, bytes) else str(client_name)) == BENCH_CLIENT:
            continue
        raw = entry['command']
        words = (raw.decode(errors='replace') if isinstance(raw, bytes) else str(raw)).split(' ')
        name = words[0].upper()
        if name in ('SLOWLOG', 'CONFIG'):
            continue
        if name == 'EVALSHA' and len(words) > 1:
            name = f'EVALSHA:{names.get(words[1], "other")}'
        elif name == 'EXISTS' and words[1:] and all(w.startswith(keys.QUEUE_PREFIX) for w in words[1:]):
            name = 'EXISTS:queues'  # the wake-up's read (RQ's own EXISTS reads a job)
        out.append((name, float(entry['duration'])))
    return out


def summarize_idle(calls: list[tuple[str, float]], requests: int, seconds: float) -> dict[str, Any]:
    """The wait's calls and server µs per second; the whole worker's requests per second."""
    wait = [(n, us) for n, us in calls if n in WAIT_COMMANDS]
    return {
        'seconds': round(seconds, 1),
        'requests_per_second': round(requests / seconds, 3),
        'wait_calls_per_second': round(len(wait) / seconds, 3),
        'wait_server_us_per_second': round(sum(us for _, us in wait) / seconds, 2),
        'wait_commands': dict(Counter(n for n, _ in wait)),
        'commands_logged': dict(Counter(n for n, _ in calls).most_common(12)),
    }


def per_call_us(conn: redis.Redis, calls: int) -> dict[str, float]:
    """Server µs of one empty take and of one ``EXISTS`` of the three queues, each measured alone."""
    from rq_epoch.take import Taker

    conn.flushall()
    queues = [Queue(name, connection=conn) for name in QUEUES]
    taker = Taker(conn)
    scripts.load_all(conn)
    conn.config_set('slowlog-log-slower-than', 10_000)
    out = {}
    for name, command, call in (
        ('take_empty', 'evalsha', lambda: taker.take(queues)),
        ('exists', 'exists', lambda: conn.exists(*[queue.key for queue in queues])),
    ):
        conn.config_resetstat()
        for _ in range(calls):
            call()
        out[name] = float(conn.info('commandstats')[f'cmdstat_{command}']['usec_per_call'])
    return out


# -- latency ------------------------------------------------------------------------------


def latencies_ms(conn: redis.Redis, job_ids: list[str]) -> list[float]:
    """``started_at - enqueued_at`` of each job, in ms (both written by RQ, on this machine)."""
    with conn.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job_key(job_id), 'enqueued_at', 'started_at')
        rows = pipe.execute()
    out = []
    for enqueued, started in rows:
        if enqueued and started:
            out.append((str_to_date(started) - str_to_date(enqueued)).total_seconds() * 1000.0)
    return out


class Poller:
    """Polls job statuses (one request per poll) and counts its polls."""

    def __init__(self, conn: redis.Redis) -> None:
        self.conn = conn
        self.polls = 0

    def finished(self, job_ids: list[str], timeout: float) -> bool:
        """Until every job is finished (True), one failed, or ``timeout`` seconds (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.conn.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hget(keys.job_key(job_id), 'status')
                statuses = pipe.execute()
            self.polls += 1
            if all(s == b'finished' for s in statuses):
                return True
            if any(s == b'failed' for s in statuses):
                return False
            time.sleep(0.01)
        return False


def wait_finished(conn: redis.Redis, job_ids: list[str], timeout: float) -> bool:
    return Poller(conn).finished(job_ids, timeout)


def stats_ms(values: list[float]) -> dict[str, Any]:
    return {
        'n': len(values),
        'p50_ms': round(percentile(values, 50), 2),
        'p90_ms': round(percentile(values, 90), 2),
        'p99_ms': round(percentile(values, 99), 2),
        'max_ms': round(max(values, default=0.0), 2),
        'mean_ms': round(mean(values), 2) if values else 0.0,
    }


# -- one side -------------------------------------------------------------------------------


def one_run(conn: redis.Redis, url: str, side: str, sizes: dict[str, Any], log: Path) -> dict[str, Any]:
    """Start one worker of ``side`` and measure 1-4 with it."""
    conn.flushall()
    queues = [Queue(name, connection=conn) for name in QUEUES]
    proc = start_worker(url, side, log)
    try:
        wait_idle(conn, 1)
        # 1. idle cost
        reset_slowlog(conn)
        before = conn.info('stats')['total_reads_processed']
        start = time.monotonic()
        time.sleep(sizes['idle_seconds'])
        requests = conn.info('stats')['total_reads_processed'] - before - 1  # the second INFO
        idle = summarize_idle(read_slowlog(conn), requests, time.monotonic() - start)
        # 2. pickup after idle
        after_idle = []
        jitter = random.Random(7)  # the same gaps for every side, not in step with a poll
        for i in range(sizes['idle_rounds']):
            time.sleep(sizes['idle_gap'] + jitter.uniform(0.0, 0.25))
            job = queues[(i + 2) % 3].enqueue('benchmarks.jobs.noop')
            if not wait_finished(conn, [job.id], 30):
                raise RuntimeError(f'{side}: job after idle not finished')
            after_idle += latencies_ms(conn, [job.id])
        # 3. pickup under load: a steady rate across the queues
        ids = []
        interval = 1.0 / sizes['rate']
        next_at = time.perf_counter()
        for i in range(sizes['load_jobs']):
            ids.append(queues[i % 3].enqueue('benchmarks.jobs.noop').id)
            next_at += interval
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        load_ok = wait_finished(conn, ids, 120)
        under_load = latencies_ms(conn, ids)
        # 4. backlog
        with conn.pipeline() as pipe:
            backlog_ids = [
                queues[i % 3].enqueue('benchmarks.jobs.noop', pipeline=pipe).id for i in range(sizes['backlog'])
            ]
            pipe.execute()
        before = conn.info('stats')['total_reads_processed']
        start = time.monotonic()
        poller = Poller(conn)
        backlog_ok = poller.finished(backlog_ids, 300)
        drained = time.monotonic() - start
        reads = conn.info('stats')['total_reads_processed'] - before - poller.polls - 1  # the second INFO
    finally:
        stop_worker(proc)
    return {
        'side': side,
        'ok': load_ok and backlog_ok,
        'idle': idle,
        'after_idle': stats_ms(after_idle),
        'under_load': stats_ms(under_load),
        'backlog': {
            'jobs': sizes['backlog'],
            'seconds': round(drained, 3),
            'jobs_per_second': round(sizes['backlog'] / drained, 1),
            'reads_per_job': round(reads / sizes['backlog'], 2),
        },
    }


def fleet(conn: redis.Redis, url: str, side: str, workers: int, jobs: int, log: Path) -> dict[str, Any]:
    """``workers`` idle workers of ``side``; a job every 100 ms: server calls and µs per job."""
    conn.flushall()
    queues = [Queue(name, connection=conn) for name in QUEUES]
    procs = [start_worker(url, side, log) for _ in range(workers)]
    try:
        wait_idle(conn, workers, timeout=120)
        reset_slowlog(conn)
        ids = []
        for i in range(jobs):
            ids.append(queues[i % 3].enqueue('benchmarks.jobs.noop').id)
            time.sleep(0.1)
        ok = wait_finished(conn, ids, 60)
        calls = read_slowlog(conn)
        lat = latencies_ms(conn, ids)
        time.sleep(0.5)  # the last job's worker back in its wait
        calls = read_slowlog(conn)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            stop_worker(proc)
    wait = [(n, us) for n, us in calls if n in WAIT_COMMANDS]
    return {
        'side': side,
        'workers': workers,
        'jobs': jobs,
        'ok': ok,
        'wait_calls_per_job': round(len(wait) / jobs, 1),
        'wait_server_us_per_job': round(sum(us for _, us in wait) / jobs, 1),
        'wait_commands_per_job': {n: round(c / jobs, 2) for n, c in Counter(n for n, _ in wait).items()},
        'pickup': stats_ms(lat),
    }


def wait_alone(conn: redis.Redis, url: str, samples: int) -> dict[str, Any]:
    """Time from an enqueue call to the dequeue returning that job, stock vs the take (no fork)."""
    import threading

    from rq_epoch import Job as EpochJob
    from rq_epoch.take import Taker

    conn.flushall()
    client = redis.Redis.from_url(url)
    stock_queues = [Queue(name, connection=client) for name in QUEUES]
    epoch_queues = [Queue(name, connection=client) for name in QUEUES]
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
                result = Queue.dequeue_any(stock_queues, 5, connection=client)
            else:
                result = taker.dequeue_any(epoch_queues, 5, job_class=EpochJob)
            done = time.perf_counter()
            thread.join(5)
            if result is None or not sent:
                raise RuntimeError(f'{side}: the dequeue returned no job')
            times[side].append((done - sent[0]) * 1000.0)
            conn.delete(*[queue.intermediate_queue_key for queue in epoch_queues])
    taker.close()
    client.close()
    out: dict[str, Any] = {side: stats_ms(values) for side, values in times.items()}
    out['added_p50_ms'] = round(out[EPOCH]['p50_ms'] - out[STOCK]['p50_ms'], 3)
    return out


# -- summary --------------------------------------------------------------------------------


def summary(runs: list[dict[str, Any]], unit: dict[str, float]) -> dict[str, Any]:
    """Means per side and the ratios rq-epoch / stock, with the targets."""
    out: dict[str, Any] = {}
    for side in (STOCK, EPOCH, POLL):
        mine = [r for r in runs if r['side'] == side]
        if not mine:
            continue
        counts: Counter[str] = Counter()
        for r in mine:
            counts.update(r['idle']['wait_commands'])
        idle_seconds = sum(r['idle']['seconds'] for r in mine)
        out[side] = {
            'idle_requests_per_second': round(mean(r['idle']['requests_per_second'] for r in mine), 3),
            'wait_calls_per_second': round(mean(r['idle']['wait_calls_per_second'] for r in mine), 3),
            'wait_server_us_per_second': round(mean(r['idle']['wait_server_us_per_second'] for r in mine), 2),
            # the same calls, at the server time each takes alone
            'wait_us_per_second_at_unit_cost': round(
                (counts['EVALSHA:take'] * unit['take_empty'] + counts['EXISTS:queues'] * unit['exists']) / idle_seconds,
                2,
            ),
            'after_idle_p50_ms': round(mean(r['after_idle']['p50_ms'] for r in mine), 2),
            'after_idle_max_ms': round(max(r['after_idle']['max_ms'] for r in mine), 2),
            'load_p50_ms': round(mean(r['under_load']['p50_ms'] for r in mine), 2),
            'load_p90_ms': round(mean(r['under_load']['p90_ms'] for r in mine), 2),
            'load_p99_ms': round(mean(r['under_load']['p99_ms'] for r in mine), 2),
            'load_mean_ms': round(mean(r['under_load']['mean_ms'] for r in mine), 2),
            'backlog_jobs_per_second': round(mean(r['backlog']['jobs_per_second'] for r in mine), 1),
            'backlog_reads_per_job': round(mean(r['backlog']['reads_per_job'] for r in mine), 2),
        }
    s, e = out[STOCK], out[EPOCH]
    out['ratio'] = {
        'load_p50': ratio(e['load_p50_ms'], s['load_p50_ms']),
        'load_mean': ratio(e['load_mean_ms'], s['load_mean_ms']),
        'after_idle_p50': ratio(e['after_idle_p50_ms'], s['after_idle_p50_ms']),
        'backlog_jobs_per_second': ratio(e['backlog_jobs_per_second'], s['backlog_jobs_per_second']),
    }
    out['per_call_us'] = unit
    out['targets'] = {
        'load_ratio': LOAD_TARGET,
        'load_ratio_met': out['ratio']['load_p50'] is not None and out['ratio']['load_p50'] <= LOAD_TARGET,
        'after_idle_ms': IDLE_PICKUP_TARGET_MS,
        'after_idle_met': e['after_idle_max_ms'] <= IDLE_PICKUP_TARGET_MS,
        'idle_calls_per_second': IDLE_CALLS_TARGET,
        'idle_server_us_per_second': IDLE_US_TARGET,
        'idle_met': e['wait_calls_per_second'] <= IDLE_CALLS_TARGET
        and e['wait_server_us_per_second'] <= IDLE_US_TARGET,
    }
    return out


def render(totals: dict[str, Any], fleets: list[dict[str, Any]], alone: dict[str, Any]) -> str:
    headers = [
        'worker',
        'idle requests/s',
        'wait calls/s',
        'wait µs/s',
        'after idle p50 ms',
        'after idle max ms',
        'load p50 ms',
        'load p99 ms',
        'load mean ms',
        'backlog jobs/s',
        'reads/job',
    ]
    body: list[list[Any]] = []
    for side in (STOCK, EPOCH, POLL):
        t = totals.get(side)
        if t is None:
            continue
        body.append(
            [
                side,
                t['idle_requests_per_second'],
                t['wait_calls_per_second'],
                t['wait_server_us_per_second'],
                t['after_idle_p50_ms'],
                t['after_idle_max_ms'],
                t['load_p50_ms'],
                t['load_p99_ms'],
                t['load_mean_ms'],
                t['backlog_jobs_per_second'],
                t['backlog_reads_per_job'],
            ]
        )
    r = totals['ratio']
    body.append(
        [
            'ratio rq-epoch/stock',
            None,
            None,
            None,
            r['after_idle_p50'],
            None,
            r['load_p50'],
            None,
            r['load_mean'],
            r['backlog_jobs_per_second'],
            None,
        ]
    )
    t = totals['targets']
    unit = totals['per_call_us']
    lines = [
        table(headers, body),
        '',
        f'one empty take: {unit["take_empty"]} µs of server time; one EXISTS of the queues: {unit["exists"]} µs',
        f'under load (p50) ≤{t["load_ratio"]}× stock: {"met" if t["load_ratio_met"] else "MISSED"}',
        f'after idle ≤{t["after_idle_ms"]:g} ms: {"met" if t["after_idle_met"] else "MISSED"}',
        f'idle wait ≤{t["idle_calls_per_second"]:g} calls/s and ≤{t["idle_server_us_per_second"]:g} µs/s: '
        f'{"met" if t["idle_met"] else "MISSED"}',
    ]
    if fleets:
        fleet_headers = [
            'worker',
            'idle workers',
            'jobs',
            'wait calls/job',
            'wait µs/job',
            'pickup p50 ms',
            'pickup p99 ms',
        ]
        fleet_body = [
            [
                f['side'],
                f['workers'],
                f['jobs'],
                f['wait_calls_per_job'],
                f['wait_server_us_per_job'],
                f['pickup']['p50_ms'],
                f['pickup']['p99_ms'],
            ]
            for f in fleets
        ]
        lines += ['', table(fleet_headers, fleet_body)]
    lines += [
        '',
        table(
            ['the wait alone', 'samples', 'p50 ms', 'p90 ms', 'p99 ms', 'mean ms'],
            [
                [
                    side,
                    alone[side]['n'],
                    alone[side]['p50_ms'],
                    alone[side]['p90_ms'],
                    alone[side]['p99_ms'],
                    alone[side]['mean_ms'],
                ]
                for side in (STOCK, EPOCH)
            ],
        ),
        f'the take adds {alone["added_p50_ms"]} ms (p50) between an enqueue and the dequeue returning the job',
    ]
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--idle-seconds', type=float, default=None, help='idle window per run (default 30; quick 3)')
    p.add_argument('--fleet', type=int, default=None, help='idle workers in the fleet measurement (default 8; quick 2)')
    args = p.parse_args(argv)
    sizes = {
        'idle_seconds': args.idle_seconds or (3.0 if args.quick else 30.0),
        'idle_rounds': 3 if args.quick else 20,
        'idle_gap': 0.5 if args.quick else 1.0,
        'rate': 20.0,
        'load_jobs': 20 if args.quick else 400,
        'backlog': 30 if args.quick else 500,
    }
    fleet_workers = args.fleet or (2 if args.quick else 8)
    fleet_jobs = 10 if args.quick else 100
    order = ORDER_QUICK if args.quick else ORDER_FULL
    with server(args.server) as srv, tempfile.TemporaryDirectory(prefix='rq-epoch-bench-') as tmp:
        conn = srv.client(client_name=BENCH_CLIENT)
        unit = per_call_us(conn, 200 if args.quick else 5000)
        runs = []
        for index, side in enumerate(order):
            runs.append(one_run(conn, srv.url, side, sizes, Path(tmp) / f'{index}-{side}.log'))
            r = runs[-1]
            print(
                f'  run {index + 1}: {side:<18} idle wait {r["idle"]["wait_calls_per_second"]:6.2f} calls/s '
                f'{r["idle"]["wait_server_us_per_second"]:7.1f} µs/s; '
                f'after idle p50 {r["after_idle"]["p50_ms"]:6.1f} ms; load p50 {r["under_load"]["p50_ms"]:6.1f} ms; '
                f'backlog {r["backlog"]["jobs_per_second"]:6.1f} jobs/s  ok={r["ok"]}',
                flush=True,
            )
        fleets = []
        for side in (STOCK, EPOCH):
            fleets.append(fleet(conn, srv.url, side, fleet_workers, fleet_jobs, Path(tmp) / f'fleet-{side}.log'))
            f = fleets[-1]
            print(f'  fleet {side}: {f["wait_calls_per_job"]} wait calls/job, ok={f["ok"]}', flush=True)
        alone = wait_alone(conn, srv.url, 20 if args.quick else 300)
        totals = summary(runs, unit)
        print()
        print(render(totals, fleets, alone))
        write_results(
            NAME,
            {
                'quick': args.quick,
                'server': server_version(conn),
                'queues': len(QUEUES),
                'sizes': sizes,
                'runs': runs,
                'fleet': fleets,
                'wait_alone': alone,
                'summary': totals,
            },
            args.out,
            conn,
        )
    return 0 if all(r['ok'] for r in runs) and all(f['ok'] for f in fleets) else 1


if __name__ == '__main__':
    raise SystemExit(main())
