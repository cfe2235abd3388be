"""What every benchmark shares: its arguments, its own server, real workers, counting, timing, results."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import mean
from typing import Any

import redis
import redis.connection
import rq
from rq.utils import str_to_date

import rq_epoch
from rq_epoch.embedded import EmbeddedServer
from rq_epoch.pids import children_of, send_signal
from rq_epoch.protocol import keys

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / 'results'

#: Labels of the two sides, in every table and JSON file.
STOCK = 'stock'
EPOCH = 'rq-epoch'


# -- arguments ------------------------------------------------------------------------------


def job_starts(path: Path) -> list[tuple[float, int, int]]:
    """(time, work-horse pid, worker pid) of each start of a job, from the ledger its function writes."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        t, pid, ppid = line.split()
        rows.append((float(t), int(pid), int(ppid)))
    return rows


def wait_until(condition: Any, timeout: float, interval: float = 0.05) -> Any:
    """The first true value of ``condition()``, polled every ``interval`` s; None after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    return None


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
    """Give RQ's and rq-epoch's per-job log records a handler that drops them (both sides still build them)."""
    for name in ('rq', 'rq_epoch'):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())
        logger.propagate = False


# -- the server -----------------------------------------------------------------------------

#: AOF on with fsync every second, as the tests run it; no automatic AOF rewrite, so that
#: no fork (and its copy-on-write slowdown) lands inside a measurement by chance.
SERVER_CONFIG = {'appendonly': 'yes', 'appendfsync': 'everysec', 'auto-aof-rewrite-percentage': '0'}


@contextmanager
def server(kind: str, **config: str) -> Iterator[EmbeddedServer]:
    """A fresh server of ``kind`` on loopback, stopped and removed afterwards."""
    with EmbeddedServer(kind, extra_config={**SERVER_CONFIG, **config}) as srv:
        yield srv


def server_version(conn: redis.Redis) -> str:
    """``valkey 9.1.2`` or ``redis 7.0.15``."""
    info = conn.info('server')
    if 'valkey_version' in info:
        return f'valkey {info["valkey_version"]}'
    return f'redis {info["redis_version"]}'


# -- real workers ---------------------------------------------------------------------------


def worker_env(**settings: str) -> dict[str, str]:
    """A worker's environment: this checkout importable, no rq-epoch settings but ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith('RQ_EPOCH_')}
    env['PYTHONPATH'] = str(ROOT) + os.pathsep + env.get('PYTHONPATH', '')
    return {**env, **settings}


def worker_argv(url: str, side: str, queues: Sequence[str], *options: str, module: str = 'rq.cli') -> list[str]:
    """``rq worker`` of one side (rq-epoch's by ``--worker-class``), each with its defaults."""
    argv = [sys.executable, '-m', module, 'worker', '--url', url, *options]
    if side == EPOCH:
        argv += ['--worker-class', 'rq_epoch.Worker']
    return argv + list(queues)


def run_burst_worker(argv: Sequence[str], env: dict[str, str], log: Path, timeout: float) -> int:
    """Run a ``rq worker --burst`` (``argv``) to its end, its output in ``log``; its exit code,
    or -1 when it was still running after ``timeout`` seconds (then it is killed)."""
    with open(log, 'wb') as fh:
        proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            return -1


def start_worker(url: str, side: str, log: Path, queues: Sequence[str], *options: str) -> subprocess.Popen[bytes]:
    """A real ``rq worker`` of ``side`` on ``queues``, its output appended to ``log``."""
    with open(log, 'ab') as fh:
        argv = worker_argv(url, side, queues, *options)
        return subprocess.Popen(argv, cwd=ROOT, env=worker_env(), stdout=fh, stderr=subprocess.STDOUT)


