"""What do people watching the exporter's page cost the server, with and without its cache?

A real ``rq-epoch exporter`` serves the page for a server holding what a busy deployment
holds (several queues, each with running jobs, jobs waiting, jobs with a counted stall and
dead letters). 1 and 50 viewers each reload the page one refresh period after it arrived, as
the page's ``<meta http-equiv="refresh">`` makes a browser do, each first at its own moment.
The same run measures the exporter without its cache (``--page-cache 0``: every load reads
the server, as before the cache) and with it (the default: each view read at most once per
refresh period for every viewer): the commands the server ran per second (INFO
commandstats deltas, commands inside scripts included), the renders per refresh period
they make (commands per second over the commands of one render), the pages served, and
how long a viewer waited for a page. The ratio is without / with the cache.

    python -m benchmarks.page_viewers            # 1 and 50 viewers, 2 s refresh, 20 s each
    python -m benchmarks.page_viewers --quick    # 1 and 5 viewers, 1 s refresh, 3 s each

Stock RQ has no such page: the comparison is the exporter before and after its cache.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis

from rq_epoch import Sweeper

from .fixture import enqueue_jobs, start_jobs
from .harness import (
    EPOCH,
    ROOT,
    command_delta,
    commandstats,
    parser,
    quiet_logging,
    ratio,
    server,
    server_version,
    stats_ms,
    worker_env,
)
from .report import finish

NAME = 'page_viewers'
#: Per queue: dead letters, jobs requeued with a counted stall, running jobs, jobs waiting.
SHAPE = {'dead': 10, 'stalled': 10, 'running': 20, 'queued': 200}


def build_state(conn: redis.Redis, queues: int) -> dict[str, int]:
    """The queues the page shows, written as workers leave them (see :mod:`benchmarks.fixture`)."""
    conn.flushall()
    for q in range(queues):
        name = f'page-{q}'
        dead = enqueue_jobs(conn, name, SHAPE['dead'], on_failure=False)
        start_jobs(conn, dead, EPOCH)  # stamped by this server process, expired: a real stall
        sweeper = Sweeper(conn, max_stalled=1, restart_grace=0)
        sweeper.sweep([name])
        while sweeper.finish_dead_letters():
            pass
        start_jobs(conn, enqueue_jobs(conn, name, SHAPE['running'], on_failure=False), EPOCH, expired=False)
        stalled = enqueue_jobs(conn, name, SHAPE['stalled'], on_failure=False)
        start_jobs(conn, stalled, EPOCH)
        Sweeper(conn, max_stalled=3, restart_grace=0).sweep([name])  # requeued, stalled 1/3
        enqueue_jobs(conn, name, SHAPE['queued'], on_failure=False)
    return {'queues': queues, **{k: v * queues for k, v in SHAPE.items()}}


class Exporter:
    """``rq-epoch exporter`` as a real process on loopback, on a free port."""

    def __init__(self, url: str, log: Path, *options: str) -> None:
        argv = [sys.executable, '-c', 'from rq_epoch.ops.cli import main; main()', 'exporter', '--url', url]
        argv += ['--host', '127.0.0.1', '--port', '0', *options]
        with open(log, 'ab') as err:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=worker_env(), stdout=subprocess.PIPE, stderr=err)
        assert self.proc.stdout is not None
        banner = self.proc.stdout.readline().decode().split()  # rq-epoch exporter: serving URL/metrics (...)
        if len(banner) < 4 or not banner[3].startswith('http://127.0.0.1:'):
            self.stop()
            raise RuntimeError(f'the exporter did not start: {log.read_text(errors="replace")[-2000:]}')
        self.root = banner[3].removesuffix('metrics')

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def load(url: str) -> tuple[int, float]:
    """One page load: its HTTP status and how long it took, in ms."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        response.read()
        return response.status, (time.perf_counter() - start) * 1000.0


