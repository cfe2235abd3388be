"""What every benchmark shares: arguments, its own server, counters, tables and JSON results."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis
import redis.connection
import rq

import rq_epoch
from rq_epoch.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / 'results'

#: Labels of the two sides, in every table and JSON file.
STOCK = 'stock'
EPOCH = 'rq-epoch'


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every benchmark takes: ``--quick``, ``--server``, ``--out``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument('--quick', action='store_true', help='tiny sizes, for CI: checks that it runs, not how fast')
    p.add_argument('--server', choices=('valkey', 'redis'), default='valkey', help='server to start (default valkey)')
    p.add_argument('--out', type=Path, default=None, help='JSON file to write (default benchmarks/results/<name>.json)')
    return p


def comma_sizes(text: str) -> tuple[int, ...]:
    """``--sizes 10000,100000``: positive whole numbers, comma-separated."""
    try:
        values = tuple(int(x) for x in text.split(','))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected comma-separated whole numbers, got {text!r}') from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f'sizes must be at least 1, got {text!r}')
    return values


def quiet_logging() -> None:
    """Give RQ's and rq-epoch's per-job log records a handler that drops them.

    Both sides log one warning per abandoned or stalled job; without any handler Python
    would print each to stderr. Both sides still build the records.
    """
    for name in ('rq', 'rq_epoch'):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
        logger.propagate = False


#: AOF on with fsync every second, as the tests run it; no automatic AOF rewrite, so that
#: no fork (and its copy-on-write slowdown) lands inside a measurement by chance.
SERVER_CONFIG = {'appendonly': 'yes', 'appendfsync': 'everysec', 'auto-aof-rewrite-percentage': '0'}


@contextmanager
def server(kind: str, **config: str) -> Iterator[EmbeddedServer]:
    """A fresh server of ``kind`` on loopback, stopped and removed afterwards."""
    srv = EmbeddedServer(kind, extra_config={**SERVER_CONFIG, **config})
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def server_version(conn: redis.Redis) -> str:
    """``valkey 9.1.2`` or ``redis 7.0.15``."""
    info = conn.info('server')
    if 'valkey_version' in info:
        return f'valkey {info["valkey_version"]}'
    return f'redis {info["redis_version"]}'


# -- counting what a client sends ---------------------------------------------------------


@dataclass
class Traffic:
    """Round trips (request writes) and commands one thread sent, counted inside redis-py."""

    round_trips: int = 0
    commands: int = 0


_active = threading.local()
_installed = False


def _recorder() -> Traffic | None:
    return getattr(_active, 'traffic', None)


def _install_counters() -> None:
    global _installed
    if _installed:
        return
    cls: Any = redis.connection.AbstractConnection
    send_packed, send_command, pack_commands = cls.send_packed_command, cls.send_command, cls.pack_commands

    def counted_send_packed(self: Any, command: Any, check_health: bool = True) -> Any:
        traffic = _recorder()
        if traffic is not None:
            traffic.round_trips += 1
        return send_packed(self, command, check_health)

    def counted_send_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        traffic = _recorder()
        if traffic is not None:
            traffic.commands += 1
        return send_command(self, *args, **kwargs)

    def counted_pack_commands(self: Any, commands: Sequence[Any]) -> Any:
        commands = list(commands)
        traffic = _recorder()
        if traffic is not None:
            traffic.commands += len(commands)
        return pack_commands(self, commands)

    cls.send_packed_command = counted_send_packed
    cls.send_command = counted_send_command
    cls.pack_commands = counted_pack_commands
    _installed = True


@contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count the round trips and commands this thread sends inside the block."""
    _install_counters()
    traffic = Traffic()
    previous = _recorder()
    _active.traffic = traffic
    try:
        yield traffic
    finally:
        _active.traffic = previous


def commandstats(conn: redis.Redis) -> dict[str, int]:
    """Calls per command, from INFO commandstats (commands run inside scripts included)."""
    return {name.removeprefix('cmdstat_'): int(v['calls']) for name, v in conn.info('commandstats').items()}