def stop_workers(procs: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM every worker, SIGKILL what is left after ``grace`` seconds (work-horses too)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(proc.poll() is None for proc in procs):
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            for pid in children_of(proc.pid):
                send_signal(pid, signal.SIGKILL)
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


def wait_finished(conn: redis.Redis, job_ids: list[str], timeout: float) -> int:
    """Poll until every job has finished: the number of polls (one request each), or 0 when one
    failed or ``timeout`` seconds passed first."""
    deadline = time.monotonic() + timeout
    polls = 0
    while time.monotonic() < deadline:
        with conn.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(keys.job_key(job_id), 'status')
            statuses = pipe.execute()
        polls += 1
        if all(s == b'finished' for s in statuses):
            return polls
        if any(s == b'failed' for s in statuses):
            return 0
        time.sleep(0.01)
    return 0


def latencies_ms(conn: redis.Redis, job_ids: list[str]) -> list[float]:
    """``started_at - enqueued_at`` of each job, in ms (both written by RQ, on this machine)."""
    with conn.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.job_key(job_id), 'enqueued_at', 'started_at')
        rows = pipe.execute()
    return [
        (str_to_date(started) - str_to_date(enqueued)).total_seconds() * 1000.0
        for enqueued, started in rows
        if enqueued and started
    ]


# -- counting what a client sends, and what the server ran ----------------------------------


@dataclass
class Traffic:
    """Round trips (request writes) and commands one thread sent, counted inside redis-py."""

    round_trips: int = 0
    commands: int = 0


_active = threading.local()
_installed = False


def _install_counters() -> None:
    """Wrap redis-py's three ways of sending once, so that :func:`count_traffic` can count them."""
    global _installed
    if _installed:
        return
    cls: Any = redis.connection.AbstractConnection
    send_packed, send_command, pack_commands = cls.send_packed_command, cls.send_command, cls.pack_commands

    def counted_send_packed(self: Any, command: Any, check_health: bool = True) -> Any:
        traffic = getattr(_active, 'traffic', None)
        if traffic is not None:
            traffic.round_trips += 1
        return send_packed(self, command, check_health)

    def counted_send_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        traffic = getattr(_active, 'traffic', None)
        if traffic is not None:
            traffic.commands += 1
        return send_command(self, *args, **kwargs)

    def counted_pack_commands(self: Any, commands: Sequence[Any]) -> Any:
        commands = list(commands)
        traffic = getattr(_active, 'traffic', None)
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
    previous = getattr(_active, 'traffic', None)
    _active.traffic = traffic
    try:
        yield traffic
    finally:
        _active.traffic = previous


def commandstats(conn: redis.Redis) -> dict[str, int]:
    """Calls per command, from INFO commandstats (commands run inside scripts included)."""
    return {name.removeprefix('cmdstat_'): int(v['calls']) for name, v in conn.info('commandstats').items()}


#: Commands the benchmark itself sends to measure; left out of the deltas.
MEASURING = frozenset(
    {'ping', 'slowlog|get', 'slowlog|reset', 'config|set', 'config|resetstat', 'latency|latest', 'latency|reset'}
)


def command_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands run between two :func:`commandstats` snapshots, busiest first (the INFO of the first left out)."""
    delta = {k: v - before.get(k, 0) for k, v in after.items() if k not in MEASURING}
    if 'info' in delta:
        delta['info'] -= 1
    return dict(sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1]))


# -- statistics and results -----------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return float(ordered[rank])


def stats_ms(values: list[float]) -> dict[str, Any]:
    """Count, p50, p90, p99, max and mean of latencies in ms."""
    return {
        'n': len(values),
        'p50_ms': round(percentile(values, 50), 2),
        'p90_ms': round(percentile(values, 90), 2),
        'p99_ms': round(percentile(values, 99), 2),
        'max_ms': round(max(values, default=0.0), 2),
        'mean_ms': round(mean(values), 2) if values else 0.0,
    }


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator`` rounded, or None when the denominator is zero."""
    return round(numerator / denominator, 2) if denominator else None


def environment(conn: redis.Redis | None = None) -> dict[str, Any]:
    """Where and when a run happened: versions, cores, load, the commit measured."""
    env: dict[str, Any] = {
        'date_utc': datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
        'python': platform.python_version(),
        'rq': rq.__version__ if hasattr(rq, '__version__') else rq.VERSION,
        'rq_epoch': rq_epoch.__version__,
        'redis_py': redis.__version__,
        'cpus': os.cpu_count(),
        'load_average_at_end': [round(x, 2) for x in os.getloadavg()],
        'machine': platform.machine(),
        'git': _git_state(),
    }
    if conn is not None:
        env['server'] = server_version(conn)
    return env


def _git_state() -> str:
    """The commit measured, marked ``+changes`` when rq_epoch/ differs from it."""
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