def watch(url: str, viewers: int, refresh: float, warmup: float, seconds: float, conn: redis.Redis) -> dict[str, Any]:
    """``viewers`` threads load ``url``, each first at its own moment in the refresh period, then
    ``refresh`` seconds after each page arrived; the server's commands are counted over
    ``seconds`` after ``warmup`` seconds."""
    stop = threading.Event()
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    counting = threading.Event()

    def viewer(offset: float) -> None:
        # As a browser does with <meta http-equiv="refresh">: the next load ``refresh`` seconds
        # after the page arrived.
        if stop.wait(offset):
            return
        while True:
            try:
                status, ms = load(url)
            except OSError:
                status, ms = 0, 0.0
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                if counting.is_set():
                    latencies.append(ms)
            if stop.wait(refresh):
                return

    rng = random.Random(viewers)
    threads = [threading.Thread(target=viewer, args=(rng.uniform(0, refresh),), daemon=True) for _ in range(viewers)]
    for t in threads:
        t.start()
    time.sleep(warmup)
    before = commandstats(conn)
    counting.set()
    began = time.perf_counter()
    time.sleep(seconds)
    delta = command_delta(before, commandstats(conn))
    elapsed = time.perf_counter() - began
    stop.set()
    for t in threads:
        t.join(130)
    commands = sum(delta.values())
    return {
        'seconds': round(elapsed, 2),
        'pages': len(latencies),
        'pages_per_second': round(len(latencies) / elapsed, 2),
        'server_commands': commands,
        'commands_per_second': round(commands / elapsed, 1),
        'busiest_commands': dict(list(delta.items())[:5]),
        'page_ms': stats_ms(latencies),
        'statuses': {str(k): v for k, v in sorted(statuses.items())},
        'ok': set(statuses) == {200},
    }


def commands_of_one_render(conn: redis.Redis, url: str) -> int:
    """Commands the server runs for one load of ``url`` (from an exporter without a cache)."""
    load(url)  # connections opened, scripts known
    before = commandstats(conn)
    load(url)
    return sum(command_delta(before, commandstats(conn)).values())


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    quiet_logging()
    counts = (1, 5) if args.quick else (1, 50)
    refresh = 1 if args.quick else 2
    seconds = 3.0 if args.quick else 20.0
    queues = 2 if args.quick else 5
    with tempfile.TemporaryDirectory(prefix='rq-epoch-page-') as tmp, server(args.server) as srv:
        log = Path(tmp) / 'exporter.log'
        conn = srv.client()
        state = build_state(conn, queues)
        exporters = {
            'no cache': Exporter(srv.url, log, '--refresh', str(refresh), '--page-cache', '0'),
            'cache': Exporter(srv.url, log, '--refresh', str(refresh)),
        }
        try:
            per_render = commands_of_one_render(conn, exporters['no cache'].root)
            rows = []
            for viewers in counts:
                for label, exporter in exporters.items():
                    print(f'{viewers} viewer(s), {label} ...', file=sys.stderr, flush=True)
                    row = watch(exporter.root, viewers, refresh, refresh, seconds, conn)
                    renders_per_period = row['commands_per_second'] * refresh / per_render if per_render else None
                    rows.append(
                        {
                            'viewers': viewers,
                            'cache': label == 'cache',
                            'renders_per_period': None if renders_per_period is None else round(renders_per_period, 2),
                            **row,
                        }
                    )
        finally:
            for exporter in exporters.values():
                exporter.stop()
        ratios = [
            {
                'viewers': viewers,
                'commands_per_second': ratio(
                    *(
                        next(r['commands_per_second'] for r in rows if r['viewers'] == viewers and r['cache'] is cache)
                        for cache in (False, True)
                    )
                ),
            }
            for viewers in counts
        ]
        doc = {
            'quick': args.quick,
            'server': server_version(conn),
            'state': state,
            'refresh_seconds': refresh,
            'window_seconds': seconds,
            'commands_per_render': per_render,
            'rows': rows,
            'ratios': ratios,
        }
        return finish(NAME, doc, args.out, all(r['ok'] for r in rows), conn)


if __name__ == '__main__':
    raise SystemExit(main())
