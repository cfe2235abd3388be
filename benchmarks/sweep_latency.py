"""What does a cleanup of many expired leases do to every other client of the server?

A second client (its own process) sends PING every millisecond: first with nothing else
running (the baseline), then while stock cleanup and while rq-epoch's sweep clean N
expired leases. For each: its p50/p99/max, and the longest single server block (SLOWLOG
for commands and scripts; the latency monitor for stock's closing MULTI/EXEC, which
SLOWLOG leaves out). Then the sweep alone at several batch sizes
(``RQ_EPOCH_BATCH_SIZE``): what a batch costs in server time, and how long one call holds
the server.

    python -m benchmarks.sweep_latency            # N = 100,000; batch study at 20,000
    python -m benchmarks.sweep_latency --quick
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import redis

from rq_epoch.embedded import EmbeddedServer

from .fixture import run_case
from .harness import parser, percentile, quiet_logging, server, server_version
from .report import finish

NAME = 'sweep_latency'
SIDES = ('stock-retry', 'exempt', 'recovered')
BATCHES = (10, 20, 30, 50, 100, 200, 400, 1000)


def ping_loop(port: int, interval: float, max_seconds: float, ready: Any, stop: Any, out: Any) -> None:
    """PING every ``interval`` seconds until ``stop`` is set (or ``max_seconds``); put the summary on ``out``."""
    client = redis.Redis(host='127.0.0.1', port=port)
    client.ping()
    latencies: list[float] = []
    ready.set()
    start = next_at = time.perf_counter()
    while time.perf_counter() - start < max_seconds and not stop.is_set():
        sent = time.perf_counter()
        client.ping()
        latencies.append((time.perf_counter() - sent) * 1000.0)
        next_at = max(next_at + interval, time.perf_counter())
        time.sleep(max(0.0, next_at - time.perf_counter()))
    client.close()
    out.put(
        {
            'pings': len(latencies),
            'p50_ms': round(percentile(latencies, 50), 3),
            'p99_ms': round(percentile(latencies, 99), 3),
            'max_ms': round(max(latencies, default=0.0), 3),
        }
    )


def longest_blocks(conn: redis.Redis) -> dict[str, Any]:
    """The longest single commands since the probe started, and the script calls' p99.

    SLOWLOG times each command and script to the microsecond but leaves out EXEC (RQ's
    cleanup ends with one MULTI/EXEC); the latency monitor's ``command`` event includes
    EXEC, to the millisecond. ``longest_ms`` is the larger. Both are wall-clock times: on a
    busy machine they include time the server was not scheduled.
    """
    durations, scripts = [], []
    for entry in conn.slowlog_get(100_000):
        name = entry['command'].split(b' ', 1)[0].upper()
        if name in (b'SLOWLOG', b'LATENCY', b'CONFIG'):  # the measuring itself
            continue
        durations.append(entry['duration'] / 1000.0)
        if name == b'EVALSHA':
            scripts.append(entry['duration'] / 1000.0)
    monitor = [int(row[3]) for row in conn.execute_command('LATENCY', 'LATEST') if row[0] in (b'command', 'command')]
    return {
        'longest_ms': round(max([*durations, *monitor], default=0.0), 3),
        'script_p99_ms': round(percentile(scripts, 99), 3),
        'scripts_over_5ms': sum(1 for d in scripts if d > 5.0),
    }


class PingProbe:
    """A PING client in another process for the duration of the block; ``stats`` holds what it saw."""

    def __init__(self, srv: EmbeddedServer, interval: float = 0.001, max_seconds: float = 900.0) -> None:
        self.srv, self.interval, self.max_seconds = srv, interval, max_seconds
        self.stats: dict[str, Any] = {}

    def __enter__(self) -> dict[str, Any]:
        ctx = multiprocessing.get_context('spawn')
        self._ready, self._stop, self._out = ctx.Event(), ctx.Event(), ctx.Queue()
        self._admin = self.srv.client()
        self._admin.config_set('slowlog-log-slower-than', 100)
        self._admin.config_set('slowlog-max-len', 100_000)
        self._admin.config_set('latency-monitor-threshold', 1)
        self._admin.slowlog_reset()
        self._admin.execute_command('LATENCY', 'RESET')
        args = (self.srv.port, self.interval, self.max_seconds, self._ready, self._stop, self._out)
        self._proc = ctx.Process(target=ping_loop, args=args, daemon=True)
        self._proc.start()
        if not self._ready.wait(30):
            raise RuntimeError('the PING client did not start')
        return self.stats

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        try:
            self.stats.update(self._out.get(timeout=60))
        finally:
            self._proc.join(30)
            if self._proc.is_alive():
                self._proc.kill()
        self.stats['server_blocks'] = longest_blocks(self._admin)
        self._admin.close()


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('-n', type=int, default=None, help='expired leases per side (default 100000; quick 300)')
    p.add_argument('--batch-n', type=int, default=None, help='leases per batch-size run (default 20000; quick 300)')
    args = p.parse_args(argv)
    n = args.n or (300 if args.quick else 100_000)
    batch_n = args.batch_n or (300 if args.quick else 20_000)
    quiet_logging()
    with server(args.server) as srv:
        conn = srv.client()
        with PingProbe(srv) as baseline:
            time.sleep(0.5 if args.quick else 5.0)
        during, study = [], []
        for case in SIDES:
            outcome = run_case(conn, case, n, around=lambda: PingProbe(srv))
            during.append({'case': case, 'n': n, 'seconds': round(outcome.seconds, 3), 'ok': outcome.ok})
            during[-1].update(outcome.during)
            print(f'  {case:<12} {outcome.seconds:8.3f}s  PING p99 {outcome.during["p99_ms"]} ms', flush=True)
        for batch in (25, 100, 400) if args.quick else BATCHES:
            outcome = run_case(conn, 'exempt', batch_n, batch_size=batch, around=lambda: PingProbe(srv))
            seen = outcome.during
            study.append(
                {
                    'batch': batch,
                    'n': batch_n,
                    'leases_per_second': round(batch_n / outcome.seconds, 1),
                    'script': outcome.script,
                    'ping_p99_ms': seen['p99_ms'],
                    'ok': outcome.ok,
                    **seen['server_blocks'],
                }
            )
            print(f'  batch {batch:>5}: longest block {seen["server_blocks"]["longest_ms"]} ms', flush=True)
        doc = {'quick': args.quick, 'server': server_version(conn), 'baseline': baseline, 'during': during}
        doc['batch_study'] = study
        return finish(NAME, doc, args.out, all(r['ok'] for r in during + study), conn)


if __name__ == '__main__':
    raise SystemExit(main())
