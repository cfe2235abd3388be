"""Question 2: what a cleanup of 100,000 expired leases does to every other client.

A second client (its own process) sends PING every millisecond: first with nothing else
running (the baseline), then while stock cleanup and while rq-epoch's sweep clean N
expired leases. For each: its p50/p99/max, and the longest single server block (SLOWLOG
for commands and scripts; the latency monitor for stock's closing MULTI/EXEC, which
SLOWLOG leaves out). Then the sweep alone at several batch sizes, to show what a batch
costs in server time, and why the default is what it is.

    python -m benchmarks.sweep_latency            # N = 100,000; batch study at 20,000
    python -m benchmarks.sweep_latency --quick
"""

from __future__ import annotations

import time
from typing import Any

from rq_epoch.settings import DEFAULTS

from .common import PingProbe, parser, quiet_logging, server, server_version, table, write_results
from .scenarios import CASES, run_case

NAME = 'sweep_latency'
SIDES = ('stock-retry', 'exempt', 'recovered')
BATCHES = (10, 20, 30, 50, 100, 200, 400, 1000)
#: Targets from the issue.
MAX_BLOCK_MS = 5.0
P99_SLACK_MS = 2.0


def baseline(srv: Any, seconds: float) -> dict[str, Any]:
    """PING latency with nothing else running."""
    probe = PingProbe(srv)
    with probe as stats:
        time.sleep(seconds)
    return stats


def during(conn: Any, srv: Any, n: int) -> list[dict[str, Any]]:
    """PING latency and server blocks while each side cleans ``n`` expired leases."""
    rows = []
    for case in SIDES:
        outcome = run_case(conn, case, n, around=lambda: PingProbe(srv))
        rows.append(
            {
                'case': case,
                'side': CASES[case].side,
                'n': n,
                'seconds': round(outcome.seconds, 3),
                'ok': outcome.ok,
                'script': {k: v for k, v in outcome.extra.items() if k.startswith('script')},
                **outcome.extra['during'],
            }
        )
        print(f'  {case:<12} {outcome.seconds:8.3f}s  p99 {rows[-1]["p99_ms"]} ms', flush=True)
    return rows


def batch_study(conn: Any, srv: Any, n: int, batches: tuple[int, ...]) -> list[dict[str, Any]]:
    """The sweep at each batch size over ``n`` exempt leases: time per call, longest call, throughput."""
    rows = []
    for batch in batches:
        outcome = run_case(conn, 'exempt', n, batch_size=batch, around=lambda: PingProbe(srv))
        seen = outcome.extra['during']
        rows.append(
            {
                'batch': batch,
                'n': n,
                'seconds': round(outcome.seconds, 3),
                'members_per_second': round(outcome.per_second, 1),
                'script_calls': outcome.extra.get('script_calls'),
                'script_ms_mean': outcome.extra.get('script_ms_mean'),
                'script_us_per_member': outcome.extra.get('script_us_per_member'),
                'longest_block_ms': seen['server_blocks']['longest_ms'],
                'script_p99_ms': seen['server_blocks']['script_p99_ms'],
                'scripts_over_5ms': seen['server_blocks']['scripts_over_5ms'],
                'ping_p99_ms': seen['p99_ms'],
                'ping_max_ms': seen['max_ms'],
                'ok': outcome.ok,
            }
        )
        print(
            f'  batch {batch:>5}: {outcome.seconds:7.3f}s  longest block {rows[-1]["longest_block_ms"]} ms', flush=True
        )
    return rows


def verdicts(base: dict[str, Any], rows: list[dict[str, Any]], study: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets: every sweep call under 5 ms; PING p99 within 2 ms of the baseline."""
    chosen = DEFAULTS.batch_size
    fits = [r['batch'] for r in study if r['longest_block_ms'] <= MAX_BLOCK_MS]
    out: dict[str, Any] = {'default_batch_size': chosen, 'largest_batch_under_5ms': max(fits, default=None)}
    for r in rows:
        out[r['case']] = {
            'longest_block_ms': r['server_blocks']['longest_ms'],
            'block_target_met': r['server_blocks']['longest_ms'] <= MAX_BLOCK_MS,
            'p99_minus_baseline_ms': round(r['p99_ms'] - base['p99_ms'], 3),
            'p99_target_met': r['p99_ms'] - base['p99_ms'] <= P99_SLACK_MS,
        }
    return out


def render(base: dict[str, Any], rows: list[dict[str, Any]], study: list[dict[str, Any]]) -> str:
    headers = ['while', 'N', 'seconds', 'PING p50 ms', 'p99 ms', 'max ms', 'longest block ms', 'pings']
    body: list[list[Any]] = [
        [
            'nothing (baseline)',
            None,
            base['seconds'],
            base['p50_ms'],
            base['p99_ms'],
            base['max_ms'],
            base['server_blocks']['longest_ms'],
            base['pings'],
        ]
    ]
    for r in rows:
        body.append(
            [
                r['case'],
                r['n'],
                r['seconds'],
                r['p50_ms'],
                r['p99_ms'],
                r['max_ms'],
                r['server_blocks']['longest_ms'],
                r['pings'],
            ]
        )
    batch_headers = [
        'batch',
        'N',
        'seconds',
        'members/s',
        'calls',
        'mean call ms',
        'µs/member',
        'p99 call ms',
        'longest ms',
        'calls >5 ms',
        'PING p99 ms',
    ]
    batch_body = [
        [
            r['batch'],
            r['n'],
            r['seconds'],
            r['members_per_second'],
            r['script_calls'],
            r['script_ms_mean'],
            r['script_us_per_member'],
            r['script_p99_ms'],
            r['longest_block_ms'],
            r['scripts_over_5ms'],
            r['ping_p99_ms'],
        ]
        for r in study
    ]
    return table(headers, body) + '\n\n' + table(batch_headers, batch_body)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('-n', type=int, default=None, help='expired leases per side (default 100000; quick 300)')
    p.add_argument('--batch-n', type=int, default=None, help='leases per batch-size run (default 20000; quick 300)')
    args = p.parse_args(argv)
    n = args.n or (300 if args.quick else 100_000)
    batch_n = args.batch_n or (300 if args.quick else 20_000)
    batches = (25, 100, 400) if args.quick else BATCHES
    quiet_logging()
    with server(args.server) as srv:
        conn = srv.client()
        name = server_version(conn)
        base = baseline(srv, 0.5 if args.quick else 5.0)
        rows = during(conn, srv, n)
        study = batch_study(conn, srv, batch_n, batches)
        result = {
            'quick': args.quick,
            'server': name,
            'baseline': base,
            'during': rows,
            'batch_study': study,
            'targets': verdicts(base, rows, study),
        }
        print()
        print(render(base, rows, study))
        print()
        for key, value in result['targets'].items():
            print(f'{key}: {value}')
        write_results(NAME, result, args.out, conn)
    return 0 if all(r['ok'] for r in rows + study) else 1


if __name__ == '__main__':
    raise SystemExit(main())
