"""Question 1c: what one sweep call costs before it judges a lease.

Every call of the sweep script reads what it needs before the first lease: the run_id and
uptime (``INFO server``), the time (``TIME``), the primary epoch (``INFO replication`` and the
primaries hash), whether 0.2.0 leases exist, the expired entries of stock workers, and it
writes ``last_sweep``. The floor reads the run_id, the time and the leases. This benchmark
calls the sweep script, the compact script (:data:`benchmarks.scenarios.COMPACT_SCRIPT`, the
same reads and writes with no verdict rule) and the floor on a queue with no expired lease,
``--calls`` times each per round, the three in a new random order each round, and keeps each
one's median server time per call (``INFO commandstats``) over ``--rounds`` rounds.

A call's cost before its first lease is shared by the leases of one batch: the table shows
how much each script adds per lease over the floor at a few batch sizes. The sweeper's batch
(``RQ_EPOCH_BATCH_SIZE``, 30) is bounded by how long one call may hold the server
(:mod:`benchmarks.sweep_latency`), so this part of the sweep's cost over the floor does not
shrink with N.

    python -m benchmarks.call_cost
    python -m benchmarks.call_cost --rounds 9 --calls 1000
    python -m benchmarks.call_cost --quick
"""

from __future__ import annotations

import random
import statistics
from typing import Any

import redis

from rq_epoch import keys, scripts
from rq_epoch.settings import EpochSettings

from .common import parser, quiet_logging, ratio, server, server_version, table, write_results
from .scenarios import FLOOR_SCRIPT, QUEUE, compact_script

NAME = 'call_cost'
SWEEP = 'sweep script'
COMPACT = 'compact'
FLOOR = 'floor'
#: Batch sizes the fixed cost is shared by in the table (the sweeper's own is added).
BATCHES = (10, 30, 100)


def _sources() -> dict[str, str]:
    return {SWEEP: scripts.sweep().source, COMPACT: compact_script(), FLOOR: FLOOR_SCRIPT}


def _call(conn: redis.Redis, label: str, sha: str, batch: int) -> Any:
    """One call of ``label`` with the keys and arguments the sweeper (or the floor benchmark) gives it."""
    if label == FLOOR:
        return conn.evalsha(sha, 2, keys.leases_key(QUEUE), keys.wip_key(QUEUE), keys.PREFIX, QUEUE, batch)
    sweep_keys = [
        keys.leases_key(QUEUE),
        keys.wip_key(QUEUE),
        keys.finishing_key(),
        keys.stats_key(QUEUE),
        keys.legacy_leases_key(QUEUE),
    ]
    return conn.evalsha(sha, len(sweep_keys), *sweep_keys, keys.PREFIX, QUEUE, batch, 3, 0, 86400, '0', 0, 0, 0)


def measure(conn: redis.Redis, rounds: int, calls: int, seed: int = 0) -> dict[str, list[float]]:
    """Server µs per call of each script, one value per round (the mean of its ``calls`` calls)."""
    batch = EpochSettings.resolve().batch_size
    shas = {label: conn.script_load(source) for label, source in _sources().items()}
    per_call: dict[str, list[float]] = {label: [] for label in shas}
    order = random.Random(seed)
    for _ in range(rounds):
        for label in order.sample(list(shas), len(shas)):
            conn.config_resetstat()
            for _ in range(calls):
                reply = _call(conn, label, shas[label], batch)
                if (int(reply) if label == FLOOR else int(reply[12])) != 0:
                    raise RuntimeError(f'{label} judged a lease: the queue was expected to have none')
            stats = conn.info('commandstats')['cmdstat_evalsha']
            per_call[label].append(float(stats['usec']) / int(stats['calls']))
    return per_call


def run(kind: str, rounds: int, calls: int, seed: int = 0) -> dict[str, Any]:
    batches = sorted({*BATCHES, EpochSettings.resolve().batch_size})
    with server(kind) as srv:
        conn = srv.client()
        version = server_version(conn)
        conn.flushall()
        per_call = measure(conn, rounds, calls, seed)
    floor = statistics.median(per_call[FLOOR])
    rows = []
    for label, values in per_call.items():
        median = statistics.median(values)
        rows.append(
            {
                'script': label,
                'server_us_per_call': round(median, 2),
                'vs_floor': ratio(median, floor),
                'added_us_per_lease': {str(b): round((median - floor) / b, 3) for b in batches},
                'rounds_us': [round(v, 2) for v in values],
            }
        )
    return {'server': version, 'rounds': rounds, 'calls': calls, 'seed': seed, 'batches': batches, 'rows': rows}


def render(doc: dict[str, Any]) -> str:
    batches = doc['batches']
    headers = ['script', 'server µs per call', '× floor', *(f'added µs/lease at batch {b}' for b in batches)]
    body = [
        [r['script'], r['server_us_per_call'], r['vs_floor'], *(r['added_us_per_lease'][str(b)] for b in batches)]
        for r in doc['rows']
    ]
    return table(headers, body)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=None, help='rounds; the median round is kept (default 5; quick 1)')
    p.add_argument('--calls', type=int, default=None, help='calls of each script per round (default 500; quick 20)')
    p.add_argument('--seed', type=int, default=0, help='seed of the order of the scripts in each round (default 0)')
    args = p.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 5)
    calls = args.calls if args.calls is not None else (20 if args.quick else 500)
    if rounds < 1 or calls < 1:
        p.error('--rounds and --calls must be at least 1')
    quiet_logging()
    doc = run(args.server, rounds, calls, args.seed)
    print(render(doc))
    write_results(NAME, {'quick': args.quick, **doc}, args.out)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
