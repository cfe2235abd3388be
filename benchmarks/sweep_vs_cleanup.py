"""Question 1: rq-epoch's sweep vs stock ``StartedJobRegistry.cleanup()`` over the same jobs.

For each size N, each case of :mod:`benchmarks.scenarios` gets N expired leases on a
flushed server and cleans them once: wall seconds, members per second, round trips the
cleaning client made (counted in redis-py), commands the server ran (INFO commandstats,
commands inside scripts included), and the speed-up over the matching stock case.

    python -m benchmarks.sweep_vs_cleanup            # N = 1,000, 10,000, 100,000
    python -m benchmarks.sweep_vs_cleanup --quick    # N = 200
    python -m benchmarks.sweep_vs_cleanup --sizes 10000,100000 --repeat 3

``--repeat R`` runs each rq-epoch and floor case R times at each size, interleaved (floor,
exempt, recovered, floor, ...), and keeps the median time of each: on a machine shared
with other work, the ratio to the floor then compares like with like. Stock cases run once,
unless ``--repeat-stock`` repeats them too (the speed-ups then compare medians). With
repeated runs each ratio is also given *paired*: the median over the rounds of the ratio
within each round (a round runs every case once, one after the other), which a machine whose
speed drifts over minutes moves less than the ratio of two medians taken over all the rounds.

Each case is also shown as a ratio to its floor, measured at the same size: the requeue
cases to ``floor``, the failing ones to ``dead-floor`` (RQ's own failure side effects,
batched); the speed-up of ``dead-floor`` over ``stock-fail`` is the most that any cleanup
writing those side effects with RQ's functions, called as often as RQ calls them, could
reach. In the failing cases one job in ten has a dependent; ``--dependents-every K`` gives
every K-th job one instead (0: none), to see what the dependents cost each side.

A stock case whose time, extrapolated linearly from the previous size, would pass
``--stock-limit`` seconds is not run at that size; the table says so.
"""

from __future__ import annotations

import statistics
from typing import Any

from .common import STOCK, comma_sizes, parser, quiet_logging, ratio, server, server_version, table, write_results
from .scenarios import (
    BASELINE,
    CASES,
    DEAD_CASES,
    DEAD_FLOOR,
    DEPENDENTS_EVERY,
    FLOOR,
    FLOOR_OF,
    REQUEUE_CASES,
    Outcome,
    cases_in_order,
    run_case,
)

NAME = 'sweep_vs_cleanup'
FULL_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (200,)
#: Targets: speed-up over stock for requeue verdicts (N >= 10,000; the first benchmark's, set
#: against an older stock cleanup) and for dead letters with all their side effects.
REQUEUE_TARGET = 50.0
DEAD_TARGET = 2.0
#: rq-epoch's requeue verdicts may cost at most this much more than the floor per lease.
FLOOR_TARGET = 1.3


def target_for(case: str, n: int) -> float | None:
    """The speed-up the issue asks of ``case`` at size ``n`` (None: no target)."""
    if case in ('exempt', 'recovered'):
        return REQUEUE_TARGET if n >= 10_000 else None
    if case == 'dead':
        return DEAD_TARGET
    return None


def run(
    kind: str,
    sizes: tuple[int, ...],
    cases: list[str],
    stock_limit: float,
    repeat: int = 1,
    repeat_stock: bool = False,
    dependents_every: int = DEPENDENTS_EVERY,
) -> dict[str, Any]:
    """Every case at every size; returns the rows for the JSON document."""
    quiet_logging()
    rows: list[dict[str, Any]] = []
    server_name = ''
    with server(kind) as srv:
        conn = srv.client()
        server_name = server_version(conn)
        last: dict[str, Outcome] = {}
        for n in sizes:
            done: dict[str, Outcome] = {}
            pending: list[dict[str, Any]] = []
            ordered = cases_in_order(cases)
            repeated = [
                c
                for c in ordered
                if CASES[c].side != STOCK
                or (repeat_stock and not _too_long(_estimate(last.get(c), n), stock_limit, repeat))
            ]
            runs: dict[str, list[Outcome]] = {c: [] for c in repeated}
            for _ in range(max(1, repeat) - 1):  # the extra rounds, interleaved
                for case in repeated:
                    runs[case].append(run_case(conn, case, n, dependents_every=dependents_every))
            for case in ordered:
                estimate = _estimate(last.get(case), n)
                if CASES[case].side == STOCK and estimate is not None and estimate > stock_limit:
                    rows.append({'case': case, 'side': STOCK, 'n': n, 'skipped': True, 'estimated_seconds': estimate})
                    continue
                outcome = run_case(conn, case, n, dependents_every=dependents_every)
                if case in runs:
                    outcome = _median([*runs[case], outcome])
                done[case] = outcome
                rows.append(_row(outcome, done.get(BASELINE.get(case, ''))))
                if case in FLOOR_OF:
                    pending.append((rows[-1], outcome))
            for row, outcome in pending:
                _versus_floor(row, done.get(FLOOR_OF[row['case']]), outcome)
                _progress(row)
            last.update(done)
    return {'server': server_name, 'sizes': list(sizes), 'rows': rows}