#: Commands the benchmark itself sends to measure (the latency probe's PINGs too); left out of the deltas.
MEASURING = (
    'ping',
    'slowlog|get',
    'slowlog|reset',
    'config|set',
    'config|resetstat',
    'latency|latest',
    'latency|reset',
)


def command_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands run between two :func:`commandstats` snapshots, busiest first.

    The INFO that took the first snapshot is not counted; INFO sent by the code measured is.
    """
    delta = {k: v - before.get(k, 0) for k, v in after.items() if k not in MEASURING}
    if 'info' in delta:
        delta['info'] -= 1
    return dict(sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1]))


# -- server blocking ------------------------------------------------------------------------


def reset_block_probes(conn: redis.Redis, slower_than_us: int = 100, max_len: int = 100_000) -> None:
    """Start recording long commands: SLOWLOG (scripts) and the latency monitor (also MULTI/EXEC)."""
    conn.config_set('slowlog-log-slower-than', slower_than_us)
    conn.config_set('slowlog-max-len', max_len)
    conn.config_set('latency-monitor-threshold', 1)
    conn.slowlog_reset()
    conn.execute_command('LATENCY', 'RESET')


def longest_blocks(conn: redis.Redis, max_entries: int = 100_000) -> dict[str, Any]:
    """The longest single commands since :func:`reset_block_probes`.

    SLOWLOG times each command and script to the microsecond but leaves out EXEC (RQ's
    cleanup ends with one MULTI/EXEC); the latency monitor's ``command`` event includes
    EXEC, to the millisecond. Both are reported; ``longest_ms`` is the larger. Both are
    wall-clock times: on a busy machine they include time the server was not scheduled.
    The script calls (EVALSHA) are also summarised: count, p50, p99, max, and how many
    took longer than 5 ms.
    """
    entries = conn.slowlog_get(max_entries)
    top: dict[str, float] = {}
    scripts: list[float] = []
    for entry in entries:
        raw = entry['command']
        name = (raw.split(b' ', 1)[0] if isinstance(raw, bytes) else str(raw).split(' ', 1)[0]).upper()
        label = name.decode() if isinstance(name, bytes) else name
        if label in ('SLOWLOG', 'LATENCY', 'CONFIG'):  # the measuring itself
            continue
        duration = entry['duration'] / 1000.0
        top[label] = max(top.get(label, 0.0), duration)
        if label == 'EVALSHA':
            scripts.append(duration)
    latest = conn.execute_command('LATENCY', 'LATEST')
    monitor_ms = 0
    for row in latest:
        event = row[0].decode() if isinstance(row[0], bytes) else row[0]
        if event == 'command':
            monitor_ms = int(row[3])
    slowlog_ms = max(top.values(), default=0.0)
    return {
        'slowlog_longest_ms': round(slowlog_ms, 3),
        'slowlog_longest_by_command_ms': {k: round(v, 3) for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:5]},
        'latency_monitor_command_max_ms': monitor_ms,
        'longest_ms': round(max(slowlog_ms, float(monitor_ms)), 3),
        'scripts_logged': len(scripts),
        'script_p50_ms': round(percentile(scripts, 50), 3),
        'script_p99_ms': round(percentile(scripts, 99), 3),
        'script_max_ms': round(max(scripts, default=0.0), 3),
        'scripts_over_5ms': sum(1 for d in scripts if d > 5.0),
    }


# -- statistics, tables, results ------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return float(ordered[rank])


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator`` rounded, or None when the denominator is zero."""
    return round(numerator / denominator, 2) if denominator else None


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of ``call()`` and its result."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, columns padded to their widest cell."""
    cells = [[_cell(x) for x in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ['  '.join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append('  '.join('-' * w for w in widths))
    lines += ['  '.join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return '\n'.join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return '-'
    if isinstance(value, bool):
        return 'yes' if value else 'NO'
    if isinstance(value, float):
        if value >= 100:
            return f'{value:,.0f}'
        if value >= 1:
            return f'{value:.2f}'
        return f'{value:.3g}'
    if isinstance(value, int):
        return f'{value:,}'
    return str(value)


def environment(conn: redis.Redis | None = None) -> dict[str, Any]:
    """Where and when a run happened: versions, cores, load."""
    env: dict[str, Any] = {
        'date_utc': datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'python': platform.python_version(),
        'rq': rq.__version__ if hasattr(rq, '__version__') else rq.VERSION,
        'rq_epoch': rq_epoch.__version__,
        'redis_py': redis.__version__,
        'cpus': os.cpu_count(),
        'load_average_at_end': [round(x, 2) for x in os.getloadavg()],
        'machine': platform.machine(),
    }
    env['git'] = _git_state()
    if conn is not None:
        env['server'] = server_version(conn)
    return env


def _git_state() -> str:
    """The commit measured, marked ``+changes`` when rq_epoch/ differs from it."""
    import subprocess

    try:
        head = subprocess.run(
            ['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ['git', 'status', '--porcelain', '--', 'rq_epoch'], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return 'unknown'
    if head.returncode != 0:
        return 'unknown'
    return head.stdout.strip() + ('+changes' if dirty.stdout.strip() else '')


def write_results(name: str, data: dict[str, Any], out: Path | None, conn: redis.Redis | None = None) -> Path:
    """Write ``data`` with the run's environment as JSON; returns the path written."""
    path = out if out is not None else RESULTS_DIR / f'{name}.json'
    path.parent.mkdir(parents=True, exist_ok=True)
    env = environment(conn)
    if 'server' not in env and 'server' in data:
        env['server'] = data['server']
    document = {'benchmark': name, 'environment': env, **data}
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + '\n', encoding='utf-8')
    print(f'\nresults written to {path}', file=sys.stderr)
    return path


# -- a second client that PINGs -------------------------------------------------------------


def ping_loop(port: int, interval: float, max_pings: int, max_seconds: float, ready: Any, stop: Any, out: Any) -> None:
    """PING every ``interval`` seconds until ``stop`` is set (or the bounds); put the latencies' summary on ``out``.

    Runs in its own process, so that the client being measured and the one measuring
    don't share an interpreter.
    """
    client = redis.Redis(host='127.0.0.1', port=port)
    client.ping()
    latencies: list[float] = []
    ready.set()
    start = time.perf_counter()
    next_at = start
    while len(latencies) < max_pings and time.perf_counter() - start < max_seconds and not stop.is_set():
        sent = time.perf_counter()
        client.ping()
        latencies.append((time.perf_counter() - sent) * 1000.0)
        next_at += interval
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        else:
            next_at = time.perf_counter()
    client.close()
    out.put(latency_summary(latencies, time.perf_counter() - start))


def latency_summary(latencies_ms: Sequence[float], seconds: float) -> dict[str, Any]:
    """Count, p50, p99, p99.9 and max (milliseconds) of PING round trips."""
    return {
        'pings': len(latencies_ms),
        'seconds': round(seconds, 3),
        'p50_ms': round(percentile(latencies_ms, 50), 3),
        'p99_ms': round(percentile(latencies_ms, 99), 3),
        'p999_ms': round(percentile(latencies_ms, 99.9), 3),
        'max_ms': round(max(latencies_ms, default=0.0), 3),
        'over_5ms': sum(1 for x in latencies_ms if x > 5.0),
    }


class PingProbe:
    """A context manager: a PING client in another process for the duration of the block.

    ``stats`` holds the summary after the block, and the longest server blocks
    (:func:`longest_blocks`) seen between enter and exit.
    """

    def __init__(self, srv: EmbeddedServer, interval: float = 0.001, max_seconds: float = 900.0) -> None:
        self.srv = srv
        self.interval = interval
        self.max_seconds = max_seconds
        self.stats: dict[str, Any] = {}

    def __enter__(self) -> dict[str, Any]:
        import multiprocessing

        ctx = multiprocessing.get_context('spawn')
        self._ready, self._stop, self._out = ctx.Event(), ctx.Event(), ctx.Queue()
        self._admin = self.srv.client()
        reset_block_probes(self._admin)
        max_pings = int(self.max_seconds / self.interval) + 1
        args = (self.srv.port, self.interval, max_pings, self.max_seconds, self._ready, self._stop, self._out)
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