def _median(outcomes: list[Outcome]) -> Outcome:
    """The run with the median time; every run's time is kept in its ``extra``."""
    ordered = sorted(outcomes, key=lambda o: o.seconds)
    chosen = ordered[(len(ordered) - 1) // 2]
    if len(outcomes) > 1:
        chosen.extra['runs_seconds'] = [round(o.seconds, 4) for o in outcomes]
        chosen.ok = all(o.ok for o in outcomes)
    return chosen


def _paired(outcome: Outcome, baseline: Outcome) -> float | None:
    """The median over the rounds of ``baseline``'s time over ``outcome``'s in the same round
    (None unless both ran in every round)."""
    mine, theirs = outcome.extra.get('runs_seconds'), baseline.extra.get('runs_seconds')
    if not mine or not theirs or len(mine) != len(theirs) or not all(mine):
        return None
    return ratio(statistics.median(b / a for a, b in zip(mine, theirs, strict=True)), 1.0)


def _too_long(estimate: float | None, limit: float, runs: int) -> bool:
    """Whether a stock case run ``runs`` times would pass the time limit."""
    return estimate is not None and estimate * runs > limit


def _estimate(previous: Outcome | None, n: int) -> float | None:
    if previous is None:
        return None
    return round(previous.seconds * n / previous.n, 1)


def _row(outcome: Outcome, baseline: Outcome | None) -> dict[str, Any]:
    row = outcome.to_dict()
    row['vs'] = baseline.case if baseline is not None else None
    row['speedup'] = ratio(baseline.seconds, outcome.seconds) if baseline is not None else None
    row['speedup_paired'] = _paired(outcome, baseline) if baseline is not None else None
    row['round_trips_per_member'] = round(outcome.round_trips / outcome.n, 3)
    row['server_commands_per_member'] = round(outcome.server_commands / outcome.n, 2)
    target = target_for(outcome.case, outcome.n)
    row['target_speedup'] = target
    row['target_met'] = None if target is None or row['speedup'] is None else row['speedup'] >= target
    return row


def _versus_floor(row: dict[str, Any], floor: Outcome | None, outcome: Outcome) -> None:
    """Add the cost per lease of ``outcome`` (the row's run) as a ratio to the floor's, measured
    at the same size, and paired round by round when both were repeated alike."""
    if floor is None or not floor.n:
        return
    row['vs_floor_paired'] = _paired(floor, outcome)
    per_lease = row['seconds'] / row['n']
    floor_per_lease = floor.seconds / floor.n
    row['us_per_lease'] = round(per_lease * 1e6, 2)
    row['floor_us_per_lease'] = round(floor_per_lease * 1e6, 2)
    row['vs_floor'] = ratio(per_lease, floor_per_lease)
    if row['side'] == 'rq-epoch' and CASES[row['case']].requeue:
        row['floor_target'] = FLOOR_TARGET
        row['floor_target_met'] = row['vs_floor'] is not None and row['vs_floor'] <= FLOOR_TARGET


def _progress(row: dict[str, Any]) -> None:
    print(f'  n={row["n"]:>7,} {row["case"]:<12} {row["seconds"]:>9.3f}s  ok={row["ok"]}', flush=True)


def render(rows: list[dict[str, Any]]) -> str:
    """The table printed at the end (and pasted into docs/performance.md)."""
    headers = ['N', 'case', 'seconds', 'µs/lease', 'round trips', 'server cmds', 'speed-up', 'target', '× floor', 'ok']
    body = []
    for r in rows:
        if r.get('skipped'):
            body.append([r['n'], r['case'], f'not run (~{r["estimated_seconds"]}s est.)', *[None] * 7])
            continue
        target = (
            None
            if r['target_speedup'] is None
            else f'≥{r["target_speedup"]:g}× {"met" if r["target_met"] else "MISSED"}'
        )
        speedup = None if r['speedup'] is None else f'{r["speedup"]:g}×'
        if speedup is not None and r.get('speedup_paired') is not None:
            speedup += f' (paired {r["speedup_paired"]:g}×)'
        floor = None
        if r.get('vs_floor') is not None:
            floor = f'{r["vs_floor"]:g}×'
            if r.get('vs_floor_paired') is not None:
                floor += f' (paired {r["vs_floor_paired"]:g}×)'
            if 'floor_target_met' in r:
                floor += f' (≤{FLOOR_TARGET:g}× {"met" if r["floor_target_met"] else "MISSED"})'
        body.append(
            [
                r['n'],
                r['case'],
                r['seconds'],
                round(r['seconds'] / r['n'] * 1e6, 1),
                r['round_trips'],
                r['server_commands'],
                speedup,
                target,
                floor,
                'yes' if r['ok'] else 'NO',
            ]
        )
    return table(headers, body)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument('--sizes', type=comma_sizes, help='comma-separated sizes (default 1000,10000,100000; quick 200)')
    p.add_argument(
        '--cases', default=','.join((*REQUEUE_CASES, FLOOR, *DEAD_CASES, DEAD_FLOOR)), help='comma-separated cases'
    )
    p.add_argument('--stock-limit', type=float, default=180.0, help='skip a stock case estimated to take longer (s)')
    p.add_argument('--repeat', type=int, default=1, help='runs of each rq-epoch and floor case; the median is kept')
    p.add_argument(
        '--repeat-stock', action='store_true', help='with --repeat: run the stock cases as often (within --stock-limit)'
    )
    p.add_argument(
        '--dependents-every',
        type=int,
        default=DEPENDENTS_EVERY,
        metavar='K',
        help=f'in the failing cases, every K-th job has a dependent (default {DEPENDENTS_EVERY}; 0: none)',
    )
    args = p.parse_args(argv)
    if args.dependents_every < 0:
        p.error('--dependents-every must be 0 or more')
    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    cases = [c for c in args.cases.split(',') if c]
    result = run(args.server, sizes, cases, args.stock_limit, args.repeat, args.repeat_stock, args.dependents_every)
    result['dependents_every'] = args.dependents_every
    print()
    print(render(result['rows']))
    write_results(NAME, {'quick': args.quick, **result}, args.out)
    return 0 if all(r.get('ok', True) for r in result['rows']) else 1


if __name__ == '__main__':
    raise SystemExit(main())
